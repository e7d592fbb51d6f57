"""What one local sandbox can see and do: not another sandbox's files or processes, not the host's
secrets, processes or root filesystem, and not the privileges that would undo its isolation."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from sandbox_service import errors
from sandbox_service.agent_link.client import AgentClient
from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig
from sandbox_service.errors import IsolationUnavailableError
from sandbox_service.models import ExecRequest, SandboxCreate

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def pair():
    """Two running sandboxes of one backend, as (backend, [(id, client, loop), ...])."""
    os.environ["ORCHARD_TEST_HOST_SECRET"] = "do-not-leak"
    try:
        state = tempfile.mkdtemp(prefix="ori", dir="/tmp")
        backend = LocalBackend(LocalBackendConfig(state_dir=state))
    except IsolationUnavailableError as exc:
        pytest.skip(f"no isolation on this machine: {exc}")
    loop = asyncio.new_event_loop()
    boxes = []
    try:
        for _ in range(2):
            sid = f"i-{uuid.uuid4().hex[:10]}"
            endpoint = backend.start(sid, SandboxCreate(), SandboxCreate().resources, secrets.token_hex(16))
            boxes.append((sid, AgentClient(endpoint)))
        yield backend, boxes, loop
    finally:
        for sid, client in boxes:
            loop.run_until_complete(client.close())
            backend.stop(sid)
        loop.close()
        backend.close()
        shutil.rmtree(state, ignore_errors=True)
        os.environ.pop("ORCHARD_TEST_HOST_SECRET", None)


def sh(pair, index: int, command, **kw):
    _, boxes, loop = pair
    return loop.run_until_complete(
        boxes[index][1].exec(ExecRequest(command=command, **kw), workdir="/workspace", env={}, max_output_bytes=1 << 20)
    )


def test_sandboxes_do_not_see_each_others_files_or_processes(pair):
    marker = secrets.token_hex(4)
    assert sh(pair, 0, f"echo a > /workspace/{marker}.txt; echo a > /tmp/{marker}; echo a > /etc/{marker}").ok
    assert sh(pair, 0, f"nohup sleep 7{secrets.randbelow(999)}{len(marker)} >/dev/null 2>&1 &").ok
    other = sh(pair, 1, f"ls /workspace /tmp /etc | grep {marker} || echo none; ps -eo pid,args")
    assert other.stdout.startswith("none\n"), other.stdout
    pids = [line.split(None, 1) for line in other.stdout.splitlines()[2:]]
    assert "sleep" not in other.stdout and pids[0][0] == "1", other.stdout  # only its own agent and ps
    _, boxes, loop = pair
    with pytest.raises(errors.FileNotFoundInSandboxError):
        loop.run_until_complete(boxes[1][1].read_file(f"{marker}.txt"))
    assert not Path(f"/etc/{marker}").exists()  # the host root is untouched


def test_host_secrets_state_and_environment_are_hidden(pair):
    backend, _, _ = pair
    env = sh(pair, 0, "env").stdout
    assert "do-not-leak" not in env and "ORCHARD_TEST_HOST_SECRET" not in env
    listing = sh(pair, 0, f"ls -A /tmp /run {backend.state_dir} /work/.library /mnt/sandboxing 2>&1").stdout
    for hidden in ("bash_jobs", "a.sock", "secret", "boot.json", "agent"):
        assert hidden not in listing, (hidden, listing)
    assert sh(pair, 0, f"cat {backend.state_dir}/s/*/secret").exit_code != 0
    for path in ("/root/.ssh", "/root/.npmrc", "/root/.claude"):  # masked where the host has them
        if os.path.lexists(path):
            r = sh(pair, 0, f"find {path} -type f | head -3; cat {path} 2>/dev/null | head -c 100")
            assert r.stdout.strip() == "", (path, r.stdout)
    assert sh(pair, 0, "hostname").stdout.startswith("sbx-")
    assert sh(pair, 0, ["cat", "/proc/1/environ"]).exit_code != 0  # the agent's memory/env are off limits


def test_commands_lack_the_privileges_to_undo_isolation(pair):
    checks = {
        "mount": "mount -t tmpfs none /mnt",
        "unmask": "umount /work/.library",
        "routes": "ip link set lo up",
        "sysctl": "echo 1 > /proc/sys/net/ipv4/ip_forward",
        "sysrq": "echo h > /proc/sysrq-trigger",
        "mknod": "mknod /tmp/disk b 8 0",
        "agent fds": "for f in /proc/1/fd/*; do ls $f/ >/dev/null || cat $f >/dev/null || exit 1; done",
        "cgroupfs": "ls /sys/fs/cgroup/pids/",
    }
    for name, command in checks.items():
        r = sh(pair, 0, f"{command} 2>&1 && echo ALLOWED")
        assert "ALLOWED" not in r.stdout, (name, r.stdout)


def test_tools_and_project_venv_are_usable(pair):
    r = sh(
        pair,
        0,
        "python -c 'import sys, pytest; print(sys.prefix)'; git --version; "
        "cd /workspace && printf 'def test_ok():\\n    assert 1\\n' > test_t.py && python -m pytest -q test_t.py",
    )
    assert r.ok, r
    assert ".venv" in r.stdout and "1 passed" in r.stdout


def test_pty_inside_a_sandbox_has_its_own_devpts(pair):
    _, boxes, loop = pair

    async def body():
        pty = await boxes[0][1].open_pty(["/bin/sh"], rows=20, cols=70)
        await pty.write(b"tty; stty size; ls /dev/pts; exit\n")
        out = b""
        while True:
            chunk = await asyncio.wait_for(pty.read(), 10)
            if not chunk:
                break
            out += chunk
        await pty.close()
        return out.decode(errors="replace"), pty.exit_code

    out, code = loop.run_until_complete(body())
    assert "/dev/pts/0" in out and "20 70" in out and code == 0, out


# Exhausts, for the sandbox's uid, inotify instances (fs.inotify.max_user_instances, 128) and POSIX message
# queue bytes (RLIMIT_MSGQUEUE, 800 KiB): both counted per host uid, whatever the user namespace.
COUNTERS = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.mq_open
    rt = libc
except AttributeError:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)

class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long)]

def inotify():
    fd = libc.inotify_init1(0)
    return fd, ctypes.get_errno()

def mqueue(name):
    attr = Attr(0, 10, 8192, 0)
    fd = rt.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
    return fd, ctypes.get_errno()

if sys.argv[1] == "hold":
    held = [0, 0]
    while inotify()[0] >= 0:
        held[0] += 1
    while mqueue(f"/q{held[1]}")[0] >= 0:
        held[1] += 1
    print(json.dumps([held, inotify()[1], mqueue("/last")[1]]), flush=True)
    open("/workspace/held", "w").close()
    time.sleep(float(sys.argv[2]))
else:
    print(inotify()[0] >= 0, mqueue("/mine")[0] >= 0)
"""


