"""Opening paths *beneath* a directory with no symlink or magic-link escape, free of check-then-use races.

The agent holds fds a sandbox must never reach (its cgroup directories, opened before the pivot) and,
as the namespace's PID 1, may follow its own `/proc/1/fd/N` magic links. Checking a resolved path and
then opening the unresolved one lets a process in the sandbox swap a directory for a symlink in
between. Instead every open here is resolved by the kernel in one step, relative to a directory fd:

- `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` (Linux >= 5.6): symlinks are followed only while
  they stay beneath the directory (an absolute symlink or a `..` out of it fails with EXDEV), and
  `/proc/<pid>/fd/N`-style magic links are never followed (ELOOP);
- without openat2 (older kernels, a seccomp filter that refuses it): an fd-by-fd walk, one component
  at a time with O_NOFOLLOW, that refuses *every* symlink on the way (stricter, never looser).

`open_dir_path` opens a directory by an absolute path with no magic link (exec `cwd`, which may lie
anywhere in the sandbox's own root). Stdlib only (ctypes): this module is copied into every sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable

RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08
_SYS_OPENAT2 = 437  # the same number on every architecture (unified syscall table since 5.6)
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class EscapeError(OSError):
    """The path leaves the directory (symlink out, absolute symlink, magic link, '..')."""


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_state = {"openat2": True}


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)  # else EINVAL
    fd = _syscall(
        _SYS_OPENAT2, ctypes.c_int(dirfd), os.fsencode(path), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err in (errno.EXDEV, errno.ELOOP) and resolve & (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS):
            raise EscapeError(
                err, f"{path!r} leads out of the directory (through a symlink, an absolute symlink or a magic link)"
            )
        raise OSError(err, os.strerror(err), path)
    return fd


def has_openat2() -> bool:
    if _state["openat2"]:
        try:
            os.close(_openat2(_AT_FDCWD, "/", os.O_PATH | os.O_DIRECTORY, 0, RESOLVE_NO_MAGICLINKS))
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                _state["openat2"] = False
    return _state["openat2"]


def _chain(cur: int, parts: list[str], open_next: Callable[[int, int, str], int]) -> int:
    """The fd reached one component at a time: `open_next(fd, i, name)` opens `parts[i]` from the fd of
    the components before it, starting at `cur` (owned: closed here). Each fd is closed once the next is
    open, and the one in hand on any error, so neither a walk nor a failure leaks fds."""
    try:
        for i, name in enumerate(parts):
            nxt = open_next(cur, i, name)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def _walk(dirfd: int, parts: list[str], flags: int, mode: int) -> int:
    """Fallback: open each component with O_NOFOLLOW relative to the previous one; no symlink followed."""

    def open_next(cur: int, i: int, name: str) -> int:
        last = i == len(parts) - 1
        f = (flags if last else os.O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            nxt = os.open(name, f, mode, dir_fd=cur)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(cur, name):
                raise EscapeError(
                    errno.ELOOP,
                    f"{'/'.join(parts)!r} goes through the symlink {name!r} (not followed on this kernel: no openat2)",
                ) from None
            raise
        if last and flags & os.O_PATH and _is_link(nxt, ""):
            os.close(nxt)
            raise EscapeError(errno.ELOOP, f"{'/'.join(parts)!r} is a symlink")
        return nxt

    return _chain(os.dup(dirfd), parts, open_next)


def _is_link(dirfd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False) if name else os.fstat(dirfd)
    except OSError:
        return False
    return stat.S_ISLNK(st.st_mode)


def open_beneath(dirfd: int, rel: str, flags: int, mode: int = 0o644, *, follow_last: bool = True) -> int:
    """An fd for `rel` (relative, normalised, no '..') beneath `dirfd`; raises EscapeError on any escape.

    `follow_last=False` also refuses a symlink as the final component (writes never go through one)."""
    parts = [p for p in rel.split("/") if p and p != "."]
    if any(p == ".." for p in parts):
        raise EscapeError(errno.EXDEV, f"{rel!r} contains '..'")
    if not parts:
        # The root itself: an O_PATH duplicate, or "." reopened with the flags asked for (a listing
        # needs a readable fd; "." is never a link, so this cannot escape).
        return os.dup(dirfd) if flags & os.O_PATH else os.open(".", flags, mode, dir_fd=dirfd)
    if not follow_last:
        flags |= os.O_NOFOLLOW
    if has_openat2():
        return _openat2(dirfd, "/".join(parts), flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    return _walk(dirfd, parts, flags, mode)


PROC_SUPER_MAGIC = 0x9FA0


class _Statfs(ctypes.Structure):  # struct statfs: f_type first; the rest only sized generously
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 248)]


def on_procfs(fd: int) -> bool:
    """Whether `fd` is a file or directory of a proc filesystem (the kernel's view of processes)."""
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return buf.f_type == PROC_SUPER_MAGIC


def open_root(path: str) -> int:
    """An O_PATH fd for the confinement root itself, refusing a root that was replaced by a symlink."""
    if has_openat2():
        return _openat2(_AT_FDCWD, path, os.O_PATH | os.O_DIRECTORY, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_dir_path(path: str) -> int:
    """An O_PATH fd for the absolute directory `path`, never through a magic link (/proc/<pid>/fd/N, ...)."""
    if has_openat2():
        return _openat2(_AT_FDCWD, path, os.O_PATH | os.O_DIRECTORY, 0, RESOLVE_NO_MAGICLINKS)
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _walk(fd, [p for p in path.split("/") if p], os.O_PATH | os.O_DIRECTORY, 0)
    finally:
        os.close(fd)


def make_dirs(dirfd: int, rel: str) -> int:
    """Like `mkdir -p rel` beneath `dirfd`, race-free; returns an O_PATH fd of the last directory.

    Each missing directory is made with mkdirat in its verified parent (mkdirat never follows a link),
    and every component is then opened beneath `dirfd`, so a link swapped in meanwhile is refused."""
    parts = [p for p in rel.split("/") if p and p != "."]

    def open_next(cur: int, i: int, name: str) -> int:
        sub = "/".join(parts[: i + 1])
        try:
            return open_beneath(dirfd, sub, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o755, dir_fd=cur)
            except FileExistsError:
                pass
            return open_beneath(dirfd, sub, os.O_PATH | os.O_DIRECTORY)

    return _chain(open_beneath(dirfd, "", os.O_PATH | os.O_DIRECTORY), parts, open_next)
