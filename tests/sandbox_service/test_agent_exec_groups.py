"""The thread that starts a command lives in the command's exec cgroup (`CgroupTracker.command_group`): the
command is born there, and the thread stays, so its next command needs no move (a v1 move after an idle
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
        for group in top.iterdir():  # the threads living in the groups go back to the root group
            if group.is_dir():
                for tid in (group / "tasks").read_text().split():
                    (PIDS_ROOT / "tasks").write_text(tid)
        os.close(fd)
        for child in top.iterdir():
            if child.is_dir():
                child.rmdir()
        top.rmdir()


def _cgroup_of(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":pids:" in x)
    return line.split(":", 2)[2]


def _in_thread(fn):
    """Run `fn` on a fresh thread and return its result (or raise its exception here)."""
    box = []

    def run():
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            box.append((False, exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def test_commands_are_born_in_their_group_and_the_thread_moves_once(tracker, monkeypatch):
    tracker, top = tracker
    moves = []
    write_at = proctree._write_at
    monkeypatch.setattr(
        proctree, "_write_at", lambda name, value, fd: (moves.append(name), write_at(name, value, fd))[1]
    )

    def five_commands():
        groups = []
        for _ in range(5):
            group = tracker.command_group()
            proc = subprocess.Popen(["sleep", "5"])
            try:
                assert _cgroup_of(proc.pid).endswith(f"/{top.name}/{group}")
                assert tracker.pids(group) == [proc.pid]  # never the agent, whose thread lives there
            finally:
                proc.kill()
                proc.wait()
            tracker.release(group)
            groups.append(group)
        return groups

    groups = _in_thread(five_commands)
    assert groups == [groups[0]] * 5 and moves == [f"{groups[0]}/tasks"]  # one move for five commands


def test_a_thread_whose_group_is_taken_moves_to_another(tracker):
    tracker, top = tracker
    first = _in_thread(tracker.command_group)
    tracker.release(first)
    taken = tracker.command_group()  # this thread takes the free group the other thread lived in
    assert taken == first
    proc = subprocess.Popen(["sleep", "5"])
    try:
        other = _in_thread(tracker.command_group)  # a new thread: never the busy group
        assert other != taken
        assert _cgroup_of(proc.pid).endswith(f"/{top.name}/{taken}")
    finally:
        proc.kill()
        proc.wait()


def test_a_group_with_a_leftover_process_is_not_reused(tracker):
    tracker, top = tracker
    group = tracker.command_group()
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & exit 0"])  # leaves a background child in the group
    proc.wait()
    tracker.release(group)
    try:
        assert tracker.command_group() != group  # even for the thread that lives there
    finally:
        tracker.kill_group(group)


def test_killing_a_group_spares_the_agent(tracker):
    tracker, top = tracker
    group = tracker.command_group()
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    assert str(os.getpid()) in (top / group / "cgroup.procs").read_text().split()  # this thread lives there
    assert tracker.kill_group(group)
    assert proc.wait(5) == -9
    assert tracker.pids(group) == []


def test_a_refused_move_gives_no_group(tracker, monkeypatch):
    """The thread did not get into the group: the command is not accounted to it (a group kill would miss
    it), so the exec falls back to the session / exec-id kill."""
    tracker, _ = tracker
    monkeypatch.setattr(tracker, "_enter", lambda name: False)
    assert tracker.command_group() is None
    monkeypatch.undo()
    assert tracker.command_group() == "x1"  # the refused group went back to the free list
