"""File operations of the agent, every one confined to the workspace directory.

A path is resolved against the workdir when relative, normalised, and must lie inside the
workspace both lexically (no `..` escape, no absolute path elsewhere) and after resolving symlinks
(no link pointing out). The final component is opened with O_NOFOLLOW so a link swapped in after the
check is not followed. Archives are checked member by member (tarfile's `data` filter: no absolute
names, no `..`, no links out, no device files) *before* anything is extracted.

Errors are raised as `FileOpError(code, message)` with codes the client maps to
`sandbox_service.errors` types. Stdlib only: this module is copied into every sandbox.
"""

from __future__ import annotations

import io
import os
import stat


class FileOpError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Confinement:
    """`alias`: a logical workspace path (unisolated agents show their host directory as /workspace)."""

    def __init__(self, workspace: str, workdir: str, alias: str | None = None):
        self.root = os.path.realpath(workspace)
        self.alias = alias.rstrip("/") if alias else None
        self.workdir = self.unalias(workdir)

    def unalias(self, path: str) -> str:
        if self.alias and (path == self.alias or path.startswith(self.alias + "/")):
            return self.root + path[len(self.alias):]
        return path

    def resolve(self, path: str) -> str:
        if not isinstance(path, str) or not path or "\x00" in path:
            raise FileOpError("invalid_request", f"invalid path {path!r}")
        joined = os.path.normpath(os.path.join(self.workdir, self.unalias(path)))
        if not self._inside(joined):
            raise FileOpError("path_outside_sandbox",
                              f"path {path!r} resolves to {joined!r}, outside the workspace {self.root!r}")
        real = os.path.realpath(joined)
        if not self._inside(real):
            raise FileOpError("path_outside_sandbox",
                              f"path {path!r} leads through a symlink to {real!r}, outside the workspace "
                              f"{self.root!r}")
        return joined

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip("/") + "/")


def _not_found(path: str, exc: OSError) -> FileOpError:
    return FileOpError("file_not_found", f"{path}: {exc.strerror or 'no such file or directory'}")


def read_file(conf: Confinement, path: str, limit: int) -> bytes:
    full = conf.resolve(path)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise _not_found(path, exc) from exc
    except OSError as exc:
        raise FileOpError("invalid_request", f"cannot read {path!r}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError("invalid_request", f"{path!r} is a directory; list it or use get_archive")
        if st.st_size > limit:
            raise FileOpError("invalid_request", f"{path!r} is {st.st_size} bytes, over the {limit}-byte "
                              "read limit; download it as an archive instead")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file(conf: Confinement, path: str, data: bytes, mode: int | None) -> None:
    full = conf.resolve(path)
    if full == conf.root:
        raise FileOpError("invalid_request", "cannot write the workspace directory itself")
    parent = os.path.dirname(full)
    try:
        os.makedirs(parent, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise FileOpError("invalid_request", f"cannot create parent of {path!r}: a file is in the way") from exc
    conf.resolve(parent)  # makedirs may have followed a link created meanwhile
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(full, flags, 0o644 if mode is None else mode)
    except IsADirectoryError as exc:
        raise FileOpError("invalid_request", f"{path!r} is a directory") from exc
    except OSError as exc:
        raise FileOpError("invalid_request", f"cannot write {path!r}: {exc.strerror}") from exc
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def list_dir(conf: Confinement, path: str) -> list[dict]:
    full = conf.resolve(path)
    try:
        names = sorted(os.listdir(full))
    except FileNotFoundError as exc:
        raise _not_found(path, exc) from exc
    except NotADirectoryError as exc:
        raise FileOpError("invalid_request", f"{path!r} is not a directory") from exc
    entries = []
    for name in names:
        child = os.path.join(full, name)
        try:
            st = os.lstat(child)
        except OSError:
            continue
        kind = ("symlink" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
                else "file" if stat.S_ISREG(st.st_mode) else "other")
        entries.append({"name": name, "path": child, "type": kind, "size": st.st_size, "mtime": st.st_mtime})
    return entries


def put_archive(conf: Confinement, path: str, data: bytes) -> int:
    import tarfile

    dest = conf.resolve(path)
    os.makedirs(dest, exist_ok=True)
    conf.resolve(dest)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except tarfile.TarError as exc:
        raise FileOpError("invalid_request", f"not a (gzipped) tar archive: {exc}") from exc
    with tar:
        members = tar.getmembers()
        checked = []
        for member in members:
            if member.name.startswith("/") or (member.islnk() and member.linkname.startswith("/")):
                raise FileOpError("path_outside_sandbox", f"archive member {member.name!r} has an absolute "
                                  "path; archives must hold relative names; nothing was extracted")
            try:
                checked.append(tarfile.data_filter(member, dest))
            except tarfile.FilterError as exc:
                raise FileOpError("path_outside_sandbox",
                                  f"archive member {member.name!r} refused: {exc}; nothing was extracted") from exc
        for member in checked:
            real_parent = os.path.realpath(os.path.join(dest, os.path.dirname(member.name)))
            if not conf._inside(real_parent):
                raise FileOpError("path_outside_sandbox",
                                  f"archive member {member.name!r} would be written through a symlink "
                                  "outside the workspace")
        tar.extractall(dest, members=checked, filter="data")
    return len(checked)


def get_archive(conf: Confinement, path: str) -> bytes:
    import tarfile

    full = conf.resolve(path)
    if not os.path.lexists(full):
        raise FileOpError("file_not_found", f"{path}: no such file or directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        if os.path.isdir(full):
            for name in sorted(os.listdir(full)):
                tar.add(os.path.join(full, name), arcname=name)
        else:
            tar.add(full, arcname=os.path.basename(full))
    return buf.getvalue()
