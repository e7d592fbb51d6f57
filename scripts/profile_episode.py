"""Where one SWE episode's sandbox CPU goes, phase by phase and process by process.

    PYTHONPATH=$PWD python scripts/profile_episode.py --episodes 32            # generated tasks (call worker)
    PYTHONPATH=$PWD python scripts/profile_episode.py --episodes 32 --group 8     # 4 tasks, 8 episodes each
    PYTHONPATH=$PWD python scripts/profile_episode.py --episodes 32 --verifier pytest --steps reference

Runs SWE episodes one after another against a fresh embedded service (root: real sandboxes) and, at every
phase boundary, samples the CPU of each part of the work (`sandbox_service/tools/cpu_accounting.py`): this process
(the harness: archives, the change, the judge), the service's own threads, the helpers it ran (`ip`,
`nsenter`, `cp`), the agent zygote, and the sandboxes (agents and their commands, from a cpuacct group around
the service's whole tree, in nanoseconds). Phases: create (until ready), set-up (the recipe's files and
`git init`), the pristine snapshot, the tool steps (`--steps reference`: the scripted teacher's clean path;
`none`: no tool runs, as an episode whose every turn fails to parse), each phase of the clean-room
verification as the verifier names them (`verification.seconds`: fork, diff, apply, run, then the room's
deletion and the verdict's bookkeeping as `close`), and release + delete. The first `--warmup` episodes
(zygote start, first imports) are left out. `--group N` runs N episodes of each task one after another, as a
GRPO group's are (what a recipe keeps per task is then reused); the default, 1, draws a new task each time.
`--setup-command CMD` adds a set-up command to every task (a set-up the recipe keeps as a snapshot).

Prints a table of milliseconds of CPU per episode (means over the episodes) and writes the raw figures as JSON.
CPU-seconds, unlike wall time, hardly depend on the machine's load, but `machine` (every CPU's busy time)
does: on a shared machine it counts the neighbours too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.core.data.schema import ToolCall  # noqa: E402
from components.recipes.swe import SWERecipe  # noqa: E402
from components.recipes.swe import verifier as swe_verifier  # noqa: E402
from sandbox_service.tools.cpu_accounting import CpuSample, TreeCpu  # noqa: E402
from sandbox_service.embedded import EmbeddedService  # noqa: E402

COLUMNS = (
    ("client", "harness"),
    ("service", "service"),
    ("service_children", "helpers"),
    ("zygote", "zygote"),
    ("sandboxes", "sandboxes"),
    ("agents", "(agents)"),
    ("commands", "(commands)"),
    ("ours", "total"),
    ("kernel", "kthreads"),
    ("machine", "machine"),
)


class PhaseMeter:
    """Sums CPU spent between marks under the name of the phase that just ended."""

    def __init__(self, meter: TreeCpu):
        self.meter, self.last = meter, meter.sample()
        self.spent: dict[str, CpuSample] = {}
        self.recording = True

    def mark(self, phase: str) -> None:
        now = self.meter.sample()
        if self.recording:
            self.spent[phase] = self.spent.get(phase, CpuSample(sandboxes=0.0, tree=0.0)) + (now - self.last)
        self.last = now


class _VerifiedAsImported(SWERecipe):
    """Generated tasks verified the way imported (SWE-bench) tasks are: pytest with canaries."""

    def tasks(self, split, n, seed=0):
        return [
            t.model_copy(update={"verifier": t.verifier.model_copy(update={"kind": "pytest"})})
            for t in super().tasks(split, n, seed)
        ]


def _episode(client, recipe: SWERecipe, task, phases: PhaseMeter, steps: str) -> bool:
    phases.mark("(between episodes)")
    sandbox = client.create(recipe.sandbox_spec(task))
    phases.mark("create")
    take_snapshot = sandbox.snapshot

    def snapshot():  # set-up ends where the recipe's snapshot starts
        phases.mark("set-up")
        info = take_snapshot()
        phases.mark("snapshot")
        return info

    sandbox.snapshot = snapshot
    try:
        recipe.setup(sandbox, task)
        phases.mark("set-up")  # all of it when the recipe takes no snapshot
        answer = None
        if steps == "reference":
            for call in recipe.reference_calls(task):
                result = recipe.execute_tool(sandbox, task, ToolCall(name=call.name, arguments=call.arguments))
                if result.submitted:
                    answer = result.final_answer
            phases.mark("tools")
        verdict = recipe.verify(sandbox, task, answer)
        phases.mark("verify.close")
    finally:
        recipe.release(sandbox)
        sandbox.delete()
        phases.mark("release + delete")
    if verdict.infra_error:
        raise RuntimeError(f"{task.id}: verification gave no verdict: {verdict.infra_error}")
    return verdict.resolved


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1]
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def run(
    episodes: int, warmup: int, verifier_kind: str, steps: str, group: int = 1, setup_command: str | None = None
) -> dict:
    recipe = SWERecipe() if verifier_kind == "calls" else _VerifiedAsImported()
    drawn = recipe.tasks("train", -(-(episodes + warmup) // group), seed=0)
    if setup_command:  # a set-up that runs a command: kept as a snapshot, not an archive
        drawn = [
            t.model_copy(update={"environment": t.environment.model_copy(update={"setup_commands": [setup_command]})})
            for t in drawn
        ]
    tasks = [t for t in drawn for _ in range(group)][: episodes + warmup]  # a group's episodes one after another
    service = EmbeddedService()
    service.start()
    meter = TreeCpu(service.pid)
    phases = PhaseMeter(meter)
    laps = swe_verifier._Laps.__call__

    def lap(self, phase: str) -> None:  # the verifier's own phase boundaries
        laps(self, phase)
        phases.mark(f"verify.{phase}")

    swe_verifier._Laps.__call__ = lap
    resolved = 0
    load0 = os.getloadavg()
    started = time.monotonic()
    phases.recording = warmup == 0
    try:
        with service.client() as client:
            for i, task in enumerate(tasks):
                if i == warmup and warmup:
                    phases.recording, phases.last, started = True, meter.sample(), time.monotonic()
                ok = _episode(client, recipe, task, phases, steps)
                resolved += ok and i >= warmup
    finally:
        swe_verifier._Laps.__call__ = laps
        wall = time.monotonic() - started
        service.stop()
        meter.close()

    def per(s: CpuSample, name: str) -> float | None:
        value = s.ours if name == "ours" else getattr(s, name)
        return None if value is None else value * 1e3 / episodes

    per_episode = {phase: {name: per(s, name) for name, _ in COLUMNS} for phase, s in phases.spent.items()}
    return {
        "episodes": episodes,
        "resolved": resolved,
        "verifier": verifier_kind,
        "steps": steps,
        "group": group,
        "setup_command": setup_command,
        "wall_seconds": wall,
        "ms_per_episode": per_episode,
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": {"start": load0, "end": os.getloadavg()},
        "cpus": len(os.sched_getaffinity(0)),
    }


ORDER = (
    "create",
    "set-up",
    "snapshot",
    "tools",
    "verify.fork",
    "verify.diff",
    "verify.apply",
    "verify.run",
    "verify.warm",
    "verify.close",
    "release + delete",
    "(between episodes)",
)


def table(result: dict) -> str:
    rows = result["ms_per_episode"]
    names = [p for p in ORDER if p in rows] + sorted(p for p in rows if p not in ORDER)
    out = [f"{'ms of CPU per episode':<26}" + "".join(f"{label:>11}" for _, label in COLUMNS)]
    total: dict[str, float] = defaultdict(float)
    verify: dict[str, float] = defaultdict(float)
    for phase in names:
        cells = rows[phase]
        out.append(
            f"{phase:<26}" + "".join(f"{cells[c]:>11.1f}" if cells[c] is not None else f"{'-':>11}" for c, _ in COLUMNS)
        )
        for c, _ in COLUMNS:
            total[c] += cells[c] or 0.0
            if phase.startswith("verify."):
                verify[c] += cells[c] or 0.0
    out.append(f"{'verification (sum)':<26}" + "".join(f"{verify[c]:>11.1f}" for c, _ in COLUMNS))
    out.append(f"{'episode (sum)':<26}" + "".join(f"{total[c]:>11.1f}" for c, _ in COLUMNS))
    load = result["load_average"]
    out.append(
        f"({result['episodes']} episodes, {result['resolved']} resolved, verifier {result['verifier']}, "
        f"steps {result['steps']}, {result.get('group', 1)} per task"
        + (f", set-up command {result['setup_command']!r}" if result.get("setup_command") else "")
        + f"; commit {result['commit']}{' + changes' if result['dirty'] else ''}, "  # noqa: E501
        f"{result['date']}, {result['cpus']} CPUs, load {load['start'][0]:.1f} -> {load['end'][0]:.1f}, "
        f"wall {result['wall_seconds']:.1f} s; total = harness + the service's whole tree; "
        "machine = every CPU, neighbours included)"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="episodes run first and left out")
    parser.add_argument(
        "--verifier",
        choices=("calls", "pytest"),
        default="calls",
        help="calls: generated tasks' call worker; pytest: the imported tasks' path (canaries)",
    )
    parser.add_argument(
        "--steps",
        choices=("none", "reference"),
        default="none",
        help="none: no tool runs; reference: the scripted teacher's clean path (resolves)",
    )
    parser.add_argument(
        "--group", type=int, default=1, help="episodes per task, one after another (a GRPO group run one at a time)"
    )
    parser.add_argument(
        "--setup-command",
        default=None,
        help="a command every task's set-up runs (setup_commands), e.g. 'python3 -m venv --without-pip /opt/venv'",
    )
    parser.add_argument("--out", default="build/profile_episode.json")
    args = parser.parse_args(argv)
    result = run(args.episodes, args.warmup, args.verifier, args.steps, args.group, args.setup_command)
    print(table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