def test_per_user_kernel_counters_never_span_sandboxes(pair):
    """Every sandbox's root was one host uid: one sandbox holding all 128 inotify instances (or all its
    message queue bytes) made inotify_init1 (mq_open) fail with EMFILE in every other sandbox."""
    import errno
    import time

    backend, boxes, loop = pair
    for index in (0, 1):
        assert sh(pair, index, "rm -f /workspace/held").ok
        loop.run_until_complete(boxes[index][1].write_file("/workspace/counters.py", COUNTERS.encode()))
    holder = loop.create_task(
        boxes[0][1].exec(
            ExecRequest(command=["python3", "/workspace/counters.py", "hold", "15"], timeout_seconds=60),
            workdir="/workspace",
            env={},
            max_output_bytes=1 << 16,
        )
    )
    held = backend._dir(boxes[0][0]).upper / "workspace" / "held"
    deadline = time.monotonic() + 40
    while not held.exists():
        assert time.monotonic() < deadline and not holder.done(), holder.result() if holder.done() else "no hold"
        loop.run_until_complete(asyncio.sleep(0.1))
    other = sh(pair, 1, ["python3", "/workspace/counters.py", "use"])
    same = sh(pair, 0, ["python3", "/workspace/counters.py", "use"])
    result = loop.run_until_complete(holder)
    counts, inotify_errno, mq_errno = json.loads(result.stdout)
    assert counts[0] >= 100 and counts[1] >= 5 and inotify_errno == mq_errno == errno.EMFILE, result.stdout
    assert same.stdout.split() == ["False", "False"], same.stdout + same.stderr  # the limits did bite there
    assert other.stdout.split() == ["True", "True"], other.stdout + other.stderr
