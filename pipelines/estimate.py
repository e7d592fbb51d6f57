"""How long a run will take, before its first stage, and how long is left while it runs.

Each stage's time is `fixed + per_unit * units`, where the units come from the config's sizes (episodes,
optimizer steps times tokens, ...: `UNITS`) and the costs from one of two places:
- learned on this machine: after every stage the runner records its wall time per unit under the runs
  directory (`estimates.json`, keyed by stage and model; the mean of the last runs, newest weighted half), so
  the second run of a preset is estimated from the first on the same machine and load;
- else built in (`BUILT_IN`): the tiny model's stages measured on the 2-core development machine, idle
  (`make demo` at commits c8b983b and 7734e99: the stage wall times in docs/results.md, divided by the demo's
  units). A model without a built-in or learned cost (a checkpoint of yours, the smol preset on its
  first run here) has no estimate for its model stages until one run has measured them.

Built-in costs are for an idle machine: with the machine loaded (another job, a test suite) the estimate also
says what the current load average suggests (`LoadNote`), since a CPU stage slows down about in proportion.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, NamedTuple

from pipelines.config import PipelineConfig


class Cost(NamedTuple):
    fixed: float  # seconds every run of the stage takes (start-up, loading)
    per_unit: float  # seconds per unit (see UNITS)


class StageEstimate(NamedTuple):
    stage: str
    units: float
    unit: str
    seconds: float | None  # None: no cost known for this stage and model here
    source: str  # "learned here" | "built in" | "unknown"


def _rl_episodes(config: PipelineConfig) -> int:
    if config.rl.rollout_budget is None:
        raise ValueError("rl.rollout_budget is not set: the RL stage's cost cannot be estimated without it")
    return config.rl.rollout_budget


def _episodes_tokens(n: int, harness) -> float:
    """Thousands of tokens an episode budget may generate: episodes x turns x tokens per turn."""
    return n * harness.max_steps * harness.generation.max_new_tokens / 1000


def _unresolved(config: PipelineConfig) -> int:
    """Teacher trajectories the credit stage labels (unresolved ones, about the error rate's share, at most
    max_trajectories)."""
    n = config.provision.n_train * config.distill.attempts_per_task
    expected = max(1, math.ceil(n * config.distill.error_rate)) if n else 0
    cap = config.credit.max_trajectories
    return min(expected, cap) if cap else expected


def _credit_units(config: PipelineConfig) -> float:
    mc = config.credit.monte_carlo
    if config.credit.estimator != "monte_carlo":
        return float(_unresolved(config))
    states = math.ceil(config.distill.harness.max_steps / mc.stride)
    return _unresolved(config) * states * mc.k / mc.parallel


def _eval_episodes(config: PipelineConfig) -> int:
    """Episodes of one policy's evaluation: k attempts per held-out task, plus the greedy one when asked for."""
    return config.provision.n_heldout * (config.evaluate.k + int(config.evaluate.greedy))


# stage -> (unit, units of this config). Model-driven episodes count generated tokens (their length bound), scripted
# ones count episodes per worker; SFT counts the tokens of its batches (at most max_len each).
UNITS: dict[str, tuple[str, Callable[[PipelineConfig], float]]] = {
    "provision": ("run", lambda c: 1.0),
    "init-policy": ("run", lambda c: 1.0),
    "evaluate-teacher": (
        "episode per worker",
        lambda c: c.provision.n_heldout * c.evaluate_teacher.k / c.evaluate_teacher.workers,
    ),
    "distill": (
        "episode per worker",
        lambda c: c.provision.n_train * c.distill.attempts_per_task / c.distill.max_parallel,
    ),
    "credit": ("continuation per worker", _credit_units),
    "accumulate": ("run", lambda c: 1.0),
    "sft": ("k tokens", lambda c: c.sft.steps * c.sft.batch_size * c.sft.grad_accum * c.sft.max_len / 1000),
    "rl": ("k generated tokens", lambda c: _episodes_tokens(_rl_episodes(c), c.rl.harness)),
    "evaluate-untrained": ("k generated tokens", lambda c: _episodes_tokens(_eval_episodes(c), c.evaluate.harness)),
    "evaluate-sft": ("k generated tokens", lambda c: _episodes_tokens(_eval_episodes(c), c.evaluate.harness)),
    "evaluate-rl": ("k generated tokens", lambda c: _episodes_tokens(_eval_episodes(c), c.evaluate.harness)),
    "promote": ("run", lambda c: 1.0),
}
# Stages whose cost depends on the trained model (the rest run the scripted teacher, the service or MLflow).
MODEL_STAGES = ("init-policy", "sft", "rl", "evaluate-untrained", "evaluate-sft", "evaluate-rl", "promote")

