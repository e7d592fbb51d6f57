"""What the local runner shows while a run goes: the estimate, one line per stage, the progress bar with the time
left, and a console whose tables fit the terminal, or keep their full width when the output is piped."""

from __future__ import annotations

import time
from typing import Any

from pipelines.estimate import Schedule, duration

# Wide enough for every table and line the runner prints when nothing wraps them (a pipe, a file, CI's log).
PIPED_WIDTH = 200


def make_console(file: Any = None) -> Any:
    """A rich Console: the terminal's width on a terminal; `PIPED_WIDTH` columns when writing to a pipe or file,
    where rich would otherwise assume 80 and wrap the results table's cells."""
    from rich.console import Console

    console = Console(file=file)
    if not console.is_terminal:
        console = Console(file=file, width=PIPED_WIDTH)
    return console


def _rate(record: dict) -> str:
    rate, ci = record.get("resolved_rate"), record.get("resolved_rate_ci95")
    if rate is None or rate != rate:
        return "no verified attempt"
    text = f"resolved {record.get('resolved')}/{record.get('valid_attempts')} ({100 * rate:.1f}%"
    return text + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}])" if ci else ")")


def stage_note(stage: str, record: dict) -> str:
    """What a finished stage did, in a few words (its result record's main figures)."""
    metrics = record.get("metrics") or {}
    if stage == "provision":
        counts = record.get("counts") or {}
        return f"{counts.get('train', 0)} train, {counts.get('heldout', 0)} held-out tasks"
    if stage == "init-policy":
        params = metrics.get("num_parameters")
        return f"{params / 1e6:.2f} M parameters" if params else ""
    if stage.startswith("evaluate"):
        return _rate(record)
    if stage == "distill":
        counts = record.get("counts") or {}
        return ", ".join(f"{k} {v}" for k, v in counts.items())
    if stage == "credit":
        return f"{record.get('labelled', 0)} of {record.get('unresolved', 0)} unresolved trajectories labelled"
    if stage == "sft":
        return (
            f"{record.get('steps')} steps, loss {record.get('first_loss', float('nan')):.3f} -> "
            f"{record.get('final_loss', float('nan')):.3f}"
        )
    if stage == "rl":
        return (
            f"{record.get('steps_done')} updates, {record.get('trajectories')} episodes, "
            f"{record.get('informative_groups')} informative groups"
        )
    if stage == "promote":
        return "promoted" if record.get("promoted") else f"not promoted: {str(record.get('reason', ''))[:80]}"
    return ""


def time_left(schedule: Schedule, clock: dict[str, Any]) -> str:
    """The run's time left, re-estimated from the stage running now and how long it has run (the bar's postfix)."""
    stage, started = clock.get("stage"), clock.get("started")
    left = schedule.left(stage, time.monotonic() - started if started else 0.0)
    return "time left unknown" if left is None else f"~{duration(left)} left"
