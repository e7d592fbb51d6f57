"""Removing and measuring directory trees a sandbox may have made hostile, without recursion.

A sandbox can leave a 10,000-level directory chain, millions of files, directories with mode 000 or
symlinks everywhere. `shutil.rmtree` and `Path.rglob` recurse (RecursionError near 1,000 levels on
Python 3.11) and `os.walk` builds paths that outgrow PATH_MAX, so a DELETE used to fail half-way and a
restart then refused the state dir. Here:

- `remove_tree` walks with one directory fd at a time: each directory is read once (files unlinked at
  once, subdirectories remembered by name), entered with
  O_NOFOLLOW, and left through ".." after checking that ".." is the directory it came from (a tree
  that changes under us is refused, never followed). Symlinks are unlinked, never followed.
- `remove_or_quarantine` falls back to moving a tree it cannot remove (a busy mount, an I/O error)
  into a quarantine directory, and says which it did, so that start-up and deletes always go on.
- `tree_size` sums regular-file sizes the same way, one fd at a time, also without recursion.
- `shift_owners` hands a tree from one sandbox's user-id range to another's the same way (a snapshot
  saved as a layer owned from id 0).
- `overlay_onto` folds one overlay layer onto another as overlayfs shows them (a chain of snapshot
  layers grown too deep), walking both trees in step the same way.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeChangedError(OSError):
    """The tree changed under the walk (a parent is no longer the directory we came from)."""


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _clear_dir(fd: int) -> list[str]:
    """Unlink every non-directory in `fd`; return its subdirectories (removed after they are cleared:
    a speculative rmdir of a non-empty one costs as much as a real one on a journalled filesystem)."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.name)
                continue
            try:
                os.unlink(entry.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                subdirs.append(entry.name)
    return subdirs


def _walk(
    cur: int,
    path: str,
    scan: Callable[[int], list[str]],
    *,
    skip: type[OSError],
    doing: str,
    left: Callable[[int, str, list[str]], None] | None = None,
) -> None:
    """Depth-first from the directory fd `cur` (the walk closes it), one directory fd open at a time.

    `scan(fd)` handles a directory's entries and returns the subdirectories to enter; each is entered with
    O_NOFOLLOW (one that raises `skip` on opening is passed over) and left through ".." after checking
    that ".." is the directory it came from. `left(parent_fd, name, pending)` then runs, with the
    parent's subdirectories still to enter (it may add `name` back to enter it again)."""
    # One level per directory entered: (its name in the parent, the parent's identity, the parent's
    # remaining subdirectories).
    stack: list[tuple[str, tuple[int, int], list[str]]] = []
    try:
        pending = scan(cur)
        while True:
            if pending:
                name = pending.pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=cur)
                except skip:
                    continue
                stack.append((name, _ident(cur), pending))
                os.close(cur)
                cur = child
                pending = scan(cur)
                continue
            if not stack:
                return
            name, parent_id, pending = stack.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = parent
            if _ident(cur) != parent_id:
                raise TreeChangedError(errno.ESTALE, f"{path}: the tree changed while it was {doing}")
            if left is not None:
                left(cur, name, pending)
    finally:
        os.close(cur)


