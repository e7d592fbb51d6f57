"""File operations of the agent, every one confined to the workspace directory, race-free.

A path is resolved against the workdir when relative, normalised, and must lie inside the workspace
lexically (no `..` escape, no absolute path elsewhere). It is then opened by the kernel in one step
*beneath* a fresh fd of the workspace (beneath.py: openat2 with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
or an fd-by-fd O_NOFOLLOW walk), so no symlink or `/proc/<pid>/fd` magic link swapped in by a process in
the sandbox can lead a read, write, listing, extraction or archive outside it. Writes never follow a
symlink as the final component; missing parents are made with mkdirat in verified parents. Archives are
checked member by member (tarfile's `data` filter: no absolute names, no `..`, no links out, no device
files) *before* anything is extracted, then extracted fd by fd, and archived fd by fd (no recursion).

Nothing on a proc filesystem is served, whatever path leads there (/proc/1, /proc/self, /dev/fd, an agent
thread's /proc/<tid>): the agent (PID 1) may read its own /proc entries, which no command can (it is
non-dumpable), and they show its fds, memory layout and settings; a command reads /proc as the kernel
lets it.

Errors are raised as `FileOpError(code, message)` with codes the client maps to
`sandbox_service.errors` types. Stdlib only: this module is copied into every sandbox.
"""

from __future__ import annotations

import errno
import io
import os
import stat

from sandbox_service.agent import beneath, protocol

# Directory levels archived at most (one fd per level is held while walking).
MAX_ARCHIVE_DEPTH = 512
# What a path itself can make mkdir fail with: the caller's request refused, never the agent's fault.
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.EINVAL, errno.EACCES, errno.EPERM, errno.EMLINK, errno.EROFS}


