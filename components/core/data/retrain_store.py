"""The retraining data store: tasks and teacher trajectories that grow run after run.

A scheduled retraining run adds new training tasks and their (credit-labelled) teacher
trajectories as new shards, and trains on every shard accumulated so far (or the last N runs').
Layout of a store directory (`retrain.data_store`):

    store.json                 the manifest (`StoreManifest`): runs, their task seeds and ids, shards
    .lock                      the writers' lock file
    tasks/part-*.parquet       a TaskStore (components/core/data/parquet_store.py): one shard per run
    trajectories/part-*.parquet  a TrajectoryStore: one shard per run (credited teacher trajectories)

The manifest is the source of truth: a shard counts only once the manifest lists it, so a run that
died between writing its shard and recording it leaves an orphan file that no run trains on.

Two writers (two runs at once, a retried pod): every read-modify-write of the manifest holds an
exclusive lock on `.lock` (`filelock`, i.e. `fcntl.flock`), and the manifest itself is replaced
atomically (temporary file + `os.replace`), so a reader without the lock sees a whole manifest.
Shards get unique names and are written outside the lock. Object-store URIs (s3://, gs://) are
refused: flock and rename are what make two writers safe, and object stores offer neither; mount
the bucket or volume and give its path.

Task ids never repeat across runs: a run claims a task-generation seed that no earlier run used
(recorded with the ids it produced), and both claims and held-out ids are checked under the lock:
no training task id equals another run's or any held-out task's.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import Task, Trajectory
from components.core.data.parquet_store import StoreError, TaskStore, TrajectoryStore

MANIFEST = "store.json"
LOCK = ".lock"
TRAINING_LIST = "_training.json"  # written next to a materialized training set: which store shards it is
SEED_TRIES = 1000  # seeds tried before giving up on drawing tasks disjoint from every earlier run's


class StoreRun(BaseModel):
    """One pipeline run's entry: the tasks it claimed, the shards it added, the shards it trained on."""

    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(description="The pipeline run (MLflow parent run id).")
    train_seed: int = Field(description="Task-generation seed of this run's training tasks (never reused).")
    task_ids: list[str] = Field(description="This run's training task ids.")
    heldout_ids: list[str] = Field(default_factory=list, description="Held-out task ids this run evaluated on.")
    claimed_at: str
    task_shards: list[str] = Field(default_factory=list, description="Shards this run added (store-relative).")
    trajectory_shards: list[str] = Field(default_factory=list, description="Trajectory shards this run added.")
    trained_on: list[str] = Field(default_factory=list, description="Trajectory shards this run's SFT read.")
    added_at: str | None = Field(None, description="When its shards were recorded (None: claimed only).")
    added_order: int | None = Field(
        None,
        description="1, 2, ...: the order runs recorded their shards in (set "
        "under the lock, so clock skew between hosts cannot reorder).",
    )


class StoreManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str = "orchard-data-store"
    version: int = 1
    recipe: str = Field(description="Recipe of every task in the store (one store per recipe).")
    runs: list[StoreRun] = Field(default_factory=list, description="In claim order.")

    def run(self, run_id: str) -> StoreRun | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    @property
    def training_ids(self) -> set[str]:
        return {t for r in self.runs for t in r.task_ids}

    @property
    def heldout_ids(self) -> set[str]:
        return {t for r in self.runs for t in r.heldout_ids}

    def window(self, runs: int | None) -> list[str]:
        """Trajectory shards of the last `runs` runs that added data (None: all), oldest first."""
        added = sorted((r for r in self.runs if r.added_order is not None), key=lambda r: r.added_order or 0)
        chosen = added if runs is None else added[-runs:]
        return [s for r in chosen for s in r.trajectory_shards]