# The tiny model on the idle 2-core development machine (module docstring): `make demo`'s stage wall times over
# its units. The model stages from the demo at commit 7734e99 (2026-12-05, load 1.2 at its start: sft 53.4 s /
# 1,638 k tokens; rl 300.0 s / 819 k, 20 batched steps of 8-10 prompts; evaluations 46.8 / 31.4 / 31.9 s over
# 81.9 k, k = 4 + greedy with 8 episodes batched: an untrained model writes every turn to its limit, a trained one
# stops), the teacher's from c8b983b (distill 22.3 s / 20 episodes per worker; teacher evaluation 11.1 s / 8;
# init-policy 9.6 s; the rest under 4 s). Costs per unit are lower when more episodes share a batch: the quick
# preset's k = 1 evaluation and one-prompt RL steps batch less, so its estimate is on the short side.
TINY, SCRIPTED, ANY = "tiny", "scripted", "any"
BUILT_IN: dict[tuple[str, str], Cost] = {
    ("provision", ANY): Cost(1.0, 0.0),
    ("init-policy", TINY): Cost(9.6, 0.0),
    ("evaluate-teacher", SCRIPTED): Cost(2.0, 1.1),
    ("distill", SCRIPTED): Cost(0.5, 1.1),
    ("credit", SCRIPTED): Cost(0.5, 0.5),
    ("accumulate", ANY): Cost(0.5, 0.0),
    ("sft", TINY): Cost(1.0, 0.032),
    ("rl", TINY): Cost(1.5, 0.365),
    ("evaluate-untrained", TINY): Cost(1.0, 0.56),
    ("evaluate-sft", TINY): Cost(1.0, 0.37),
    ("evaluate-rl", TINY): Cost(1.0, 0.38),
    ("promote", TINY): Cost(2.0, 0.0),
}
# Outside the stages: the embedded sandbox service, the MLflow parent run, the report.
OVERHEAD_SECONDS = 6.0
LEARNED_FILE = "estimates.json"


def model_key(config: PipelineConfig, stage: str) -> str:
    """What a stage's cost is keyed by: the trained model (`tiny` or model.path) for the model stages, the
    teacher (`scripted` or `endpoint:<model>`) for the teacher's, `any` for the rest."""
    if stage in MODEL_STAGES:
        return config.model.path or TINY
    if stage == "evaluate-teacher":
        e = config.evaluate_teacher
        return SCRIPTED if e.policy == "scripted" else f"endpoint:{e.endpoint.model if e.endpoint else '?'}"
    if stage == "distill":
        d = config.distill
        return SCRIPTED if d.teacher == "scripted" else f"endpoint:{d.openai.model if d.openai else '?'}"
    if stage == "credit":
        c = config.credit
        if c.estimator == "judge":
            return f"endpoint:{c.judge.model if c.judge else '?'}"
        teacher = c.monte_carlo.teacher
        if teacher is None or teacher.kind == "scripted":
            return SCRIPTED
        return f"endpoint:{teacher.endpoint.model if teacher.endpoint else '?'}"
    return ANY


def _learned(runs_dir: Path | None) -> dict[str, dict[str, float]]:
    if runs_dir is None or not (runs_dir / LEARNED_FILE).is_file():
        return {}
    try:
        return json.loads((runs_dir / LEARNED_FILE).read_text())
    except (OSError, ValueError):
        return {}  # a damaged file only costs the learned figures


def estimate(config: PipelineConfig, stages: list[str], runs_dir: Path | None = None) -> list[StageEstimate]:
    """Each stage's expected wall time under `config` (learned here, else built in, else unknown)."""
    learned = _learned(runs_dir)
    out = []
    for stage in stages:
        unit, units_of = UNITS.get(stage, ("run", lambda c: 1.0))
        units = float(units_of(config))
        key = (stage, model_key(config, stage))
        built_in = BUILT_IN.get(key)
        seen = learned.get("|".join(key))
        if seen is not None:
            fixed = built_in.fixed if built_in else 0.0
            out.append(StageEstimate(stage, units, unit, fixed + seen["per_unit"] * units, "learned here"))
        elif built_in is not None:
            out.append(StageEstimate(stage, units, unit, built_in.fixed + built_in.per_unit * units, "built in"))
        else:
            out.append(StageEstimate(stage, units, unit, None, "unknown"))
    return out