class FileOpError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Confinement:
    """`alias`: a logical workspace path (unisolated agents show their host directory as /workspace)."""

    def __init__(self, workspace: str, workdir: str, alias: str | None = None, note: str = ""):
        self.root = os.path.realpath(workspace)
        self.alias = alias.rstrip("/") if alias else None
        self.workdir = self.unalias(workdir)
        self.note = note  # appended to the refusal of a path outside

    def unalias(self, path: str) -> str:
        if self.alias and (path == self.alias or path.startswith(self.alias + "/")):
            return self.root + path[len(self.alias) :]
        return path

    def resolve(self, path: str) -> str:
        """The normalised absolute path, lexically inside the workspace (opened later beneath it)."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise FileOpError("invalid_request", f"invalid path {path!r}")
        joined = os.path.normpath(os.path.join(self.workdir, self.unalias(path)))
        if not self._inside(joined):
            raise FileOpError(
                "path_outside_sandbox",
                f"path {path!r} resolves to {joined!r}, outside the workspace {self.root!r}" + self.note,
            )
        return joined

    def relative(self, path: str) -> tuple[str, str]:
        """(absolute path, path relative to the workspace root; "" for the root itself)."""
        full = self.resolve(path)
        return full, os.path.relpath(full, self.root) if full != self.root else ""

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip("/") + "/")

    def root_fd(self) -> int:
        """A fresh O_PATH fd of the workspace (a workspace replaced by a symlink is refused)."""
        try:
            return beneath.open_root(self.root)
        except OSError as exc:
            raise FileOpError(
                "file_not_found" if exc.errno == errno.ENOENT else "path_outside_sandbox",
                f"the workspace {self.root!r} cannot be opened as a plain directory: {exc.strerror}",
            ) from exc

    def open(self, path: str, rel: str, flags: int, mode: int = 0o644, *, follow_last: bool = True) -> int:
        """Open `rel` beneath the workspace; escapes raise path_outside_sandbox, absence file_not_found."""
        root = self.root_fd()
        try:
            return _not_on_procfs(beneath.open_beneath(root, rel, flags, mode, follow_last=follow_last), path)
        except beneath.EscapeError as exc:
            raise FileOpError(
                "path_outside_sandbox",
                f"path {path!r} leads out of the workspace {self.root!r} (through a symlink or magic link): refused",
            ) from exc
        except FileNotFoundError as exc:
            raise _not_found(path, exc) from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP and not follow_last:
                raise FileOpError("path_outside_sandbox", f"{path!r} is a symlink; not written through") from exc
            if exc.errno == errno.ENOTDIR:
                raise FileOpError("invalid_request", f"{path!r}: a file is in the way of a directory") from exc
            if exc.errno == errno.EISDIR:
                raise FileOpError("invalid_request", f"{path!r} is a directory") from exc
            raise FileOpError("invalid_request", f"cannot open {path!r}: {exc.strerror}") from exc
        finally:
            os.close(root)

    def make_dirs(self, path: str, rel: str) -> int:
        """mkdir -p beneath the workspace; an O_PATH fd of the directory."""
        root = self.root_fd()
        try:
            return _not_on_procfs(beneath.make_dirs(root, rel), path)
        except beneath.EscapeError as exc:
            raise FileOpError(
                "path_outside_sandbox",
                f"path {path!r} leads out of the workspace {self.root!r} (through a symlink or magic link): refused",
            ) from exc
        except (NotADirectoryError, FileExistsError) as exc:
            raise FileOpError("invalid_request", f"cannot create {path!r}: a file is in the way") from exc
        except OSError as exc:
            if exc.errno not in _PATH_ERRNOS:
                raise
            raise FileOpError("invalid_request", f"cannot create {path!r}: {exc.strerror}") from exc
        finally:
            os.close(root)


def _not_on_procfs(fd: int, path: str) -> int:
    """`fd`, unless it is on a proc filesystem (closed then, and refused: see the module doc)."""
    try:
        refused = beneath.on_procfs(fd)
    except OSError:
        refused = True
    if refused:
        os.close(fd)
        raise FileOpError(
            "path_outside_sandbox",
            f"{path!r} is on /proc, the kernel's view of processes (the "
            "agent's own among them), not a file of the sandbox: file routes do not serve it; read "
            "it with a command",
        )
    return fd


def _not_found(path: str, exc: OSError) -> FileOpError:
    return FileOpError("file_not_found", f"{path}: {exc.strerror or 'no such file or directory'}")


def open_file(conf: Confinement, path: str, limit: int):
    """(binary file object, size) of a regular file, to be streamed; refused over `limit` bytes."""
    _, rel = conf.relative(path)
    fd = conf.open(path, rel, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a fifo must not hang the agent
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError("invalid_request", f"{path!r} is a directory; list it or use get_archive")
        if not stat.S_ISREG(st.st_mode):
            raise FileOpError("invalid_request", f"{path!r} is not a regular file")
        if st.st_size > limit:
            raise FileOpError(
                "too_large",
                f"{path!r} is {st.st_size} bytes, over the {limit}-byte download limit (max_download_bytes)",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_file(conf: Confinement, path: str, limit: int) -> bytes:
    f, size = open_file(conf, path, limit)
    with f:
        return f.read(size)


def spool(conf: Confinement):
    """An anonymous temporary file on the workspace's filesystem (O_TMPFILE: never visible, gone on
    close), so large archives cost the sandbox disk, not the agent's memory; /tmp as a fallback."""
    root = conf.root_fd()
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=root)
        return os.fdopen(fd, "w+b")
    except OSError:
        import tempfile

        return tempfile.TemporaryFile()
    finally:
        os.close(root)


def _write_into(dir_fd: int, name: str, path: str, data, mode: int | None) -> None:
    """Create/truncate `name` in the verified directory `dir_fd` (never through a symlink) and write `data`
    (bytes, or a binary file object read in chunks)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644 if mode is None else mode, dir_fd=dir_fd)
    except IsADirectoryError as exc:
        raise FileOpError("invalid_request", f"{path!r} is a directory") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileOpError("path_outside_sandbox", f"{path!r} is a symlink; not written through") from exc
        raise FileOpError("invalid_request", f"cannot write {path!r}: {exc.strerror}") from exc
    try:
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else iter(lambda: data.read(1 << 20), b"")
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_file(conf: Confinement, path: str, data: bytes | protocol.PayloadReader, mode: int | None) -> None:
    _, rel = conf.relative(path)
    if not rel:
        raise FileOpError("invalid_request", "cannot write the workspace directory itself")
    parent, name = os.path.split(rel)
    dir_fd = conf.make_dirs(path, parent)
    try:
        _write_into(dir_fd, name, path, data, mode)
    finally:
        os.close(dir_fd)


def _kind(st: os.stat_result) -> str:
    return (
        "symlink"
        if stat.S_ISLNK(st.st_mode)
        else "dir"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "other"
    )


def list_dir(conf: Confinement, path: str) -> list[dict]:
    full, rel = conf.relative(path)
    fd = conf.open(path, rel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = sorted(os.listdir(fd))
        entries = []
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            entries.append(
                {
                    "name": name,
                    "path": os.path.join(full, name),
                    "type": _kind(st),
                    "size": st.st_size,
                    "mtime": st.st_mtime,
                }
            )
        return entries
    finally:
        os.close(fd)


class ArchiveMemberRefused(Exception):
    """A member tarfile's `data` filter (or the fallback below) refuses."""