def store_path(location: str) -> Path:
    """A local path or file:// URI; other schemes are refused (see the module docstring)."""
    scheme = urlparse(location).scheme
    if scheme == "file":
        return Path(urlparse(location).path)
    if scheme and len(scheme) > 1:  # "C:" style drive letters aside
        raise StoreError(
            f"retrain.data_store {location!r}: {scheme}:// is not supported: two writers are kept "
            "apart by a lock file and an atomic rename, which object stores lack; mount the bucket "
            "or volume and give its path"
        )
    return Path(location)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class DataStore:
    """`DataStore(path).claim(...)` in provision, `.add(...)` + `.materialize(...)` before SFT."""

    def __init__(self, location: str | Path, *, lock_timeout: float = 600.0):
        self.root = store_path(str(location))
        self.lock_timeout = lock_timeout

    @property
    def tasks(self) -> TaskStore:
        return TaskStore(self.root / "tasks")

    @property
    def trajectories(self) -> TrajectoryStore:
        return TrajectoryStore(self.root / "trajectories")

    # -- manifest ---------------------------------------------------------------------------
    def read(self) -> StoreManifest | None:
        path = self.root / MANIFEST
        return StoreManifest.model_validate_json(path.read_text()) if path.exists() else None

    def _write(self, manifest: StoreManifest) -> None:
        path = self.root / MANIFEST
        tmp = path.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "w") as fh:
            fh.write(manifest.model_dump_json(indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @contextmanager
    def _locked(self, recipe: str) -> Iterator[StoreManifest]:
        """The manifest under the writers' lock; written back (atomically) when the block succeeds."""
        from filelock import FileLock, Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(self.root / LOCK), timeout=self.lock_timeout):
                manifest = self.read() or StoreManifest(recipe=recipe)
                if manifest.recipe != recipe:
                    raise StoreError(
                        f"data store {self.root} holds {manifest.recipe!r} tasks, this run's recipe is "
                        f"{recipe!r}; give each recipe its own retrain.data_store"
                    )
                yield manifest
                self._write(manifest)
        except Timeout:
            raise StoreError(
                f"data store {self.root}: another writer held {LOCK} for {self.lock_timeout:.0f} s; "
                "if no run is writing, a crashed process may still hold it"
            ) from None

    # -- provision: new tasks ------------------------------------------------------------------
    def claim(
        self, run_id: str, recipe: str, generate: Callable[[int], list[Task]], heldout: list[Task], first_seed: int = 0
    ) -> tuple[int, list[Task]]:
        """This run's training tasks from a seed no run used, disjoint from every recorded task id.

        `generate(seed)` makes the training tasks of one seed. A run that claimed before (a retried
        provision step) gets its own seed again. Raises StoreError when a held-out task id is an
        earlier run's training task."""
        heldout_ids = {t.id for t in heldout}
        with self._locked(recipe) as manifest:
            leaked = heldout_ids & manifest.training_ids
            if leaked:
                raise StoreError(
                    f"held-out task(s) {sorted(leaked)[:3]} were training tasks of an earlier run in "
                    f"{self.root}: keep the held-out settings (seed, n_heldout, difficulty) the same "
                    "for every run of one store"
                )
            earlier = manifest.run(run_id)
            if earlier is not None:
                return earlier.train_seed, generate(earlier.train_seed)
            used_seeds = {r.train_seed for r in manifest.runs}
            taken = manifest.training_ids | manifest.heldout_ids | heldout_ids
            seed = max(used_seeds, default=first_seed - 1) + 1
            for seed in range(max(seed, first_seed), max(seed, first_seed) + SEED_TRIES):
                tasks = generate(seed)
                ids = [t.id for t in tasks]
                if seed not in used_seeds and not (set(ids) & taken) and len(set(ids)) == len(ids):
                    manifest.runs.append(
                        StoreRun(
                            run_id=run_id,
                            train_seed=seed,
                            task_ids=ids,
                            heldout_ids=sorted(heldout_ids),
                            claimed_at=_now(),
                        )
                    )
                    return seed, tasks
        raise StoreError(
            f"no seed in {SEED_TRIES} tries gives training tasks disjoint from the {len(taken)} task "
            f"ids in {self.root}: the recipe's task space is exhausted at these settings"
        )

    # -- before SFT: this run's data in, the training set out ----------------------------------
    def add(
        self,
        run_id: str,
        recipe: str,
        tasks: list[Task],
        trajectories: list[Trajectory],
        window_runs: int | None = None,
    ) -> StoreRun:
        """Record this run's tasks and trajectories as new shards; returns its entry with `trained_on`.

        Idempotent per run: a retried step that finds its shards recorded reuses them."""
        current = self.read()
        entry = current.run(run_id) if current else None
        if entry is None:
            raise StoreError(
                f"run {run_id} claimed no tasks in {self.root}: its provision step must run with the "
                "same retrain.data_store"
            )
        if entry.added_at is None:  # written outside the lock: unique names, unlisted until recorded
            task_shard = self.tasks.write(tasks)
            traj_shard = self.trajectories.append(trajectories)
        with self._locked(recipe) as manifest:
            entry = manifest.run(run_id)
            assert entry is not None  # claims are never removed
            if entry.added_at is None:
                entry.task_shards = [str(p.relative_to(self.root)) for p in (task_shard,) if p]
                entry.trajectory_shards = [str(p.relative_to(self.root)) for p in (traj_shard,) if p]
                entry.added_at = _now()
                entry.added_order = 1 + max((r.added_order or 0 for r in manifest.runs), default=0)
                entry.trained_on = manifest.window(window_runs)
            return entry.model_copy()

    def materialize(self, shards: list[str], out_dir: str | Path, *, run_id: str | None = None) -> Path:
        """The training set: a TrajectoryStore directory holding exactly `shards` (see `link_shards`)."""
        return link_shards(self.root, shards, out_dir, store=str(self.root), run_id=run_id)


def link_shards(root: Path, shards: list[str], out_dir: str | Path, *, store: str | None, run_id: str | None) -> Path:
    """A TrajectoryStore directory with exactly `shards` (paths under `root`; hard links when possible,
    else copies) and `_training.json` naming them (the lineage the gate and MLflow record)."""
    out = Path(out_dir)
    TrajectoryStore(out)._ensure_dir()
    for shard in shards:
        src = root / shard
        if not src.exists():
            raise StoreError(
                f"shard {shard} is listed for training but missing under {root}; restore it from "
                "a backup or remove the run's entry from the store's manifest"
            )
        dst = out / src.name
        if not dst.exists():
            try:
                os.link(src, dst)  # shards are immutable, so a link is a safe, free copy
            except OSError:
                shutil.copy2(src, dst)
    write_training_list(out, shards, store=store, run_id=run_id)
    return out


def write_training_list(out_dir: Path, shards: list[str], *, store: str | None, run_id: str | None) -> Path:
    path = Path(out_dir) / TRAINING_LIST
    path.write_text(json.dumps({"store": store, "run_id": run_id, "shards": shards}, indent=2))
    return path


def read_training_list(directory: str | Path) -> dict | None:
    """What `materialize` recorded about a training set (None: a plain store, not from a data store)."""
    path = Path(directory) / TRAINING_LIST
    return json.loads(path.read_text()) if path.exists() else None


CLAIM = "_data_store.json"  # in the run's tasks directory: which store and run id its tasks were claimed under


def write_claim(tasks_dir: str | Path, store: str, run_id: str, recipe: str, train_seed: int) -> Path:
    path = Path(tasks_dir) / CLAIM
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"store": store, "run_id": run_id, "recipe": recipe, "train_seed": train_seed}))
    return path


def read_claim(tasks_dir: str | Path) -> dict | None:
    path = Path(tasks_dir) / CLAIM
    return json.loads(path.read_text()) if path.exists() else None