def remove_tree(path: str | os.PathLike) -> None:
    """`rm -rf path` for trees of any depth and size; a missing path is fine; raises OSError on failure."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return

    def remove_cleared(parent: int, name: str, pending: list[str]) -> None:
        try:
            os.rmdir(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
            pending.append(name)  # something appeared meanwhile: clear it again

    _walk(os.open(path, _DIR_FLAGS), path, _clear_dir, skip=FileNotFoundError, doing="removed", left=remove_cleared)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def remove_or_quarantine(path: str | os.PathLike, quarantine_dir: str | os.PathLike) -> str | None:
    """Remove `path`; if that fails, move it into `quarantine_dir` (same filesystem) and return where it
    went. Returns None when removed. Raises only if neither works."""
    try:
        remove_tree(path)
        return None
    except OSError as exc:
        error = exc
    qdir = Path(quarantine_dir)
    qdir.mkdir(parents=True, exist_ok=True)
    target = qdir / f"{Path(path).name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.rename(path, target)
    log.warning("could not remove %s (%s); moved it to %s for inspection", path, error, target)
    return str(target)


def tree_size(path: str | os.PathLike) -> int:
    """Total bytes of the regular files under `path` (symlinks not followed): one directory fd at a time,
    like `remove_tree`, so neither depth nor width exhausts the stack or the fd table."""
    try:
        top = os.open(os.fspath(path), _DIR_FLAGS)
    except OSError:
        return 0
    total = 0

    def scan(fd: int) -> list[str]:
        nonlocal total
        subdirs = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
        return subdirs

    _walk(top, os.fspath(path), scan, skip=OSError, doing="measured")
    return total


def shift_owners(path: str | os.PathLike, old: int, new: int, size: int) -> None:
    """Hand the files of `path` owned by ids old..old+size-1 to new..new+size-1 (a snapshot taken in one
    sandbox's id range, forked or restored into another's), keeping setuid/setgid bits; one directory fd at
    a time, symlinks changed themselves and never followed."""

    def shifted(i: int) -> int:
        return i - old + new if old <= i < old + size else i

    def shift(st: os.stat_result, chown: Callable[[int, int], None], chmod: Callable[[int], None]) -> None:
        uid, gid = shifted(st.st_uid), shifted(st.st_gid)
        if (uid, gid) != (st.st_uid, st.st_gid):
            chown(uid, gid)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                chmod(stat.S_IMODE(st.st_mode))  # chown clears them

    def scan(fd: int) -> list[str]:
        subdirs = []
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            shift(
                st,
                lambda uid, gid: os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False),
                lambda mode: os.chmod(name, mode, dir_fd=fd),
            )
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(name)
        return subdirs

    top = os.open(os.fspath(path), _DIR_FLAGS)
    shift(os.fstat(top), lambda uid, gid: os.fchown(top, uid, gid), lambda mode: os.fchmod(top, mode))
    _walk(top, os.fspath(path), scan, skip=FileNotFoundError, doing="handed to another id range")


OPAQUE_XATTR = "trusted.overlay.opaque"


def is_whiteout(st: os.stat_result) -> bool:
    """An overlay whiteout: a character device 0/0 in a layer hides the name in the layers beneath."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(dir_fd: int, name: str) -> bool:
    """The directory `name` in `dir_fd` hides the layers beneath (overlayfs's trusted.overlay.opaque)."""
    try:
        return os.getxattr(f"/proc/self/fd/{dir_fd}/{name}", OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def overlay_onto(layer: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Apply overlay layer `layer` on top of directory `dest` as overlayfs would show it: `dest` then holds
    the two layers as one (for folding a chain of snapshot layers; whiteouts and opaque directories are kept,
    so the result still hides what they hid beneath it). Needs the mount to have made no redirects or
    metacopy files (the local backend mounts with both off).

    First every name of `dest` that `layer` replaces rather than merges (a whiteout, an opaque directory, a
    directory over a non-directory or the reverse) is removed, walking both trees in step one directory fd
    each at a time (no recursion, no path longer than a name); then `cp -a --remove-destination` copies the
    layer over, merging directories, replacing files and keeping xattrs, owners and whiteouts."""
    layer_path, dest_path = os.fspath(layer), os.fspath(dest)
    cur_layer, cur_dest = os.open(layer_path, _DIR_FLAGS), os.open(dest_path, _DIR_FLAGS)

    def scan() -> list[str]:
        both = []
        with os.scandir(cur_layer) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            try:
                here = os.stat(name, dir_fd=cur_layer, follow_symlinks=False)
                there = os.stat(name, dir_fd=cur_dest, follow_symlinks=False)
            except FileNotFoundError:
                continue
            merges = stat.S_ISDIR(here.st_mode) and stat.S_ISDIR(there.st_mode) and not _opaque(cur_layer, name)
            if merges:
                both.append(name)
            else:
                remove_tree(f"/proc/self/fd/{cur_dest}/{name}")
        return both

    stack: list[list[str]] = []
    try:
        pending = scan()
        while True:
            if pending:
                name = pending.pop()
                child_layer = os.open(name, _DIR_FLAGS, dir_fd=cur_layer)
                try:
                    child_dest = os.open(name, _DIR_FLAGS, dir_fd=cur_dest)
                except BaseException:
                    os.close(child_layer)
                    raise
                os.close(cur_layer)
                os.close(cur_dest)
                cur_layer, cur_dest = child_layer, child_dest
                stack.append(pending)
                pending = scan()
                continue
            if not stack:
                break
            pending = stack.pop()
            parent_layer = os.open("..", _DIR_FLAGS, dir_fd=cur_layer)
            os.close(cur_layer)
            cur_layer = parent_layer
            parent_dest = os.open("..", _DIR_FLAGS, dir_fd=cur_dest)
            os.close(cur_dest)
            cur_dest = parent_dest
    finally:
        os.close(cur_layer)
        os.close(cur_dest)
    proc = subprocess.run(
        ["cp", "-a", "--remove-destination", f"{layer_path}/.", dest_path], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise OSError(errno.EIO, f"copying layer {layer_path} onto {dest_path} failed: {proc.stderr.strip()}")