def data_filter(member, dest: str):
    """tarfile's `data` filter where this Python has it (3.11.4+, 3.12+), else the same checks here.

    The agent runs on whatever Python a sandbox has: in Kubernetes pods the injected one, which can be
    older (Debian bookworm's 3.11.2 has no filters: forks of a snapshot failed there with AttributeError)."""
    import tarfile

    if hasattr(tarfile, "data_filter"):
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise ArchiveMemberRefused(str(exc)) from exc
    return _data_filter_fallback(member, dest)


def _data_filter_fallback(member, dest: str):
    """What `tarfile.data_filter` checks, for Pythons without it: names and link targets stay inside
    `dest`, no device or FIFO files, no setuid/setgid/sticky or group/other-write bits, no owners."""
    import copy

    dest = os.path.realpath(dest)
    target = os.path.realpath(os.path.join(dest, member.name))
    if os.path.isabs(member.name) or os.path.commonpath([target, dest]) != dest:
        raise ArchiveMemberRefused(f"{member.name!r} would be extracted outside the destination")
    if member.ischr() or member.isblk() or member.isfifo():
        raise ArchiveMemberRefused(f"{member.name!r} is a special file")
    if member.issym() or member.islnk():
        base = os.path.dirname(target) if member.issym() else dest
        link = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.isabs(member.linkname) or os.path.commonpath([link, dest]) != dest:
            raise ArchiveMemberRefused(f"{member.name!r} links outside the destination ({member.linkname!r})")
    checked = copy.copy(member)
    checked.uid = checked.gid = None
    checked.uname = checked.gname = None
    if member.isreg() or member.islnk():
        checked.mode = (member.mode & 0o755) | 0o600  # owner read/write; execute kept where it was
    elif member.isdir() or member.issym():
        checked.mode = None  # as the data filter: directories and links get the default mode
    return checked


def put_archive(conf: Confinement, path: str, data) -> int:
    """Extract a (gzipped) tar (bytes or a binary file object) into `path`, all members checked first."""
    import tarfile

    full, rel = conf.relative(path)
    if isinstance(data, (bytes, bytearray)):
        fileobj = io.BytesIO(data)
    else:  # a streamed payload: spooled to disk, since every member is checked before any is extracted
        fileobj = spool(conf)
        for chunk in iter(lambda: data.read(1 << 20), b""):
            fileobj.write(chunk)
        fileobj.seek(0)
    try:
        try:
            tar = tarfile.open(fileobj=fileobj, mode="r:*")
        except tarfile.TarError as exc:
            raise FileOpError("invalid_request", f"not a (gzipped) tar archive: {exc}") from exc
        with tar:
            checked = []
            for member in tar.getmembers():
                if member.name.startswith("/") or (member.islnk() and member.linkname.startswith("/")):
                    raise FileOpError(
                        "path_outside_sandbox",
                        f"archive member {member.name!r} has an absolute "
                        "path; archives must hold relative names; nothing was extracted",
                    )
                try:
                    checked.append(data_filter(member, full))
                except ArchiveMemberRefused as exc:
                    raise FileOpError(
                        "path_outside_sandbox", f"archive member {member.name!r} refused: {exc}; nothing was extracted"
                    ) from exc
            dest_fd = conf.make_dirs(path, rel)
            try:
                for member in checked:
                    _extract(conf, tar, member, dest_fd, path)
            finally:
                os.close(dest_fd)
    finally:
        fileobj.close()
    return len(checked)


