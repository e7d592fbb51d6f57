"""Sandbox boot, run by the agent as PID 1 of fresh namespaces (`unshare -m -p -n -u -i -f`).

Given a JSON boot config written by the local backend, before serving it:
1. joins the sandbox's cgroups, sets its own oom_score_adj to -1000 (a workload OOM kills the
   workload, not the agent) and keeps fds to its pids cgroup and memory.oom_control;
2. mounts the root: overlay (lower = image dir or the allowlist skeleton of local/root.py, beneath the
   read-only layers of the snapshot it was forked or restored from, upper/work per sandbox on its
   size-limited disk tmpfs), the allowlisted host paths read-only over it, a fresh
   /proc (with kernel knobs read-only and kcore/keys/timers masked), a minimal /dev (null, zero,
   full, random, urandom, tty, a private devpts of at most `pty_max` ptys), read-only sysfs, /tmp,
   /run and /dev/shm from the sandbox's disk tmpfs (one memory pool, see _mount_scratch),
   empty read-only tmpfs over host secrets and the service's state dir (should an allowlist reach
   them), the agent copy and its interpreter's stdlib read-only under /.orchard (a read-only tmpfs);
3. pivot_roots into it and detaches the host root, confines imports to /.orchard (confine_imports: the
   agent never imports a module the sandbox could have written), sets the hostname, brings lo up;
4. joins its user namespace (prepare_userns/enter_userns: uid 0 inside = an unprivileged host uid; the
   other namespaces stay the host's, so root inside holds no capability over them);
5. drops dangerous capabilities from the bounding set and its own sets, so commands (root in the
   sandbox) cannot mount, change routes, load modules, ptrace the agent or open files by handle;
6. (agent/__main__.py) installs the seccomp filter of seccomp.py on itself and so on every command.

All mounts live in the sandbox's mount namespace and vanish with it. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_SET_DUMPABLE, PR_CAPBSET_DROP = 4, 24
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MOUNT_API = {arch: {"open_tree": 428, "move_mount": 429, "mount_setattr": 442} for arch in ("x86_64", "aarch64")}
AT_FDCWD, AT_EMPTY_PATH, OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = -100, 0x1000, 1, 0o2000000
MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH = 0x00100000, 4
# DAC_READ_SEARCH, LINUX_IMMUTABLE, NET_ADMIN, NET_RAW, SYS_MODULE, SYS_RAWIO, SYS_PTRACE, SYS_PACCT,
# SYS_ADMIN, SYS_BOOT, SYS_RESOURCE, SYS_TIME, SYS_TTY_CONFIG, MKNOD, AUDIT_CONTROL, MAC_OVERRIDE,
# MAC_ADMIN, SYSLOG, WAKE_ALARM, BLOCK_SUSPEND, AUDIT_READ, PERFMON, BPF, CHECKPOINT_RESTORE
DROPPED_CAPS = (2, 9, 12, 13, 16, 17, 19, 20, 21, 22, 24, 25, 26, 27, 30, 32, 33, 34, 35, 36, 37, 38, 39, 40)
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "modules")

# Where the agent's code and its interpreter's stdlib are mounted in the sandbox (_mount_code).
CODE_DIR = "/.orchard"
_CODE_ROOTS: list[tuple[str, str]] = []  # code_roots() as mounted, kept across the pivot for confine_imports

_libc = ctypes.CDLL(None, use_errno=True)


class BootError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise BootError(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {fstype or 'bind'} {source} -> {target}",
    )


def umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def bind_readonly(source: str, target: str, recursive: bool = False) -> None:
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def join_cgroups(config: dict) -> tuple[int | None, int | None]:
    """Join the sandbox's cgroups; return fds (commands' pids cgroup dir, memory OOM counter file), kept
    open across the pivot."""
    for procs in config.get("cgroup_procs", []):
        _write(procs, "0")  # "0" = the writing process
    fds = []
    for key in ("pids_cgroup", "oom_counter"):
        path = config.get(key)
        fds.append(os.open(path, os.O_RDONLY | (os.O_DIRECTORY if key != "oom_counter" else 0)) if path else None)
    return fds[0], fds[1]


def protect_from_oom() -> bool:
    """oom_score_adj -1000 for the agent; without CAP_SYS_RESOURCE (some VMs) that is refused, and the
    agent instead raises each command's score to +1000 (raising needs no privilege), see execs.py."""
    try:
        _write("/proc/self/oom_score_adj", "-1000")
        return True
    except PermissionError:
        return False


