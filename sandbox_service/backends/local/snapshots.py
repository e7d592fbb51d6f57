"""Snapshots of local sandboxes as read-only overlay layers: a fork or a restore mounts them, copying nothing.

    <state>/snapshots/<snapshot_id>/meta.json   the image, workdir, size and the layers, top first
    <state>/layers/<layer>/                     one saved upper layer, its files owned from id 0

Saving copies the sandbox's upper layer (it goes on changing) into a new layer and hands its files from the
sandbox's id range to 0..65535, so any sandbox can mount it through its own user namespace (an idmapped
mount, like the image beneath). A snapshot of a sandbox that runs on layers names them beneath its own, so
a chain of forks saves only what each changed. A chain deeper than `max_layers` is folded into one layer at
save (fstree.overlay_onto), so a mount never stacks more than that.

A layer outlives the snapshot that made it while a sandbox has it mounted (`pin`) or another snapshot
names it: deleting a snapshot removes its name at once and its layers when the last user is gone.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from pathlib import Path

from sandbox_service.backends.fstree import overlay_onto, remove_or_quarantine, shift_owners, tree_size
from sandbox_service.backends.local.rootfs import copy_tree
from sandbox_service.errors import InvalidRequestError, SnapshotNotFoundError


class SnapshotStore:
    def __init__(self, state_dir: Path, max_layers: int):
        self.root = state_dir / "snapshots"
        self.layers_root = state_dir / "layers"
        self.quarantine = state_dir / "quarantine"
        self.max_layers = max_layers
        for d in (self.root, self.layers_root):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pins: Counter[str] = Counter()  # layer -> how many running sandboxes have it mounted
        self._named: Counter[str] = Counter()  # layer -> how many snapshots name it (this store writes them all)
        for entry in self.root.iterdir():
            self._named.update(self._layers_of(entry))

    def path(self, snapshot_id: str) -> Path:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise InvalidRequestError(f"invalid snapshot id {snapshot_id!r}")
        return self.root / snapshot_id

    def layer(self, name: str) -> Path:
        return self.layers_root / name

    def save(
        self, snapshot_id: str, upper: Path, meta: dict, *, beneath: list[str], owners: int | None, id_range: int
    ) -> int:
        """Save `upper` as a snapshot over the layers `beneath` (top first; the caller keeps them pinned
        meanwhile), its files handed from host ids owners..owners+id_range-1 to 0.. (None: kept as they are);
        returns the bytes it added."""
        dest = self.path(snapshot_id)
        if dest.exists():
            raise InvalidRequestError(f"snapshot {snapshot_id!r} already exists")
        name = uuid.uuid4().hex
        tmp = self.layers_root / f".{name}"  # dot names are never collected: not yet a layer
        try:
            tmp.mkdir()
            layers = [name, *beneath]
            if len(layers) > self.max_layers:  # fold the whole chain into this one layer, bottom first
                for below in reversed(beneath):
                    overlay_onto(self.layer(below), tmp)
                staged = self.layers_root / f".{name}.upper"
                staged.mkdir()
                try:
                    self._copy(upper, staged, owners, id_range)
                    overlay_onto(staged, tmp)
                finally:
                    remove_or_quarantine(staged, self.quarantine)
                layers = [name]
            else:
                self._copy(upper, tmp, owners, id_range)
            added = tree_size(tmp)
            with self._lock:
                if dest.exists():
                    raise InvalidRequestError(f"snapshot {snapshot_id!r} already exists")
                tmp.rename(self.layer(name))
                dest.mkdir()
                (dest / "meta.json").write_text(json.dumps({**meta, "layers": layers, "size_bytes": added}))
                self._named.update(layers)
        except BaseException:  # a copy that failed part-way (a tree cp cannot copy, a full disk) leaves nothing
            remove_or_quarantine(tmp, self.quarantine)
            raise
        return added

    @staticmethod
    def _copy(upper: Path, dest: Path, owners: int | None, id_range: int) -> None:
        copy_tree(upper, dest)
        if owners is not None and owners != 0:
            shift_owners(dest, owners, 0, id_range)

    def meta(self, snapshot_id: str) -> dict:
        try:
            return json.loads((self.path(snapshot_id) / "meta.json").read_text())
        except OSError as exc:
            raise SnapshotNotFoundError(f"snapshot {snapshot_id!r} does not exist") from exc

    def pin(self, snapshot_id: str) -> list[str]:
        """The layers of `snapshot_id` (top first), kept on disk until `unpin`: a sandbox mounts them."""
        with self._lock:
            layers = list(self.meta(snapshot_id)["layers"])
            self._pins.update(layers)
        return layers

    def unpin(self, layers: list[str]) -> None:
        """A sandbox no longer mounts `layers`; those no snapshot names either are removed."""
        if not layers:
            return
        with self._lock:
            self._pins.subtract(layers)
            self._pins = +self._pins
        self._collect()

    def delete(self, snapshot_id: str) -> None:
        path = self.path(snapshot_id)
        with self._lock:
            layers = self._layers_of(path)
            remove_or_quarantine(path, self.quarantine)
            self._named.subtract(layers)
            self._named = +self._named
        self._collect()

    @staticmethod
    def _layers_of(snapshot_dir: Path) -> list[str]:
        try:
            return list(json.loads((snapshot_dir / "meta.json").read_text())["layers"])
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _collect(self) -> None:
        with self._lock:  # renamed under the lock (no pin can take them), removed outside it
            keep = set(self._named) | set(self._pins)
            unused = [p for p in self.layers_root.iterdir() if not p.name.startswith(".") and p.name not in keep]
            gone = [p.rename(p.with_name(f".gone-{p.name}")) for p in unused]
        for p in gone:
            remove_or_quarantine(p, self.quarantine)

    def clear(self) -> list[str]:
        """Remove every snapshot on disk (at start: the registry of the service that made them is gone,
        so they can never be used again) and every layer no running sandbox mounts; returns their ids."""
        leftovers = sorted(p.name for p in self.root.iterdir())
        for name in leftovers:
            remove_or_quarantine(self.root / name, self.quarantine)
        with self._lock:
            self._named.clear()
            unused = [p for p in self.layers_root.iterdir() if p.name not in self._pins]
        for p in unused:
            remove_or_quarantine(p, self.quarantine)
        return leftovers
