"""Task set-up written once per task environment: the archive of the workdir right after set-up, reused.

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
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from components.core.data.schema import Task
from components.recipes.swe.change import Tree

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


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
    facts = {
        "image": env.image,
        "workdir": env.workdir,
        "files": env.files,
        "repo_path": env.repo_path,
        "base_commit": env.base_commit,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


class SetupArchives:
    """Task set-ups by `setup_key`, least recently used dropped past `max_bytes`; thread-safe. `lock(key)`
    lets the first episode of a task set it up while its siblings wait and then reuse the result."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, TaskSetup] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

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

    def lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)
