"""The agent starts each command from a thread that lives in the command's exec cgroup (`proctree._Spawner`):
the command is born there, and no thread moves between cgroups per command (a v1 move after an idle
spell waits out an RCU grace period, 8-16 ms on the first exec after every pause)."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
from pathlib import Path

import pytest

from sandbox_service.agent import proctree

PIDS_ROOT = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def tracker():
    if not (PIDS_ROOT / "tasks").exists() or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v1 pids hierarchy")
    top = PIDS_ROOT / f"orchard-test-{secrets.token_hex(4)}"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    tracker = proctree.CgroupTracker(fd, None)
    try:
        yield tracker, top
    finally:
        for name in list(tracker._spawners):  # the resident threads go back to the root group
            tids = (top / name / "tasks").read_text().split()
            for tid in tids:
                (PIDS_ROOT / "tasks").write_text(tid)
        os.close(fd)
        for child in top.iterdir():
            if child.is_dir():
                child.rmdir()
        top.rmdir()


def _cgroup_of(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":pids:" in x)
    return line.split(":", 2)[2]


def test_commands_are_born_in_their_group_without_moving_the_caller(tracker, monkeypatch):
    tracker, top = tracker
    moves = []
    write_at = proctree._write_at
    monkeypatch.setattr(proctree, "_write_at", lambda name, value, fd: (moves.append(name), write_at(name, value, fd))[1])
    caller_group = Path(f"/proc/thread-self/cgroup").read_text()
    group = tracker.new_group()
    for _ in range(5):
        proc = tracker.spawn(group, lambda: subprocess.Popen(["sleep", "5"]))
        try:
            assert _cgroup_of(proc.pid).endswith(f"/{top.name}/{group}")
            assert tracker.pids(group) == [proc.pid]  # never the agent, whose spawner thread lives there
        finally:
            proc.kill()
            proc.wait()
        tracker.release(group)
        assert tracker.new_group() == group  # recycled: the same group and its resident thread
    assert moves == [f"{group}/tasks"]  # one move for five commands
    assert Path(f"/proc/thread-self/cgroup").read_text() == caller_group
    assert str(threading.get_native_id()) not in (top / group / "tasks").read_text().split()


def test_a_spawn_failure_reaches_the_caller(tracker):
    tracker, _ = tracker
    group = tracker.new_group()
    with pytest.raises(FileNotFoundError):
        tracker.spawn(group, lambda: subprocess.Popen(["/nonexistent/command"]))
    proc = tracker.spawn(group, lambda: subprocess.Popen(["true"]))  # the thread still serves the group
    assert proc.wait() == 0


def test_killing_a_group_spares_the_agent(tracker):
    tracker, top = tracker
    group = tracker.new_group()
    proc = tracker.spawn(group, lambda: subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"]))
    assert str(os.getpid()) in (top / group / "cgroup.procs").read_text().split()  # the resident thread
    assert tracker.kill_group(group)
    assert proc.wait(5) == -9
    assert tracker.pids(group) == []
