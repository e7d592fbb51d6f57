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

from components.core.schema import EnvironmentSpec, Split, Task, VerifierSpec

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")


class SWEBenchImportError(ValueError):
    """An instance is missing a field or its repository checkout; the message says which."""


def read_instances(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise SWEBenchImportError(f"{path} does not exist")
    if path.suffix in (".jsonl", ".json"):
        text = path.read_text()
        if path.suffix == ".json":
            data = json.loads(text)
            return data if isinstance(data, list) else [data]
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if path.suffix == ".parquet" or path.is_dir():
        return pq.read_table(path).to_pylist()
    raise SWEBenchImportError(f"{path}: expected .jsonl, .json or .parquet")


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


def instance_to_task(instance: dict[str, Any], repos_dir: str | Path, *, split: Split = "heldout",
                     timeout_seconds: float = 600.0) -> Task:
    instance_id = str(instance.get("instance_id", "?"))
    missing = [k for k in REQUIRED if k not in instance]
    if missing:
        raise SWEBenchImportError(f"{instance_id}: missing fields {missing}")
    checkout = _checkout(Path(repos_dir), instance["repo"], instance_id)
    f2p = _id_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS", instance_id)
    p2p = _id_list(instance["PASS_TO_PASS"], "PASS_TO_PASS", instance_id)
    return Task(
        id=re.sub(r"[^A-Za-z0-9_.-]", "-", instance_id),
        recipe="swe",
        split=split,
        prompt=instance["problem_statement"],
        environment=EnvironmentSpec(repo_path=str(checkout.resolve()), base_commit=instance["base_commit"],
                                    workdir="/workspace/repo", memory_mb=4096, cpu=2.0),
        verifier=VerifierSpec(kind="pytest", fail_to_pass=f2p, pass_to_pass=p2p,
                              expected={"test_patch": instance["test_patch"]}, timeout_seconds=timeout_seconds),
        reference_solution=instance["patch"],
        family=f"swebench:{instance['repo']}",
        difficulty=3,
        unit=instance["repo"],  # instances of one repository are not independent evidence
        metadata={"source": "swebench", "instance_id": instance_id, "repo": instance["repo"],
                  "version": instance.get("version")},
    )


def import_swebench(path: str | Path, repos_dir: str | Path, *, split: Split = "heldout") -> list[Task]:
    """Tasks for every instance in `path`, with repositories from `repos_dir`."""
    return [instance_to_task(inst, repos_dir, split=split) for inst in read_instances(path)]
