"""Make the git checkouts the example's tasks name: `python examples/bring-your-own/make_repos.py OUT`.

Each directory under `repos/` (named owner__name, as SWE-bench checkouts are) becomes a git repository in OUT with
one commit, made with a fixed author, committer and date, so its hash is the `base_commit` that `tasks.jsonl`
names. Standard library and git only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXED = {"GIT_AUTHOR_NAME": "orchard example", "GIT_AUTHOR_EMAIL": "example@orchard.invalid",
         "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00", "GIT_COMMITTER_NAME": "orchard example",
         "GIT_COMMITTER_EMAIL": "example@orchard.invalid", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **FIXED, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd,
                          env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(source: Path, out: Path) -> str:
    """`source`'s files as a one-commit repository at `out`; returns the commit hash."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    for path in out.rglob("*"):  # git records the executable bit: the same modes give the same commit
        if path.is_file():
            path.chmod(0o644)
    git(out, "init", "-q")
    git(out, "add", "-A")
    git(out, "commit", "-q", "-m", "base")
    return git(out, "rev-parse", "HEAD")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted(p for p in (HERE / "repos").iterdir() if p.is_dir()):
        print(f"{out / source.name}: {make_repo(source, out / source.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
