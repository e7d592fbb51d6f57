"""Machine-wide numbered slots: veth names/addresses (local_network) and sandbox id ranges (local.py).

One O_EXCL file per slot in a directory under /run, holding its owner (the sandbox's dir), so services
with different state dirs, or a restarted one, never hand out the same slot; the lowest free one is taken.
Taking a slot holds an flock on the directory, so a clean-up that removes what free slots left behind
(`locked`, `held`) never races a slot being taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sandbox_service.errors import BackendUnavailableError


class MachineSlots:
    def __init__(self, directory: Path, limit: int, what: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.limit, self.what = limit, what

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """No slot is taken (by any service on this machine) while this is held."""
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def held(self) -> set[int]:
        """The slots taken now (call under `locked` for an answer that stays true)."""
        return {int(name) for name in os.listdir(self.dir) if name.isdigit()}

    def owner(self, index: int) -> str | None:
        try:
            return (self.dir / str(index)).read_text()
        except OSError:
            return None

    def acquire(self, owner: str) -> int:
        with self.locked():
            return self._acquire(owner)

    def _acquire(self, owner: str) -> int:
        # One directory read, then an O_EXCL open of the lowest free slot (was an open per slot from 0: a
        # thousand failed opens for the thousandth sandbox). Under the lock no slot is taken meanwhile; one
        # freed meanwhile is only missed until the next acquire.
        held = set(os.listdir(self.dir))
        for index in range(self.limit):
            if str(index) in held:
                continue
            try:
                fd = os.open(self.dir / str(index), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(owner)
            return index
        raise BackendUnavailableError(f"all {self.limit} {self.what} in {self.dir} are taken")

    def release(self, index: int, owner: str) -> None:
        path = self.dir / str(index)
        try:
            if path.read_text() == owner:
                path.unlink()
        except OSError:
            pass