def record(runs_dir: Path, config: PipelineConfig, stage: str, seconds: float) -> None:
    """Learn a finished stage's cost per unit on this machine (the next estimate uses it)."""
    if stage not in UNITS:
        return
    units = float(UNITS[stage][1](config))
    key = (stage, model_key(config, stage))
    fixed = BUILT_IN[key].fixed if key in BUILT_IN else 0.0
    per_unit = max(0.0, seconds - fixed) / units if units > 0 else 0.0
    learned = _learned(runs_dir)
    old = learned.get("|".join(key))
    learned["|".join(key)] = {
        "per_unit": per_unit if old is None else (old["per_unit"] + per_unit) / 2,
        "runs": (old or {}).get("runs", 0) + 1,
    }
    path = runs_dir / LEARNED_FILE
    tmp = path.with_name(f".{LEARNED_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(learned, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a parallel run's update may be lost, never half-written


def load_factor() -> tuple[float, int, float]:
    """(load average over a minute, CPU cores, how much slower than idle a CPU stage may run now)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return load, cores, max(1.0, (load + 1.0) / cores)


def duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '35 min' (from 10 minutes on), '1 h 05 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def summary(estimates: list[StageEstimate], config: PipelineConfig) -> str:
    """The estimate as one line: total, where it goes, where it comes from, and the current load."""
    known = [e for e in estimates if e.seconds is not None]
    unknown = [e.stage for e in estimates if e.seconds is None]
    total = OVERHEAD_SECONDS + sum(e.seconds for e in known)  # type: ignore[misc]
    groups: dict[str, float] = {}
    for e in known:
        name = "evaluations" if e.stage.startswith("evaluate-") and e.stage != "evaluate-teacher" else e.stage
        groups[name] = groups.get(name, 0.0) + e.seconds  # type: ignore[operator]
    top = sorted(groups.items(), key=lambda kv: -kv[1])[:4]
    parts = ", ".join(f"{name} {duration(s)}" for name, s in top)
    sources = sorted({e.source for e in known})
    where = (
        "learned from earlier runs here"
        if sources == ["learned here"]
        else "costs measured on an idle 2-core machine"
        if sources == ["built in"]
        else "costs learned here and measured on an idle 2-core machine"
    )
    line = f"estimate: {'at least ' if unknown else ''}~{duration(total)} ({parts}; {where})"
    if unknown:
        line += (
            f"; no estimate yet for {', '.join(unknown)} with model {config.model.path} on this machine "
            "(this run measures them)"
        )
    load, cores, factor = load_factor()
    if factor > 1.25 and "built in" in sources:
        line += f"; load now {load:.1f} on {cores} cores: expect up to ~{duration(total * factor)}"
    return line


class Schedule:
    """Time left while a run goes: the estimate, corrected by how fast the finished stages went against it."""

    def __init__(self, estimates: list[StageEstimate]):
        self.planned = {e.stage: e.seconds for e in estimates}
        self.done: dict[str, float] = {}

    def finish(self, stage: str, seconds: float) -> None:
        self.done[stage] = seconds

    # Seconds of estimate that the prior pace (1: as estimated) weighs: a few short stages (a cached tokenizer,
    # a fast provision) must not move the whole run's time left by a factor of three.
    PRIOR_SECONDS = 30.0

    def pace(self) -> float:
        """Actual over estimated time of the finished stages that had an estimate, starting from 1.0 with the
        weight of PRIOR_SECONDS of estimate."""
        pairs = [(s, p) for n, s in self.done.items() if (p := self.planned.get(n))]
        actual, estimated = sum(s for s, _ in pairs), sum(p for _, p in pairs)
        return min(20.0, max(0.2, (actual + self.PRIOR_SECONDS) / (estimated + self.PRIOR_SECONDS)))

    def left(self, current: str | None = None, elapsed: float = 0.0) -> float | None:
        """Seconds left: the current stage's remainder plus the stages after it, at the pace so far (None when a
        stage still to run has no estimate)."""
        rest = [n for n in self.planned if n not in self.done]
        if any(self.planned[n] is None for n in rest):
            return None
        pace = self.pace()
        after = sum(self.planned[n] for n in rest if n != current)  # type: ignore[misc]
        now = max(0.0, pace * (self.planned.get(current) or 0.0) - elapsed) if current in rest else 0.0
        return now + pace * after
