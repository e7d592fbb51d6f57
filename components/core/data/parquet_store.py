"""Parquet stores for tasks and trajectories: append-only shards, atomic writes, versioned rows.

Layout of a store directory:

    _manifest.json           {"kind": "trajectories", "schema_version": 1, "format": "orchard-parquet"}
    part-<time_ns>-<uuid>.parquet   one shard per `append`

Nested records (steps, tools, test report, metadata) are JSON strings, not arrow structs: a struct
column's type changes whenever a nested model gains a field, and `datasets.load_dataset("parquet")`
refuses shards whose types differ. With JSON strings every shard of a version has the same flat
arrow schema, `pandas.read_parquet(dir)` and `datasets.load_dataset("parquet", data_files=...)` load
the directory as is, and old versions are upgraded row by row on read (`_UPGRADES`).

A shard is written to a temporary file in the same directory, fsynced and `os.replace`d into place,
so a crash mid-write leaves either the whole shard or none (temporary names end in `.tmp`, which no
reader globs).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.data.schema import SCHEMA_VERSION, Outcome, Task, Trajectory

SHARD_GLOB = "part-*.parquet"
MANIFEST = "_manifest.json"  # a leading "_" or "." hides it from pyarrow and pandas dataset readers

TRAJECTORY_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("id", pa.string()),
        ("task_id", pa.string()),
        ("recipe", pa.string()),
        ("split", pa.string()),
        ("policy_id", pa.string()),
        ("outcome", pa.string()),
        ("outcome_reason", pa.string()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("final_answer", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("wall_seconds", pa.float64()),
        ("attempt", pa.int32()),
        ("num_steps", pa.int32()),
        ("created_at", pa.string()),
        ("steps", pa.string()),
        ("tools", pa.string()),
        ("test_report", pa.string()),
        ("metadata", pa.string()),
        ("verification", pa.string()),  # v2
    ]
)

TASK_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("id", pa.string()),
        ("recipe", pa.string()),
        ("split", pa.string()),
        ("family", pa.string()),
        ("difficulty", pa.int32()),
        ("seed", pa.int64()),
        ("prompt", pa.string()),
        ("task", pa.string()),  # the whole Task as JSON (environment, verifier, reference, metadata)
    ]
)

_JSON_COLUMNS = ("steps", "tools", "test_report", "metadata", "verification")


class StoreError(RuntimeError):
    """A store directory is missing, of another kind, or written by a newer schema version."""


# --------------------------------------------------------------------------------------------
# Rows <-> records
# --------------------------------------------------------------------------------------------
def trajectory_to_row(traj: Trajectory) -> dict[str, Any]:
    data = traj.model_dump(mode="json")
    row = {name: data.get(name) for name in TRAJECTORY_SCHEMA.names if name not in _JSON_COLUMNS}
    row["schema_version"] = SCHEMA_VERSION
    row["num_steps"] = len(traj.steps)
    for name in _JSON_COLUMNS:
        row[name] = json.dumps(data[name], ensure_ascii=False) if data[name] is not None else None
    return row


def _upgrade_v0(row: dict[str, Any]) -> dict[str, Any]:
    """v0 (the first prototype) had no split/status/tools columns and called outcome_reason `error`."""
    row = dict(row)
    row.setdefault("split", "train")
    row.setdefault("status", "aborted" if row.get("outcome") == "infra_error" else "completed")
    row.setdefault("tools", "[]")
    if "outcome_reason" not in row:
        row["outcome_reason"] = row.pop("error", None)
    row.pop("error", None)
    row["schema_version"] = 1
    return row


def _upgrade_v1(row: dict[str, Any]) -> dict[str, Any]:
    """v1 steps had no logprobs / tokenizer_id: their token_ids (if any) have unknown provenance, so
    rendering re-tokenizes them (flagged) rather than trust ids of a possibly different vocabulary."""
    return {**row, "schema_version": 2}


def _upgrade_v2(row: dict[str, Any]) -> dict[str, Any]:
    """v2 recorded no verification record (verifier version, ignored parts): it stays unknown (None)."""
    row = dict(row)
    row.setdefault("verification", None)
    row["schema_version"] = 3
    return row


# version -> function that lifts a row of that version to the next one
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _upgrade_v0, 1: _upgrade_v1, 2: _upgrade_v2}


def row_to_trajectory(row: dict[str, Any]) -> Trajectory:
    version = row.get("schema_version")
    version = 0 if version is None else int(version)
    if version > SCHEMA_VERSION:
        raise StoreError(f"trajectory row has schema_version {version} > {SCHEMA_VERSION} (this code); upgrade orchard")
    while version < SCHEMA_VERSION:
        row = _UPGRADES[version](row)
        version = int(row["schema_version"])
    data = {k: v for k, v in row.items() if k not in ("num_steps",) and v is not None}
    for name in _JSON_COLUMNS:
        if isinstance(data.get(name), str):
            data[name] = json.loads(data[name])
    return Trajectory.model_validate(data)


def task_to_row(task: Task) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "id": task.id,
        "recipe": task.recipe,
        "split": task.split,
        "family": task.family,
        "difficulty": task.difficulty,
        "seed": task.seed,
        "prompt": task.prompt,
        "task": task.model_dump_json(),
    }


def row_to_task(row: dict[str, Any]) -> Task:
    version = int(row.get("schema_version") or 0)
    if version > SCHEMA_VERSION:
        raise StoreError(f"task row has schema_version {version} > {SCHEMA_VERSION} (this code); upgrade orchard")
    return Task.model_validate_json(row["task"])


# --------------------------------------------------------------------------------------------
# Shard I/O
# --------------------------------------------------------------------------------------------
def write_table_atomic(table: pa.Table, path: Path) -> Path:
    """Write `table` to `path` so that readers see the whole file or nothing."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