def _extract(conf: Confinement, tar, member, dest_fd: int, path: str) -> None:
    """One checked member, created fd-relative beneath the destination (never through a swapped link)."""
    name = os.path.normpath(member.name)
    shown = f"{path}/{name}"
    if name in (".", ""):
        return
    parent, base = os.path.split(name)
    try:
        pfd = beneath.make_dirs(dest_fd, parent)
    except beneath.EscapeError as exc:
        raise FileOpError(
            "path_outside_sandbox",
            f"archive member {member.name!r} would be written through a symlink outside the workspace",
        ) from exc
    try:
        if member.isdir():
            try:
                os.mkdir(base, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            dfd = beneath.open_beneath(pfd, base, os.O_RDONLY | os.O_DIRECTORY, follow_last=False)
            try:
                if member.mode is not None:  # the data filter keeps no mode for directories
                    os.fchmod(dfd, member.mode | 0o700)
            finally:
                os.close(dfd)
        elif member.isfile():
            src = tar.extractfile(member)
            _write_into(pfd, base, shown, src, member.mode)
        elif member.issym():
            _unlink_quiet(pfd, base)
            os.symlink(member.linkname, base, dir_fd=pfd)
        elif member.islnk():
            lparent, lbase = os.path.split(os.path.normpath(member.linkname))
            src_fd = beneath.open_beneath(dest_fd, lparent, os.O_PATH | os.O_DIRECTORY)
            try:
                _unlink_quiet(pfd, base)
                os.link(lbase, base, src_dir_fd=src_fd, dst_dir_fd=pfd, follow_symlinks=False)
            finally:
                os.close(src_fd)
        elif member.isfifo():
            os.mkfifo(base, member.mode, dir_fd=pfd)
    except beneath.EscapeError as exc:
        raise FileOpError("path_outside_sandbox", f"archive member {member.name!r} leads out of the workspace") from exc
    except OSError as exc:
        raise FileOpError("invalid_request", f"cannot extract {member.name!r}: {exc.strerror}") from exc
    finally:
        os.close(pfd)


def _unlink_quiet(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def get_archive(conf: Confinement, path: str) -> bytes:
    """A tar.gz of `path` (a directory's contents, or one file), walked fd by fd without recursion."""
    buf = io.BytesIO()
    write_archive(conf, path, buf)
    return buf.getvalue()


def spool_archive(conf: Confinement, path: str, limit: int):
    """(file object at offset 0, size) of the tar.gz of `path`, spooled to disk for streaming."""
    f = spool(conf)
    try:
        write_archive(conf, path, f)
        size = f.tell()
        if size > limit:
            raise FileOpError(
                "too_large",
                f"the archive of {path!r} is {size} bytes, over the {limit}-byte "
                "download limit (max_download_bytes); archive a subdirectory",
            )
        f.seek(0)
        return f, size
    except BaseException:
        f.close()
        raise


def write_archive(conf: Confinement, path: str, out) -> None:
    import tarfile

    _, rel = conf.relative(path)
    top = conf.open(path, rel, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a fifo must not hang the agent
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        st = os.fstat(top)
        if not stat.S_ISDIR(st.st_mode):
            try:
                _add_fd(tar, top, st, os.path.basename(rel))
            finally:
                os.close(top)
            return
        # Depth-first with an explicit stack of (dir fd, archive prefix, remaining names): no recursion,
        # and every child is opened relative to its verified parent with O_NOFOLLOW.
        stack = [(top, "", sorted(os.listdir(top)))]
        try:
            while stack:
                dfd, prefix, names = stack[-1]
                if not names:
                    os.close(dfd)
                    stack.pop()
                    continue
                name = names.pop(0)
                arc = prefix + name
                try:
                    cst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(cst.st_mode):
                    info = _info(arc, cst, tarfile.SYMTYPE)
                    info.linkname = os.readlink(name, dir_fd=dfd)
                    tar.addfile(info)
                elif stat.S_ISDIR(cst.st_mode):
                    if len(stack) >= MAX_ARCHIVE_DEPTH:
                        raise FileOpError(
                            "invalid_request",
                            f"{path!r} is nested deeper than {MAX_ARCHIVE_DEPTH} "
                            "directories; archive a subdirectory instead",
                        )
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    tar.addfile(_info(arc, os.fstat(sub), tarfile.DIRTYPE))
                    stack.append((sub, arc + "/", sorted(os.listdir(sub))))
                elif stat.S_ISREG(cst.st_mode):
                    try:
                        ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
                    except OSError:
                        continue
                    _add_fd(tar, ffd, os.fstat(ffd), arc)
                    os.close(ffd)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)


def _info(name: str, st: os.stat_result, kind: bytes):
    import tarfile

    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    return info


def _add_fd(tar, fd: int, st: os.stat_result, name: str) -> None:
    import tarfile

    if not stat.S_ISREG(st.st_mode):
        return  # devices, fifos, sockets: never archived (a fifo would block the agent)
    info = _info(name, st, tarfile.REGTYPE)
    info.size = st.st_size
    with os.fdopen(os.dup(fd), "rb") as f:
        tar.addfile(info, _Exactly(f, st.st_size))


class _Exactly:
    """A file object that yields exactly `size` bytes (a file growing or shrinking meanwhile must not
    corrupt the archive: tarfile trusts TarInfo.size)."""

    def __init__(self, f, size: int):
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n) if n else b""
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        return data
