"""Small helpers the GUI and Claw recipes share: difficulty filtering and check-list verdicts."""

from __future__ import annotations

import re

from components.core.recipe_base import VerifyResult
from components.core.schema import TestReport


def families_at(families: tuple[str, ...], difficulty: int | list[int] | None,
                levels_by_family: dict[str, int]) -> tuple[str, ...]:
    """The families of `families` at the given difficulty level(s); all of them for None."""
    if difficulty is None:
        return tuple(families)
    levels = {difficulty} if isinstance(difficulty, int) else set(difficulty)
    kept = tuple(f for f in families if levels_by_family[f] in levels)
    if not kept:
        raise ValueError(f"no task family at difficulty {sorted(levels)}; levels are {levels_by_family}")
    return kept


def checklist_result(checks: list[tuple[str, bool]]) -> VerifyResult:
    """A verdict from named checks: resolved only if every check holds; the report lists each."""
    failed = [name for name, ok in checks if not ok]
    report = TestReport(passed=len(checks) - len(failed), failed=len(failed),
                        output="\n".join(f"{'PASS' if ok else 'FAIL'} {name}" for name, ok in checks))
    return VerifyResult(resolved=not failed, report=report, reason=("failed: " + "; ".join(failed)) if failed else None)


def normalize_text(s: str | None) -> str:
    """Lower-case words only, so verifiers compare what was meant, not punctuation or spacing."""
    return re.sub(r"[^a-z0-9]+", " ", (s or "").lower()).strip()
