"""Import SWE-bench-format instances as SWE tasks, from a local JSONL or parquet file.

Each instance has `instance_id`, `repo` ("owner/name"), `base_commit`, `problem_statement`, `patch`
(the reference fix), `test_patch` (the tests that check it), and `FAIL_TO_PASS` / `PASS_TO_PASS`
(JSON lists of pytest node ids, or lists). The repository comes from a local checkout under
`repos_dir` (named `owner__name`, `owner/name` or `name`); the sandbox gets its tree at
`base_commit` without history, and the test patch is applied only after the agent submits.
Running the tests needs the repository's own dependencies in the sandbox's python (or an image).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from components.core.data.schema import EnvironmentSpec, Split, Task, VerifierSpec

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


class SWEBenchImportError(ValueError):
    """An instance is missing a field or its repository checkout; the message says which."""


def read_instances(path: str | Path) -> list[dict[str, Any]]:
    """The instances of a JSONL, JSON or parquet file (SWEBenchImportError naming the file and line)."""
    return [instance for _, instance in located_instances(path)]


def located_instances(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, instance) for every instance of the file: `file:line` in a JSONL file, `file[i]` in a JSON list,
    `file row i` in parquet, so that an error names the row to fix. A row that is not valid JSON or not an
    object is refused here, with its place."""
    path = Path(path)
    if not path.exists():
        raise SWEBenchImportError(f"{path} does not exist")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                rows.append((f"{path}:{number}", _json_row(line, f"{path}:{number}")))
        return rows
    if path.suffix == ".json":
        data = _json_row(path.read_text(), str(path), top_level=True)
        items = data if isinstance(data, list) else [data]
        return [(f"{path}[{i}]", _object(item, f"{path}[{i}]")) for i, item in enumerate(items)]
    if path.suffix == ".parquet" or path.is_dir():
        return [(f"{path} row {i + 1}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    raise SWEBenchImportError(f"{path}: expected .jsonl, .json or .parquet")


def _json_row(text: str, where: str, top_level: bool = False) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        # JSONDecodeError's own "line 1 column 101" counts inside the row: the row's place comes from `where`
        place = f"line {err.lineno} column {err.colno}" if top_level else f"column {err.colno}"
        said = f"{err.msg} {place}" if err.msg.endswith(" at") else f"{err.msg} at {place}"
        raise SWEBenchImportError(f"{where}: not valid JSON ({said})") from None
    return value if top_level else _object(value, where)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SWEBenchImportError(f"{where}: an instance must be a JSON object, got {type(value).__name__}")
    return value


def _id_list(value: Any, field: str, instance_id: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise SWEBenchImportError(f"{instance_id}: {field} is not a JSON list") from err
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SWEBenchImportError(f"{instance_id}: {field} must be a list of test ids")
    return list(value)


def _checkout(repos_dir: Path, repo: str, instance_id: str) -> Path:
    candidates = [repos_dir / repo.replace("/", "__"), repos_dir / repo, repos_dir / repo.split("/")[-1]]
    for candidate in candidates:
        if (candidate / ".git").exists():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise SWEBenchImportError(f"{instance_id}: no git checkout of {repo} found (tried {tried}); clone it there")


def instance_to_task(
    instance: dict[str, Any], repos_dir: str | Path, *, split: Split = "heldout", timeout_seconds: float = 600.0
) -> Task:
    instance_id = str(instance.get("instance_id", "?"))
    missing = [k for k in REQUIRED if k not in instance]
    if missing:
        raise SWEBenchImportError(f"{instance_id}: missing fields {missing}")
    not_text = [k for k in REQUIRED[:6] if not isinstance(instance[k], str) or not instance[k].strip()]
    if not_text:
        raise SWEBenchImportError(f"{instance_id}: {', '.join(not_text)} must be non-empty strings")
    checkout = _checkout(Path(repos_dir), instance["repo"], instance_id)
    f2p = _id_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS", instance_id)
    p2p = _id_list(instance["PASS_TO_PASS"], "PASS_TO_PASS", instance_id)
    return Task(
        id=re.sub(r"[^A-Za-z0-9_.-]", "-", instance_id),
        recipe="swe",
        split=split,
        prompt=instance["problem_statement"],
        environment=EnvironmentSpec(
            repo_path=str(checkout.resolve()),
            base_commit=instance["base_commit"],
            workdir="/workspace/repo",
            memory_mb=4096,
            cpu=2.0,
        ),
        verifier=VerifierSpec(
            kind="pytest",
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            expected={"test_patch": instance["test_patch"]},
            timeout_seconds=timeout_seconds,
        ),
        reference_solution=instance["patch"],
        family=f"swebench:{instance['repo']}",
        difficulty=3,
        unit=instance["repo"],  # instances of one repository are not independent evidence
        metadata={
            "source": "swebench",
            "instance_id": instance_id,
            "repo": instance["repo"],
            "version": instance.get("version"),
        },
    )


def import_swebench(path: str | Path, repos_dir: str | Path, *, split: Split = "heldout") -> list[Task]:
    """Tasks for every instance in `path`, with repositories from `repos_dir`; an instance that cannot be
    imported raises SWEBenchImportError naming its place (`file:line`) and what is wrong with it."""
    if not Path(repos_dir).is_dir():
        raise SWEBenchImportError(
            f"repos_dir {repos_dir} is not a directory (the instances' git checkouts, named owner__name)"
        )
    tasks, places = [], []
    for where, instance in located_instances(path):
        try:
            tasks.append(instance_to_task(instance, repos_dir, split=split))
        except SWEBenchImportError as err:
            raise SWEBenchImportError(f"{where}: {err}") from None
        places.append(where)
    _check_commits(tasks, places)
    return tasks


def _check_commits(tasks: list[Task], places: list[str]) -> None:
    """Every base_commit is a commit of its checkout (one `git cat-file --batch-check` per repository), so a
    wrong hash is named with its row here, not found in a sandbox's set-up later."""
    import subprocess

    by_repo: dict[str, list[tuple[str, str]]] = {}
    for task, where in zip(tasks, places):
        repo_path, base_commit = task.environment.repo_path, task.environment.base_commit
        # instance_to_task sets both: the checkout it found and the row's base_commit (a required, non-empty string)
        assert repo_path is not None and base_commit is not None
        by_repo.setdefault(repo_path, []).append((where, base_commit))
    for repo, rows in by_repo.items():
        query = "".join(f"{commit}^{{commit}}\n" for _, commit in rows)
        answer = subprocess.run(
            ["git", "-C", repo, "cat-file", "--batch-check"], input=query, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for (where, commit), line in zip(rows, answer):
            if line.endswith("missing"):
                raise SWEBenchImportError(
                    f"{where}: base_commit {commit} is not a commit of {repo}; fetch it there or fix the row"
                )