class _ShardStore:
    kind: str
    schema: pa.Schema

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._lock = threading.Lock()

    # -- manifest ---------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest = self.dir / MANIFEST
        if manifest.exists():
            self._check_manifest()
            return
        body = json.dumps({"kind": self.kind, "schema_version": SCHEMA_VERSION, "format": "orchard-parquet"})
        tmp = manifest.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(body)
        os.replace(tmp, manifest)

    def _check_manifest(self) -> dict[str, Any]:
        manifest = self.dir / MANIFEST
        if not manifest.exists():
            return {}
        info = json.loads(manifest.read_text())
        if info.get("kind") != self.kind:
            raise StoreError(f"{self.dir} holds {info.get('kind')!r}, not {self.kind!r}; pass the right directory")
        return info

    def shards(self) -> list[Path]:
        return sorted(self.dir.glob(SHARD_GLOB)) if self.dir.exists() else []

    def _append_rows(self, rows: list[dict[str, Any]]) -> Path:
        self._ensure_dir()
        table = pa.Table.from_pylist(rows, schema=self.schema)
        # Names sort by write time, so "a later shard wins" is well defined.
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.parquet"
        with self._lock:
            return write_table_atomic(table, self.dir / name)

    def _rows(self, columns: list[str] | None = None) -> Iterable[dict[str, Any]]:
        if not self.dir.exists():
            raise StoreError(f"store directory {self.dir} does not exist; write to it first")
        self._check_manifest()
        for shard in self.shards():
            table = pq.read_table(shard)
            if columns is not None:
                table = table.select([c for c in columns if c in table.column_names])
            yield from table.to_pylist()


class TrajectoryStore(_ShardStore):
    """`TrajectoryStore(dir).append(trajs) -> shard path`, `.read()`, `.to_pandas()`, `.task_ids_done()`."""

    kind = "trajectories"
    schema = TRAJECTORY_SCHEMA

    def append(self, trajectories: list[Trajectory]) -> Path | None:
        if not trajectories:
            return None
        return self._append_rows([trajectory_to_row(t) for t in trajectories])

    def read(self) -> list[Trajectory]:
        return [row_to_trajectory(row) for row in self._rows()]

    def __iter__(self):
        return (row_to_trajectory(row) for row in self._rows())

    def to_pandas(self):
        """The flat table (JSON columns stay strings), one row per trajectory, all shards upgraded."""
        import pandas as pd

        rows = [trajectory_to_row(t) for t in self.read()]
        return pd.DataFrame(rows, columns=self.schema.names)

    def attempts_done(self, *, include_infra_errors: bool = False) -> Counter[str]:
        """Recorded trajectories per task id (infra errors excluded by default: they get retried)."""
        counts: Counter[str] = Counter()
        if not self.dir.exists():
            return counts
        for row in self._rows(columns=["task_id", "outcome"]):
            if include_infra_errors or row.get("outcome") != Outcome.infra_error.value:
                counts[row["task_id"]] += 1
        return counts

    def task_ids_done(self, *, include_infra_errors: bool = False) -> set[str]:
        return set(self.attempts_done(include_infra_errors=include_infra_errors))


class TaskStore(_ShardStore):
    """`TaskStore(dir).write(tasks)`, `.read(split=None)`; a later shard wins for a repeated id."""

    kind = "tasks"
    schema = TASK_SCHEMA

    def write(self, tasks: list[Task]) -> Path | None:
        if not tasks:
            return None
        return self._append_rows([task_to_row(t) for t in tasks])

    def read(self, split: str | None = None) -> list[Task]:
        by_id: dict[str, Task] = {}
        for row in self._rows():
            if split is None or row["split"] == split:
                by_id[row["id"]] = row_to_task(row)
        return list(by_id.values())

    def get(self, task_id: str) -> Task:
        for task in self.read():
            if task.id == task_id:
                return task
        raise KeyError(f"task {task_id!r} not in {self.dir}")
