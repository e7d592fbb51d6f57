"""The root a sandbox without an image sees: an allowlist of host paths, not the host minus masks.

`build_root(state_dir, allowlist)` makes (once per content, under `state_dir/root/<digest>`) the
overlay's lower layer for image-less sandboxes: a skeleton holding
- empty mount points for the allowlisted host directories (bound read-only over them at boot, see
  agent/boot.py), symlinks where the host has symlinks (`/bin -> usr/bin` on merged-/usr systems);
- a sanitised copy of /etc: only files and directories every host user may read (so no shadow,
  gshadow, ssh host private keys, sudoers, ssl/private), minus ssh host keys and the service's own
  /etc/orchard;
- empty /root, /home, /workspace, /var/tmp, /opt and the mount points boot.py fills (/proc, /dev, ...).
Nothing else of the host is in the sandbox's view: no home directories, no project checkout, no /var,
/srv, /mnt, no state dir (other sandboxes' layers and snapshots), unless an operator allowlists it.

The skeleton is a copy, so a sandbox writes /etc/hosts into its own upper layer; the allowlisted
directories are read-only binds (a write there gives EROFS).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

SKELETON_DIRS = ("proc", "dev", "sys", "tmp", "run", "home", "workspace", "var/tmp", "opt", ".orchard/agent")
# World-readable but still not the sandbox's business.
ETC_SKIPPED = ("orchard", "ssh/ssh_host_", "machine-id")


def service_python_dir() -> str:
    """The service interpreter's directory (its venv's `bin`) by its resolved path, as a sandbox sees it.

    The root binds resolved paths, so a symlink leading to the venv, or to any directory above it
    (`.venv -> /elsewhere/venv`, `/tmp/proj -> /data/proj`), does not exist inside; the resolved one does.
    The directory is resolved, not the interpreter, which in a venv links to the base python."""
    return os.path.realpath(os.path.dirname(sys.executable))


def _covered(path: str, binds: list[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds)


def plan(allowlist: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(real directories/files to bind read-only, symlinks (path, target) to recreate) for the allowlist."""
    binds: list[str] = []
    links: list[tuple[str, str]] = []
    for entry in allowlist:
        path = os.path.abspath(os.path.expanduser(entry))
        if not os.path.lexists(path):
            continue
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        real = os.path.realpath(path)
        if os.path.exists(real) and not _covered(real, binds):
            binds = [b for b in binds if not _covered(b, [real])] + [real]
    return sorted(binds), links


def _etc_entries(src: str) -> list[tuple[str, os.stat_result, str | None]]:
    """(relative path, lstat, link target) of everything in /etc a sandbox may see, parents first."""
    out: list[tuple[str, os.stat_result, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        keep_dirs = []
        for name in sorted(dirnames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(os.path.join(dirpath, name))
            if any(rel.startswith(s) for s in ETC_SKIPPED):
                continue
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, st, os.readlink(os.path.join(dirpath, name))))
            elif st.st_mode & 0o005 == 0o005:  # other users may list and enter it
                out.append((rel, st, None))
                keep_dirs.append(name)
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if any(rel.startswith(s) for s in ETC_SKIPPED):
                continue
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, st, os.readlink(full)))
            elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
                out.append((rel, st, None))
    return out


def build_root(state_dir: Path, allowlist: list[str], etc: str = "/etc") -> tuple[Path, list[str]]:
    """Return (skeleton lower dir, host paths to bind read-only over it); built once per content.

    The skeleton is owned by host root; each sandbox sees it through an idmapped mount of its own user
    namespace (agent/boot.py), so root in every sandbox, whatever its id range, owns it and may change
    its /etc and home (in its own upper layer)."""
    binds, links = plan(allowlist)
    entries = _etc_entries(etc)
    digest = hashlib.sha256(repr((binds, links, "idmapped")).encode())
    for rel, st, target in entries:
        digest.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{target}\n".encode())
    dest = state_dir / "root" / digest.hexdigest()[:16]
    if (dest / ".orchard" / "ok").exists():
        return dest, binds
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o755)
    for rel in SKELETON_DIRS:
        (tmp / rel).mkdir(parents=True, exist_ok=True)
    os.chmod(tmp / "var" / "tmp", 0o1777)
    (tmp / "root").mkdir(mode=0o700)
    for path, target in links:
        link = tmp / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(target, link)
    for real in binds:
        point = tmp / real.lstrip("/")
        if os.path.lexists(point):
            continue
        point.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(real):
            point.mkdir()
        else:
            point.touch()
    (tmp / "etc").mkdir(exist_ok=True)
    for rel, st, target in entries:
        out = tmp / "etc" / rel
        if target is not None:
            os.symlink(target, out)
        elif stat.S_ISDIR(st.st_mode):
            out.mkdir(mode=stat.S_IMODE(st.st_mode))
        else:
            shutil.copyfile(os.path.join(etc, rel), out)
            os.chmod(out, stat.S_IMODE(st.st_mode))
    (tmp / ".orchard" / "ok").touch()
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest, binds
