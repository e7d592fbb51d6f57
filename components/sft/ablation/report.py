"""The ablation's table: per-arm pass@1 over held-out tasks (seed-averaged per task) with paired intervals."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from components.core.statistics.intervals import paired_difference_ci, task_mean_ci
from components.sft.ablation.budget import ArmPlan
from components.sft.ablation.config import ALL_ARMS, REFERENCE_ARM, AblationConfig

# Student t quantiles (0.975) for small numbers of seeds; beyond 10 the normal quantile is close.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


class Paired(BaseModel):
    model_config = ConfigDict(extra="forbid")
    diff: float
    ci95: tuple[float, float]
    tasks: int


class ArmResult(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    arm: str
    pass_at_1: float = Field(description="Mean over held-out tasks of the seed-averaged per-task pass@1.")
    ci95: tuple[float, float] = Field(description="Task-bootstrap interval of pass_at_1.")
    tasks: int
    seed_pass_at_1: list[float] = Field(description="pass@1 per seed (mean over tasks).")
    vs_resolved_only: Paired | None = None
    vs_untrained: Paired | None = None
    valid_call_rate: float = Field(description="Share of held-out assistant turns that were a valid tool call.")
    mean_steps: float = Field(description="Mean assistant turns per held-out episode.")
    plan: ArmPlan
    final_loss: float


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and a 95 % Student-t interval over seeds (clipped to [0, 1]); a single seed has none."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = _T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def _valid_calls(eval_dir: Path) -> tuple[int, int, list[int]]:
    """(assistant turns, valid tool calls among them, turns per episode) of one evaluation's trajectories."""
    from components.core.data.parquet_store import TrajectoryStore

    turns = valid = 0
    lengths: list[int] = []
    if not (eval_dir / "trajectories").exists():  # per_task.parquet alone (copied results): no call figures
        return turns, valid, lengths
    for traj in TrajectoryStore(eval_dir / "trajectories").read():
        lengths.append(traj.num_assistant_steps)
        for step, answer in zip(traj.steps, traj.steps[1:] + [None]):
            if step.role != "assistant":
                continue
            turns += 1
            # valid: it parsed, and the tool accepted it (unknown tools and bad arguments are policy errors)
            valid += (
                step.tool_call is not None
                and step.policy_error is None
                and (answer is None or answer.policy_error is None)
            )
    return turns, valid, lengths


def per_task_pass_at_1(work: Path, arm: str, seeds: list[int]) -> tuple[dict[str, float], list[float]]:
    """Per task, pass@1 averaged over the finished seeds (NaN seeds left out); and pass@1 per seed."""
    import pandas as pd

    by_task: dict[str, list[float]] = {}
    per_seed = []
    for seed in seeds:
        path = work / "eval" / arm / f"seed{seed}" / "per_task.parquet"
        if not path.exists():
            continue
        frame = pd.read_parquet(path)
        per_seed.append(float(frame["pass_at_1"].mean()))
        for task_id, p in zip(frame["task_id"], frame["pass_at_1"]):
            by_task.setdefault(task_id, []).append(float(p))
    averaged = {
        t: statistics.fmean(kept) if (kept := [p for p in ps if not math.isnan(p)]) else float("nan")
        for t, ps in by_task.items()
    }
    return averaged, per_seed


def arm_results(work_dir: str | Path, plans: dict[str, ArmPlan], seeds: list[int]) -> list[ArmResult]:
    """Every arm's row from what its runs left on disk, with paired intervals against the baselines."""
    work = Path(work_dir)
    tasks = {}
    rows = []
    for arm in ALL_ARMS:
        tasks[arm], per_seed = per_task_pass_at_1(work, arm, seeds)
        if not tasks[arm]:
            raise FileNotFoundError(f"no finished evaluation of arm {arm!r} under {work}/eval")
        turns = valid = 0
        lengths: list[int] = []
        for seed in seeds:
            if (work / "eval" / arm / f"seed{seed}" / "per_task.parquet").exists():
                t, v, ls = _valid_calls(work / "eval" / arm / f"seed{seed}")
                turns, valid, lengths = turns + t, valid + v, lengths + ls
        sft = [
            json.loads(p.read_text())["final_loss"]
            for s in seeds
            if (p := work / "models" / arm / f"seed{s}" / "sft_result.json").exists()
        ]
        values = [p for p in tasks[arm].values() if not math.isnan(p)]
        rows.append(
            ArmResult(
                arm=arm,
                pass_at_1=statistics.fmean(values) if values else float("nan"),
                ci95=task_mean_ci(values),
                tasks=len(values),
                seed_pass_at_1=per_seed,
                valid_call_rate=valid / turns if turns else 0.0,
                mean_steps=statistics.fmean(lengths) if lengths else 0.0,
                plan=plans[arm],
                final_loss=statistics.fmean(sft) if sft else float("nan"),
            )
        )
    for row in rows:
        for base, field in ((REFERENCE_ARM, "vs_resolved_only"), ("untrained", "vs_untrained")):
            if row.arm != base:
                diff, lo, hi, n = paired_difference_ci(tasks[row.arm], tasks[base])
                setattr(row, field, Paired(diff=diff, ci95=(lo, hi), tasks=n))
    return rows


def verdict(rows: list[ArmResult]) -> str:
    """One sentence on which trained arm is best and whether the paired interval separates it from resolved_only."""
    trained = [r for r in rows if r.arm != "untrained"]
    best = max(trained, key=lambda r: r.pass_at_1)
    if best.arm == REFERENCE_ARM or best.vs_resolved_only is None:
        return f"Best trained arm: {best.arm} (pass@1 {best.pass_at_1:.3f})."
    lo, hi = best.vs_resolved_only.ci95
    separated = "the paired interval excludes 0" if lo > 0 else "the paired interval includes 0: not separated"
    return (
        f"Best trained arm: {best.arm} (pass@1 {best.pass_at_1:.3f}), {best.vs_resolved_only.diff:+.3f} vs "
        f"resolved_only [{lo:+.3f}, {hi:+.3f}] over {best.vs_resolved_only.tasks} tasks; {separated}."
    )


def print_table(rows: list[ArmResult], config: AblationConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"SFT ablation: held-out pass@1 ({config.heldout_tasks} tasks x k={config.eval_k} at "
        f"T={config.eval_temperature}, {len(config.seeds)} seeds, matched in {config.match}; "
        "95% task-bootstrap intervals, paired over tasks)"
    )
    for col in (
        "arm",
        "pass@1 [95% CI]",
        "vs resolved_only",
        "vs untrained",
        "per seed",
        "steps",
        "loss tokens seen",
        "resolved epochs",
        "train traj (res)",
        "final loss",
        "valid calls",
        "turns",
    ):
        table.add_column(col, justify="right")

    def paired(p: Paired | None) -> str:
        return "-" if p is None else f"{p.diff:+.3f} [{p.ci95[0]:+.3f}, {p.ci95[1]:+.3f}]"

    for r in rows:
        table.add_row(
            r.arm,
            f"{r.pass_at_1:.3f} [{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]",
            paired(r.vs_resolved_only),
            paired(r.vs_untrained),
            " ".join(f"{p:.3f}" for p in r.seed_pass_at_1),
            str(r.plan.steps),
            f"{r.plan.loss_tokens_seen:.0f}",
            f"{r.plan.resolved_epochs:.2f}",
            f"{r.plan.samples} ({r.plan.resolved_samples})",
            f"{r.final_loss:.3f}",
            f"{r.valid_call_rate:.3f}",
            f"{r.mean_steps:.1f}",
        )
    Console(width=200).print(table)
    print(verdict(rows))
