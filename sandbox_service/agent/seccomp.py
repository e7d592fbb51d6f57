"""The seccomp filter on everything in a local sandbox (the agent, after its boot, and every command).

Modelled on the default profiles of Docker/Podman (moby/profiles/seccomp): system calls that let a
process reach kernel surface a sandbox has no use for, or undo its isolation, fail with EPERM:
- kernel keyrings (keyctl, add_key, request_key): the keyring is not namespaced per sandbox;
- bpf, perf_event_open, userfaultfd, io_uring_*: large, often-exploited kernel attack surface;
- module and kexec loading, reboot, swap, clock setting, acct, quotactl, syslog, iopl/ioperm, ...;
- the mount family (mount, umount2, pivot_root, new mount API, open_tree, mount_setattr), setns, and
  unshare/clone with any CLONE_NEW* flag (new user namespaces would hand back capabilities);
  clone3 answers ENOSYS (its flags sit in memory a filter cannot read), so libc falls back to
  clone, whose flags it can, exactly as Docker does;
- open_by_handle_at (the "shocker" escape), lookup_dcookie, uselib, nfsservctl, vm86 and friends;
- fanotify_init (its groups and marks are counted per user and it watches whole filesystems);
- io_setup answers ENOSYS, as on a kernel built without AIO: its contexts come out of one machine-wide
  pool (fs.aio-max-nr) that one sandbox could fill for every other and for the host. Docker allows it;
  we depart from Docker here. libaio users fall back to threads on ENOSYS (glibc's POSIX AIO never uses it).
Everything else is allowed (ptrace of one's own children stays, for gdb/strace, as in Docker);
syscalls of other ABIs (i386, x32) kill the process (libseccomp's default for foreign architectures).

Why libseccomp through ctypes: libseccomp (Debian `libseccomp2`, what runc/crun/podman use) is the
maintained compiler from rules to BPF, and it is a C library already on the host; the agent must stay
stdlib-only (it is copied into every sandbox), so a thin ctypes layer over its five entry points is
used instead of a Python binding package (python3-seccomp exists only for the system interpreter).
Delegating to bubblewrap (`bwrap --seccomp FD`) would need a second exec per sandbox and lose the
pre-forked agent (see zygote.py), ~30-100 ms a start. The filter is built once per process
(`prepare()`, in the zygote before it forks sandboxes) and only loaded per sandbox (`install()`),
which costs well under a millisecond.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
BLOCKED = (
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_adjtime",
    "iopl",
    "ioperm",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "setns",
    "open_by_handle_at",
    "lookup_dcookie",
    "uselib",
    "nfsservctl",
    "vm86",
    "vm86old",
    "_sysctl",
    "ustat",
    "fanotify_init",
)
NAMESPACE_CALLS = ("unshare", "clone")  # refused when any CLONE_NEW* flag is set in argument 0
ENOSYS_CALLS = ("clone3", "io_setup")


class SeccompError(Exception):
    pass


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


_state: dict = {}


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def prepare() -> None:
    """Load libseccomp and build the filter (idempotent); raise SeccompError when it cannot be."""
    if "ctx" in _state:
        return
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompError(
            f"libseccomp is not installed ({exc}); install libseccomp2 "
            "(scripts/install-system-deps.sh) or set LocalBackendConfig(seccomp=False)"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompError("seccomp_init failed")
    lib.seccomp_attr_set(ctypes.c_void_p(ctx), 4, 1)  # SCMP_FLTATR_CTL_TSYNC: every thread of the agent

    def rule(action: int, name: str, cmp: _ArgCmp | None = None) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a system call on this architecture (vm86 on x86_64, ...)
            return
        ret = lib.seccomp_rule_add_array(ctx, action, nr, 1 if cmp else 0, ctypes.byref(cmp) if cmp else None)
        if ret != 0:
            raise SeccompError(f"seccomp rule for {name}: {-ret}")

    eperm = _errno_action(errno.EPERM)
    for name in BLOCKED:
        rule(eperm, name)
    for name in NAMESPACE_CALLS:
        for flag in CLONE_NEW_FLAGS.values():
            rule(eperm, name, _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
    for name in ENOSYS_CALLS:
        rule(_errno_action(errno.ENOSYS), name)
    _state.update(lib=lib, ctx=ctx)


def install() -> None:
    """Load the filter on the calling thread's process (inherited by every child; irreversible)."""
    prepare()
    ret = _state["lib"].seccomp_load(_state["ctx"])
    if ret != 0:
        raise SeccompError(f"seccomp_load failed: {-ret}")
