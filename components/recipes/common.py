"""Small helpers the recipes share: difficulty filtering, family splits and check-list verdicts."""

from __future__ import annotations

import re

from components.core.episode.recipe_base import RecipeBase, VerifyResult
from components.core.data.schema import Task, TestReport
from sandbox_service.client import SandboxClient


def families_at(
    families: tuple[str, ...], difficulty: int | list[int] | None, levels_by_family: dict[str, int]
) -> tuple[str, ...]:
    """The families of `families` at the given difficulty level(s); all of them for None."""
    if difficulty is None:
        return tuple(families)
    levels = {difficulty} if isinstance(difficulty, int) else set(difficulty)
    kept = tuple(f for f in families if levels_by_family[f] in levels)
    if not kept:
        raise ValueError(f"no task family at difficulty {sorted(levels)}; levels are {levels_by_family}")
    return kept


def families_for_split(pool: tuple[str, ...], heldout_families: tuple[str, ...], split: str) -> tuple[str, ...]:
    """The families `split` draws from: with `heldout_families`, held-out tasks come from them only and train and
    validation tasks never do (validation tunes on the training families: tuning must not see the held-out ones);
    without, every split draws from `pool`."""
    if split == "heldout":
        return tuple(heldout_families) or tuple(pool)
    kept = tuple(f for f in pool if f not in heldout_families)
    if not kept:
        raise ValueError(f"every family is held out ({list(heldout_families)}): the {split} split would be empty")
    return kept


def goal(task: Task) -> dict:
    """A GUI or Claw task's unit: its goal and expected outcome. The site or world around it is random filler, so
    two tasks with one goal and answer in different worlds are one task to a policy that memorised the answer."""
    return {"prompt": task.prompt, "expected": task.verifier.expected}


def checklist_result(checks: list[tuple[str, bool]]) -> VerifyResult:
    """A verdict from named checks: resolved only if every check holds; the report lists each."""
    failed = [name for name, ok in checks if not ok]
    report = TestReport(
        passed=len(checks) - len(failed),
        failed=len(failed),
        output="\n".join(f"{'PASS' if ok else 'FAIL'} {name}" for name, ok in checks),
    )
    return VerifyResult(resolved=not failed, report=report, reason=("failed: " + "; ".join(failed)) if failed else None)


def normalize_text(s: str | None) -> str:
    """Lower-case words only, so verifiers compare what was meant, not punctuation or spacing."""
    return re.sub(r"[^a-z0-9]+", " ", (s or "").lower()).strip()


_PHONE = re.compile(r"\+?\d{1,3}(?:[ -]\d{3,4}){2,3}")
_TIME = re.compile(r"(?<![\d:])(\d{1,2}:\d{2})(?![\d:])")
_NUMBER = re.compile(r"(?<![\d,.])\d[\d,]*(?:\.\d+)?")
_FRAMING = re.compile(r"^(?:(?:the )?answer(?: is)?|it is|it s|that is|that s)\s+")


def one_answer(final_answer: str | None, expected: str) -> tuple[bool, str]:
    """Is `final_answer` one answer, and the expected one? (ok, what was compared)

    The rule of every question a recipe checks, and of every single fact a written artefact must carry
    (a note's total, a mail's phone number): a phone number, a time (HH:MM) or a number is matched
    against every phone number, time or number the text mentions, which must all be the expected one ("It starts at
    14:30." is
    right; "09:00 or 14:30" is not); any other answer must equal the expected text after
    normalisation (case, punctuation, spacing, a leading "the answer is"), so listing every candidate
    ("Red Mug, Blue Lamp, Green Chair") never matches the one it contains.
    """
    text = final_answer or ""
    want = expected.strip()
    if _PHONE.fullmatch(want):
        found = {re.sub(r"\D", "", p) for p in _PHONE.findall(text)}
        return found == {re.sub(r"\D", "", want)}, f"phone numbers {_few(found)}"
    if _TIME.fullmatch(want):
        found = {t.zfill(5) for t in _TIME.findall(text)}
        return found == {want.zfill(5)}, f"times {_few(found)}"
    compact = want.replace(",", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", compact):
        found = {n.replace(",", "") for n in _NUMBER.findall(text)}
        return found == {compact}, f"numbers {_few(found)}"
    got = _FRAMING.sub("", normalize_text(text))
    return got == normalize_text(want), repr(got[:200])


def _few(found: set[str]) -> str:
    shown = sorted(found)[:5]
    return f"{shown}" + (f" and {len(found) - 5} more" if len(found) > 5 else "")


def verify_fresh(recipe: RecipeBase, task: Task, client: SandboxClient, patch: str | None = None) -> VerifyResult:
    """Set the task up in a fresh sandbox, apply `patch` (a unified diff, if any) and run the recipe's verifier:
    the gold checks' two verdicts (`TaskCheck.of`)."""
    with client.create(recipe.sandbox_spec(task)) as sandbox:
        try:
            recipe.setup(sandbox, task)
            if patch:
                applied = sandbox.apply_patch(patch, cwd=task.environment.workdir)
                if not applied.applied:
                    return VerifyResult(
                        resolved=False, reason=f"reference patch does not apply: {applied.stderr[-300:]}"
                    )
            return recipe.verify(sandbox.verifying(), task, patch)
        finally:
            recipe.release(sandbox)