def _inside(merged: str, rel: str) -> str | None:
    """merged/rel if it exists and does not leave merged through a symlink (that would mount on the host)."""
    target = os.path.join(merged, rel.lstrip("/"))
    if not os.path.lexists(target):
        return None
    real = os.path.realpath(target)
    if real != target and not real.startswith(merged.rstrip("/") + "/"):
        return None
    return real


def _bind_point(merged: str, src: str) -> None:
    """Make the mount point for host path `src` in merged, refusing one that a symlink leads outside."""
    target = os.path.join(merged, src.lstrip("/"))
    parent = os.path.realpath(os.path.dirname(target))
    if parent != merged.rstrip("/") and not parent.startswith(merged.rstrip("/") + "/"):
        raise BootError(f"mount point {src} leaves the sandbox root through a symlink")
    if not os.path.lexists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(src):
            os.mkdir(target)
        else:
            open(target, "a").close()
    elif os.path.islink(target):
        raise BootError(f"mount point {src} is a symlink in the sandbox root")


def build_root(config: dict) -> None:
    merged = config["merged"]
    lowers = [_idmapped(layer["path"], layer["idmapped"]) for layer in config.get("layers", [])]
    lowers.append(_idmapped(config["lower"], config.get("lower_idmapped")))
    # No redirects and no metacopy files: the upper may become a snapshot layer, folded into others by
    # copying (backends/fstree.overlay_onto), which knows whiteouts and opaque directories only.
    options = f"lowerdir={':'.join(lowers)},upperdir={config['upper']},workdir={config['work']}"
    mount("overlay", merged, "overlay", 0, options + ",redirect_dir=off,metacopy=off")
    proc = os.path.join(merged, "proc")
    os.makedirs(proc, exist_ok=True)
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READONLY:
        p = os.path.join(proc, name)
        if os.path.exists(p):
            bind_readonly(p, p, recursive=True)
    for name in PROC_MASKED:
        p = os.path.join(proc, name)
        if os.path.exists(p):
            mount("/dev/null", p, None, MS_BIND)
    _build_dev(os.path.join(merged, "dev"), config.get("pty_max"))
    sys_dir = os.path.join(merged, "sys")
    os.makedirs(sys_dir, exist_ok=True)
    mount("sysfs", sys_dir, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount_scratch(merged, config)
    for src in config.get("ro_binds", []):
        _bind_point(merged, src)
        bind_readonly(src, os.path.join(merged, src.lstrip("/")))
    for rel in config.get("masks", []):
        target = _inside(merged, rel)
        if target is None:
            continue
        if os.path.isdir(target):
            mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
        else:
            mount("/dev/null", target, None, MS_BIND)
    _mount_code(merged)
    for d in (config["workspace"], config["workdir"]):
        os.makedirs(os.path.join(merged, d.lstrip("/")), exist_ok=True)
    userns = config.get("userns")
    if userns:  # the sandbox's root must own its root dir, home and workspace (an image may be the host's)
        for d in ("/root", config["workspace"], config["workdir"], "/"):
            target = merged if d == "/" else _inside(merged, d)
            if target is not None and os.lstat(target).st_uid != userns["base"]:
                os.lchown(target, userns["base"], userns["base"])
    _pivot(merged)
    confine_imports()


def code_roots() -> list[tuple[str, str]]:
    """(sys.path entry, its path in the sandbox) for every directory on the agent's sys.path: the agent
    copy (sys.path[0], see local_rootfs.install_agent) and its interpreter's stdlib and lib-dynload. Each
    top directory is mounted at CODE_DIR/<n>; an entry inside another one maps into that one's mount."""
    mounts: list[tuple[str, str]] = []  # (real host dir, CODE_DIR/<n>)
    entries: list[tuple[str, str]] = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        top = next(((host, inside) for host, inside in mounts if real == host or real.startswith(host + "/")), None)
        if top is None:
            top = (real, f"{CODE_DIR}/{len(mounts)}")
            mounts.append(top)
        entries.append((os.path.normpath(entry), top[1] + real[len(top[0]) :]))
    return entries


def _mount_code(merged: str) -> None:
    """Show the agent's import roots read-only under CODE_DIR, on a tmpfs of its own that is remounted
    read-only after the pivot: a mount point cannot be renamed or removed and nothing can be created
    in it, so no path under CODE_DIR ever leads to something the sandbox wrote (a directory in the
    sandbox's root, even a read-only bind, could be renamed away and replaced by its parent's owner)."""
    top = os.path.join(merged, CODE_DIR.lstrip("/"))
    if os.path.islink(top) or (os.path.lexists(top) and not os.path.isdir(top)):
        os.unlink(top)  # an image's or a snapshot's /.orchard: never followed
    os.makedirs(top, exist_ok=True)
    mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,nr_inodes=64,mode=755")
    _CODE_ROOTS[:] = code_roots()
    for entry, inside in _CODE_ROOTS:
        if inside.count("/") == 2:  # CODE_DIR/<n>: a top directory
            target = os.path.join(merged, inside.lstrip("/"))
            os.mkdir(target)
            bind_readonly(entry, target, recursive=True)


def confine_imports() -> None:
    """After the pivot: import only from CODE_DIR. sys.path becomes its mounts, and every package already
    imported gets its __path__ rebased there (a submodule is looked up in its package's __path__, not in
    sys.path: a host path kept there would resolve, in the sandbox's root, to wherever the sandbox put
    it). Paths that map to no mount are dropped: a lazy import from them fails instead of running
    sandbox code. Then CODE_DIR's tmpfs turns read-only."""
    roots = sorted(_CODE_ROOTS, key=lambda r: -len(r[0]))
    if not roots:
        return

    def rebase(path: str) -> str | None:
        path = os.path.normpath(path)
        for entry, inside in roots:
            if path == entry or path.startswith(entry + "/"):
                return inside + path[len(entry) :]
        return None

    sys.path[:] = [inside for _, inside in _CODE_ROOTS]
    for module in list(sys.modules.values()):
        path = getattr(module, "__path__", None)
        if path is None:
            continue
        new = [p for p in (rebase(entry) for entry in list(path)) if p]
        module.__path__ = new
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.submodule_search_locations is not None:
            spec.submodule_search_locations = new
    sys.path_importer_cache.clear()
    mount(None, CODE_DIR, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _idmapped(lower: str, at: str | None) -> str:
    """`lower` seen through the sandbox's user namespace (an idmapped bind at `at`): files host root owns
    on disk are its root's, whatever the sandbox's id range, so one skeleton or image serves every range.
    Where the filesystem cannot be idmapped, the plain directory (its files then show as nobody's)."""
    if not _userns_fd or not at:
        return lower
    nr = _MOUNT_API.get(os.uname().machine)
    fd = -1
    try:
        os.makedirs(at, exist_ok=True)
        if nr is None:
            raise BootError(f"mount API syscall numbers unknown for {os.uname().machine}")
        fd = _libc.syscall(nr["open_tree"], AT_FDCWD, lower.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
        if fd < 0:
            _check(-1, f"open_tree {lower}")
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", MOUNT_ATTR_IDMAP, 0, 0, _userns_fd[-1]))
        _check(_libc.syscall(nr["mount_setattr"], fd, b"", AT_EMPTY_PATH, attr, 32), f"idmap {lower}")
        _check(
            _libc.syscall(nr["move_mount"], fd, b"", AT_FDCWD, at.encode(), MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount {lower} -> {at}",
        )
        return at
    except (OSError, BootError) as exc:
        print(f"agent: lower layer not idmapped ({exc}); its files show as nobody's", file=sys.stderr, flush=True)
        return lower
    finally:
        if fd >= 0:
            os.close(fd)


def _owner(config: dict) -> str:
    userns = config.get("userns")
    return f",uid={userns['base']},gid={userns['base']}" if userns else ""


SCRATCH_DIRS = ("tmp", "run", "dev/shm")


def _mount_scratch(merged: str, config: dict) -> None:
    """/tmp, /run and /dev/shm: fresh directories of the sandbox's disk tmpfs (`scratch`), so every
    memory-backed file of the sandbox is in one pool whose size (local.py _mount_disk) leaves the agent
    and the next command memory: filling them is ENOSPC for the command that did it, not an OOM that the
    agent or the next command pays for. Without a scratch dir (tests), a small private tmpfs each."""
    scratch = config.get("scratch")
    userns = config.get("userns")
    for rel in SCRATCH_DIRS:
        target = os.path.join(merged, rel)
        os.makedirs(target, exist_ok=True)
        if not scratch:
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size=64m,mode=1777{_owner(config)}")
            continue
        src = os.path.join(scratch, rel.replace("/", "-"))
        os.mkdir(src)  # fresh at every boot (the backend empties `scratch` before a restart)
        if userns:
            os.chown(src, userns["base"], userns["base"])
        os.chmod(src, 0o1777)
        mount(src, target, None, MS_BIND)
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)


def _build_dev(dev: str, pty_max: int | None = None) -> None:
    """`pty_max`: this devpts instance's cap. Every instance but the host's takes its ptys from one
    machine-wide pool (kernel.pty.max minus kernel.pty.reserve): without a cap, one sandbox holding
    /dev/ptmx open drained it, and every other sandbox's openpty (and the service's PTY route) failed."""
    os.makedirs(dev, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEV_NODES:
        target = os.path.join(dev, name)
        open(target, "w").close()
        mount(f"/dev/{name}", target, None, MS_BIND)
    pts = os.path.join(dev, "pts")
    os.mkdir(pts)
    limit = f",max={pty_max}" if pty_max else ""
    mount("devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC, f"newinstance,ptmxmode=0666,mode=0620{limit}")
    os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    os.mkdir(os.path.join(dev, "shm"))  # filled by _mount_scratch
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, os.path.join(dev, name))


def _pivot(merged: str) -> None:
    machine = os.uname().machine
    nr = _PIVOT_ROOT.get(machine)
    if nr is None:
        raise BootError(f"pivot_root syscall number unknown for {machine}")
    old = os.path.join(merged, CODE_DIR.lstrip("/"), "oldroot")
    os.makedirs(old, exist_ok=True)
    os.chdir(merged)
    _check(_libc.syscall(nr, b".", (CODE_DIR.lstrip("/") + "/oldroot").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(f"{CODE_DIR}/oldroot".encode(), MNT_DETACH), "umount old root")
    os.rmdir(f"{CODE_DIR}/oldroot")


def set_hostname(name: str) -> None:
    raw = name.encode()[:63]
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


def loopback_up() -> None:
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", ifr)[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


# Set by the zygote (zygote.py) in the agent it forks: the pid of a process that has unshared a fresh user
# namespace for this sandbox, a pipe saying it did, and a pipe to close once we hold that namespace.
# Without the zygote, prepare_userns forks such a process itself.
USERNS_PEER: dict = {}
_userns_fd: list[int] = []


def become(uid: int) -> None:
    """Drop to host uid/gid `uid` (no supplementary groups) for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _fork_userns_peer(owner: int) -> dict:
    """A child that unshares a user namespace as `owner` (see zygote._child: the namespace's owner is charged
    for per-user kernel counters too, so it must be the sandbox's own uid, never host root)."""
    unshared_r, unshared_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(unshared_r)
            os.close(done_w)
            os.write(unshared_w, f"{host_pid()}\n".encode())  # /proc is still the host's
            become(owner)
            os.write(unshared_w, b"1" if _libc.unshare(CLONE_NEWUSER) == 0 else b"0")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(unshared_w)
    os.close(done_r)
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(unshared_r, 1)
        if not chunk:
            raise BootError("the user namespace helper died")
        line += chunk
    USERNS_PEER.update(pid=int(line), reap=pid, unshared_fd=unshared_r, done_fd=done_w)
    return USERNS_PEER


def prepare_userns(base: int, size: int) -> None:
    """Before the pivot (host /proc in view): map the peer's fresh user namespace (uid/gid 0..size-1 = host
    base..) and keep an fd to it, for the idmapped lower layer and for enter_userns."""
    peer = USERNS_PEER or _fork_userns_peer(base)
    try:
        if os.read(peer["unshared_fd"], 1) != b"1":
            raise BootError("could not create a user namespace (user.max_user_namespaces?)")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{peer['pid']}/{name}", "w") as f:
                f.write(f"0 {base} {size}\n")
        _userns_fd.append(os.open(f"/proc/{peer['pid']}/ns/user", os.O_RDONLY))
    finally:
        release_userns_peer()


def release_userns_peer() -> None:
    for key in ("unshared_fd", "done_fd"):
        fd = USERNS_PEER.pop(key, None)
        if fd is not None:
            os.close(fd)
    if USERNS_PEER.get("reap"):
        os.waitpid(USERNS_PEER["reap"], 0)
    USERNS_PEER.clear()


def enter_userns() -> None:
    """Move the agent into the sandbox's user namespace (prepare_userns), whose uid/gid 0.. are the host
    ids of the sandbox's own range.

    Called last in the boot, after every mount: the mount, pid, net, uts and ipc namespaces stay owned by
    the host's user namespace, so root in the sandbox holds no capability over them (it cannot mount,
    change routes or the hostname even with CAP_SYS_ADMIN), and on the host it is an unprivileged uid that
    owns nothing but the sandbox's own files (and not the host root's kernel keyring). The maps must be
    written from the parent user namespace, which prepare_userns did."""
    if not _userns_fd:
        raise BootError("enter_userns without prepare_userns")
    fd = _userns_fd.pop()
    try:
        _check(_libc.setns(fd, CLONE_NEWUSER), "setns(user namespace)")
    finally:
        os.close(fd)
    _become_root()


def _become_root() -> None:
    """Take uid/gid 0 of the new namespace (host base): until then we are the unmapped host root."""
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def harden() -> None:
    for cap in DROPPED_CAPS:
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: fine
    _drop_own_caps()
    # Non-dumpable: /proc/1/fd (the agent's cgroup fds) needs CAP_SYS_PTRACE, which commands lack.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _drop_own_caps() -> None:
    """The agent keeps only what its commands get (the bounding set): its file operations run with no
    more privilege than the sandbox's own code."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capget(header, data), "capget")
    keep = ~sum(1 << cap for cap in DROPPED_CAPS)
    for i in range(6):  # (effective, permitted, inheritable) for caps 0-31, then the same for 32-63
        data[i] &= (keep >> (32 * (i // 3))) & 0xFFFFFFFF
    _check(_libc.capset(header, data), "capset")


def host_pid() -> int:
    """Our pid as the host sees it: /proc is still the host's until build_root mounts a new one."""
    return int(os.readlink("/proc/self"))


def load_config(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
