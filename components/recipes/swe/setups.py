"""Task set-up written once per task environment, reused: an archive of the workdir, or a snapshot.

The first episode of a task sets its sandbox up the long way (files uploaded, then `git init`, add and
commit: a shell and four git processes) and downloads the workdir; every later episode of a task with the
same environment gets it in one file operation (the agent extracts the archive, no process starts). The
archive is read from the episode's own sandbox after set-up and before the policy's first step, so it is
the task's state and nothing a policy wrote; its tree is also the pristine tree the verifier diffs the
agent's final tree against, so no verification downloads the pristine state again.

Kept only for environments whose set-up is files and `git init` in a workdir under /workspace (the file
API's root): no `setup_commands` (they may change what lies outside the workdir), and a `repo_path` only
at a fixed `base_commit`. What differs
from a set-up run in place: file modes are the archive's as the agent extracts any upload (owner
read/write added), and every episode of a task shares the same initial commit id. Bounded by the bytes
kept (archives and trees), least recently used dropped first.

A task whose set-up runs commands (`setup_commands`: what they change may lie anywhere in the sandbox) is
kept as a snapshot instead (`SetupSnapshots`): the first episode's sandbox right after set-up, the pristine
state its verification forks anyway. Later episodes restore it into their fresh sandbox instead of running
the commands again, and share it as their pristine state (no snapshot each). On the local backend a restore
mounts the snapshot as a read-only layer beneath an empty upper: nothing is copied.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from components.core.data.schema import Task
from components.recipes.swe.change import Tree

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_SNAPSHOTS = 32


@dataclass(frozen=True)
class TaskSetup:
    """A task's workdir after set-up: the archive to extract and the tree it holds."""

    archive: bytes
    tree: Tree
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.archive) + sum(len(v) for v in self.tree.files.values()))


def setup_key(task: Task) -> str | None:
    """What determines the task's set-up, as a digest; None when its set-up is not kept (see the module)."""
    env = task.environment
    if env.setup_commands or (env.repo_path is not None and env.base_commit is None):
        return None
    if not (env.workdir + "/").startswith("/workspace/"):  # the file API (archives) serves /workspace only
        return None
    return _digest(task)


def snapshot_key(task: Task) -> str | None:
    """What determines a set-up kept as a snapshot (every fact set-up reads, its commands included); None
    where it reads a host directory that may change (a `repo_path` without `base_commit`)."""
    env = task.environment
    if env.repo_path is not None and env.base_commit is None:
        return None
    return _digest(task, setup_commands=list(env.setup_commands))


def _digest(task: Task, **more: object) -> str:
    env = task.environment
    facts = {
        "image": env.image,
        "workdir": env.workdir,
        "files": env.files,
        "repo_path": env.repo_path,
        "base_commit": env.base_commit,
        **more,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


class _KeptByKey:
    """A thread-safe table of set-ups by key, whose `lock(key)` lets the first episode of a task set it up
    while its siblings wait and then reuse the result."""

    _kept: OrderedDict

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


class SetupArchives(_KeptByKey):
    """Task set-ups by `setup_key`, least recently used dropped past `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        super().__init__()
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, TaskSetup] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> TaskSetup | None:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def put(self, key: str, setup: TaskSetup) -> bool:
        """Keep `setup` (False when it alone is over `max_bytes`: not kept)."""
        if setup.size > self.max_bytes:
            return False
        with self._lock:
            old = self._kept.pop(key, None)
            self._bytes -= old.size if old is not None else 0
            self._kept[key] = setup
            self._bytes += setup.size
            while self._bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.size
        return True


class SetupSnapshots(_KeptByKey):
    """Task set-ups kept as snapshots, by `snapshot_key`. Each episode that restores one (or
    made it) uses it as its pristine state until `release`; past `max_kept` the least recently used is
    dropped from the table and deleted once its last episode releases it."""

    def __init__(self, max_kept: int = DEFAULT_MAX_SNAPSHOTS):
        super().__init__()
        self.max_kept = max_kept
        self._kept: OrderedDict[str, str] = OrderedDict()  # key -> snapshot id
        self._users: Counter[str] = Counter()  # snapshot id -> episodes using it

    def acquire(self, key: str) -> str | None:
        """The snapshot kept for `key`, now used by one more episode (None: none kept)."""
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                self._users[found] += 1
            return found

    def put(self, key: str, snapshot_id: str) -> list[str]:
        """Keep `snapshot_id` for `key`, used by the episode that made it; returns the snapshots dropped
        from the table that no episode uses (the caller deletes them)."""
        with self._lock:
            self._users[snapshot_id] += 1
            doomed = [] if (old := self._kept.pop(key, None)) is None else [old]
            self._kept[key] = snapshot_id
            while len(self._kept) > self.max_kept:
                doomed.append(self._kept.popitem(last=False)[1])
            return [s for s in doomed if not self._users[s]]

    def forget(self, key: str, snapshot_id: str) -> None:
        """`snapshot_id` is gone (the service no longer has it): never hand it out again."""
        with self._lock:
            if self._kept.get(key) == snapshot_id:
                del self._kept[key]

    def release(self, snapshot_id: str) -> bool | None:
        """An episode no longer uses `snapshot_id`. None: not one of ours (the caller's own snapshot);
        True: dropped from the table and unused, delete it now; False: kept."""
        with self._lock:
            if not self._users[snapshot_id]:
                self._users.pop(snapshot_id, None)
                return None
            self._users[snapshot_id] -= 1
            if self._users[snapshot_id]:
                return False
            del self._users[snapshot_id]
            return snapshot_id not in self._kept.values()

    def drain(self) -> list[str]:
        """Empty the table; returns the snapshots no episode uses (the caller deletes them; one in use goes
        at its episode's release)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            return [s for s in kept if not self._users[s]]
