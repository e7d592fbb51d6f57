"""Which split may hold a task: decided by the task's unit, never by the seed it was drawn with.

A generator draws candidate tasks from a seed stream per (split, seed); `draw` keeps a candidate only when

1. its **unit** falls in the split's share of the unit space (`SHARES`, by a hash of the unit), and
2. the split holds nothing with the same **content** yet.

The unit is what makes tasks dependent (a generated SWE task's repository, i.e. its files; a GUI task's site; a
Claw task's world); the content is what the agent is given (SWE: the repository's files and the issue text).
So, by construction and for every seed: no train or validation seed can produce a held-out task, nor any task of
a held-out unit (the same repository with another issue text included); the three splits share no unit; and no
split holds a task twice. Held-out and validation sets are evaluated on fixed seeds while the train seed varies,
and bookkeeping across seeds (which held-out tasks did which run train on?) is not needed for this to hold.

The shares are constants, not settings: changing them would move units between splits, and tasks generated
before and after the change would no longer be disjoint. A suite whose unit space is too small for the
asked number of tasks fails loudly (`SplitExhausted`) instead of repeating tasks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from components.core.data.schema import Split, Task

# Share of the unit space each split may draw from: [low, high) of the unit's hash in [0, 1).
SHARES: dict[str, tuple[float, float]] = {"heldout": (0.0, 0.2), "validation": (0.2, 0.3), "train": (0.3, 1.0)}
ATTEMPTS_PER_TASK = 400  # candidates tried for one slot before the split is declared exhausted


class SplitExhausted(ValueError):
    """The suite's settings give fewer distinct tasks of a split than asked for."""


def digest(value: Any) -> str:
    """A short stable digest of JSON-able `value` (dict key order does not matter)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def task_content(task: Task, **world: Any) -> dict[str, Any]:
    """What the agent is given: the prompt and the environment (for SWE: the repository's files and the issue
    text), plus the generated `world` a recipe keeps elsewhere (a GUI site, a Claw world)."""
    return {"prompt": task.prompt, "environment": task.environment.model_dump(mode="json"), **world}


def split_of(unit: str) -> str:
    """The one split whose share holds `unit` (a unit key, e.g. `Task.unit`)."""
    position = int(hashlib.sha256(f"orchard-split:{unit}".encode()).hexdigest()[:15], 16) / 16**15
    return next(split for split, (low, high) in SHARES.items() if low <= position < high)


def draw(
    candidate: Callable[[int, int], Task],
    split: Split,
    n: int,
    *,
    content: Callable[[Task], Any],
    unit: Callable[[Task], Any] | None = None,
) -> list[Task]:
    """`n` tasks of `split`: slot k takes the first of candidate(k, 0), candidate(k, 1), ... whose unit lies in
    the split's share and whose content is not in the set yet, preferring units not in the set yet (a repeated
    unit is taken only after half the tries found no new one). `unit(task)` is the value whose digest becomes
    `Task.unit` (None: the content, each task its own unit). Deterministic in `candidate`."""
    kept: list[Task] = []
    seen: set[str] = set()
    units: set[str] = set()
    for slot in range(n):
        for attempt in range(ATTEMPTS_PER_TASK):
            task = candidate(slot, attempt)
            key = digest(content(task))
            unit_key = digest(unit(task)) if unit is not None else key
            # a unit already in the set only once the first half of the tries found no new one: as many
            # independent units as the suite holds
            repeat = unit_key in units and attempt < ATTEMPTS_PER_TASK // 2
            if key not in seen and not repeat and split_of(unit_key) == split:
                seen.add(key)
                units.add(unit_key)
                kept.append(task.model_copy(update={"unit": unit_key}))
                break
        else:
            raise SplitExhausted(
                f"{split}: only {len(kept)} distinct tasks found ({ATTEMPTS_PER_TASK} candidates tried for the next "
                f"one) where {n} were asked for; the suite's settings (families, packages, difficulty) hold too few "
                f"distinct {split} tasks: ask for fewer or widen the suite"
            )
    return kept


def check_disjoint(splits: dict[str, list[Task]], content: Callable[[Task], Any]) -> dict[str, int]:
    """Content duplicates within each split and shared across splits ({"<split>": n, "<a>&<b>": n}); all zero
    for generated tasks (by `draw`'s construction), what an imported file holds otherwise."""
    keys = {name: [digest(content(t)) for t in tasks] for name, tasks in splits.items()}
    out = {name: len(k) - len(set(k)) for name, k in keys.items()}
    names = list(keys)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            out[f"{a}&{b}"] = len(set(keys[a]) & set(keys[b]))
    return out


def unit_of(task: Task) -> str:
    """The task's unit (`Task.unit`), or its id for tasks stored before units existed."""
    return task.unit or task.id
