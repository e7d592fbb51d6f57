"""The checks a maintainer relies on, in `make test`: ruff's lint and format check over the repository, and mypy over
the three packages with a shrinking baseline (pyproject.toml: [tool.ruff], [tool.mypy])."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    out = _run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert out.returncode == 0, (
        f"`ruff check .` (fix with `ruff check --fix .` where it can):\n{out.stdout}{out.stderr}"
    )


def test_the_code_is_formatted():
    out = _run(str(BIN / "ruff"), "format", "--check", "--no-cache", ".")
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout}{out.stderr}"


def _module(path: str) -> str:
    return re.sub(r"(\.__init__)?\.py$", "", path).replace("/", ".")


@pytest.fixture(scope="module")
def mypy_without_baseline(tmp_path_factory) -> tuple[set[str], dict[str, list[str]]]:
    """mypy once with the project's settings but no baseline: (the baseline's modules, every module's errors)."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    baseline = {
        m for override in settings.pop("overrides", []) if override.get("ignore_errors") for m in override["module"]
    }
    lines = ["[mypy]"]
    for key, value in settings.items():
        lines.append(f"{key} = {', '.join(value) if isinstance(value, list) else str(value).lower()}")
    config = tmp_path_factory.mktemp("mypy") / "mypy.ini"
    config.write_text("\n".join(lines) + "\n")
    out = _run(str(BIN / "mypy"), "--config-file", str(config), "--cache-dir", str(ROOT / ".mypy_cache"))
    assert out.returncode in (0, 1), f"mypy did not run:\n{out.stdout}{out.stderr}"
    errors: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        match = re.match(r"^([\w/]+\.py):\d+: error: ", line)
        if match:
            errors.setdefault(_module(match.group(1)), []).append(line)
    return baseline, errors


def test_mypy_passes_outside_the_baseline(mypy_without_baseline):
    baseline, errors = mypy_without_baseline
    new = {m: e for m, e in errors.items() if m not in baseline}
    assert not new, "type errors (run `.venv/bin/mypy`):\n" + "\n".join(line for e in new.values() for line in e)


def test_the_baseline_only_lists_modules_that_still_fail(mypy_without_baseline):
    baseline, errors = mypy_without_baseline
    fixed = sorted(baseline - set(errors))
    assert not fixed, f"these modules pass mypy now: take them off the baseline in pyproject.toml: {fixed}"


def test_nothing_points_to_an_issue_tracker_the_repository_does_not_have():
    """Docs, code and tests say what and why, not a tracker number: the tracker is not in this repository."""
    tracked = _run("git", "ls-files", "--", "*.py", "*.md", "*.toml", "*.yaml", "*.sh", "Makefile").stdout.split()
    hits = [
        f"{path}:{n}: {line.strip()}"
        for path in tracked
        if not path.startswith("examples/") and (ROOT / path).is_file()
        for n, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
        if re.search(r"\b[Ii]ssues? #?\d+", line)
    ]
    assert not hits, "\n".join(hits)
