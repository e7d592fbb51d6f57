"""Generated SWE tasks verified in warm rooms (`swe/warm_rooms.py`, `swe/warm_worker.py`): the verdicts a
clean room gives, and nothing one verification leaves (processes, files, IPC objects) reaches the next; and
the task set-up kept per environment (`swe/setups.py`) is the set-up."""

from __future__ import annotations

import time

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.schema import Outcome
from components.recipes.swe import SWERecipe
from components.recipes.swe.change import read_tree
from components.recipes.swe.generator import generate_tasks
from components.recipes.swe.warm_rooms import WarmRooms
from tests.recipes.test_swe_reward_hacks import Script, bash, honest_fix
from tests.recipes.test_swe_verdicts import EQUAL_TO_EVERYTHING, append_to_package


def play(client, recipe, task, calls):
    return run_episode(task, recipe, Script(calls), client, HarnessConfig(max_steps=len(calls) + 2))


def wrong_fix(task):
    """The fix, then the function redefined to answer None: tests fail (not error)."""
    fix = task.metadata["fix"]
    return [
        honest_fix(task),
        bash(f"printf '\\ndef {task.metadata['function']}(*a, **k):\\n    return None\\n' >> {fix['path']}"),
    ]


# Each runs at import of the package, in whatever process verifies it.
EXIT_AT_IMPORT = "import sys\nsys.exit(0)\n"
RAISE_AT_IMPORT = "raise RuntimeError('no')\n"
NOISE_ON_STDOUT = "print('[[\"int\", \"1\"]]')\nimport sys\nsys.stdout.write('{}')\n"
OS_EXIT_AT_IMPORT = "import os\nos._exit(0)\n"

# A verification that leaves a daemon writing where the next verification can look, and files behind.
POISON = """
import os, time
for _d in ("/tmp", "/dev/shm"):
    with open(_d + "/orchard-poison", "w") as _f:
        _f.write("x")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1024)  # holds no pipe of the verification: nothing waits for it to end
        while True:
            for _d in ("/tmp", "/dev/shm"):
                try:
                    with open(_d + "/orchard-poison", "w") as _f:
                        _f.write("x")
                except OSError:
                    pass
            time.sleep(0.005)
    os._exit(0)
"""

# The next verification of an honest fix gives no answer if it can see anything the previous one left.
SEES_LEFTOVERS = """
import os
_seen = [p for p in ("/tmp/orchard-poison", "/dev/shm/orchard-poison") if os.path.exists(p)]
for _pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        _status = open(f"/proc/{_pid}/status").read()
    except OSError:
        continue
    _uid = int(_status.split("Uid:")[1].split()[0])
    if _uid not in (0, os.getuid()) and "State:\\tZ" not in _status:
        _seen.append(_pid)
if _seen:
    raise SystemExit(f"left by an earlier verification: {_seen}")
"""

SYSV_SEGMENT = """
import ctypes
ctypes.CDLL(None).shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600: outlives the process
"""


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("train", 2, 3, difficulty=1)


def _summary(traj):
    report = traj.test_report
    return (traj.outcome, traj.outcome_reason, report.passed if report else None, report.failed if report else None)


@pytest.mark.parametrize(
    "variant",
    [
        "honest",
        "none",
        "wrong",
        "eq-always-true",
        "exit-at-import",
        "raise-at-import",
        "noise-on-stdout",
        "os-exit-at-import",
    ],
)
def test_warm_and_clean_rooms_give_the_same_verdicts(sandbox_client, tasks, variant):
    for task in tasks:
        calls = {
            "honest": [honest_fix(task)],
            "none": [],
            "wrong": wrong_fix(task),
            "eq-always-true": [append_to_package(task, EQUAL_TO_EVERYTHING)],
            "exit-at-import": [honest_fix(task), append_to_package(task, EXIT_AT_IMPORT)],
            "raise-at-import": [honest_fix(task), append_to_package(task, RAISE_AT_IMPORT)],
            "noise-on-stdout": [honest_fix(task), append_to_package(task, NOISE_ON_STDOUT)],
            "os-exit-at-import": [honest_fix(task), append_to_package(task, OS_EXIT_AT_IMPORT)],
        }[variant]
        clean = play(sandbox_client, SWERecipe(warm_rooms=False), task, calls)
        warm = play(sandbox_client, SWERecipe(), task, calls)
        assert "warm" in warm.verification.seconds and "warm" not in clean.verification.seconds
        assert _summary(warm) == _summary(clean), (task.id, variant)
    if variant == "honest":
        assert warm.outcome is Outcome.resolved


def test_a_verification_cannot_poison_the_next_one(sandbox_client, tasks):
    task = tasks[0]
    rooms = WarmRooms(max_rooms=1, idle_seconds=600)
    recipe = SWERecipe(warm_rooms=rooms)
    try:
        poisoned = play(sandbox_client, recipe, task, [append_to_package(task, POISON)])
        assert poisoned.outcome is Outcome.unresolved, poisoned.outcome_reason
        (room,) = rooms.rooms(sandbox_client)
        after = play(sandbox_client, recipe, task, [honest_fix(task), append_to_package(task, SEES_LEFTOVERS)])
        assert rooms.rooms(sandbox_client) == [room]  # the same warm room served both
        assert "warm" in after.verification.seconds
        assert after.outcome is Outcome.resolved, after.outcome_reason
    finally:
        rooms.close()


def test_a_room_that_cannot_be_put_back_retires_and_the_verdict_stands(sandbox_client, tasks):
    task = tasks[1]
    rooms = WarmRooms(max_rooms=1, idle_seconds=600)
    recipe = SWERecipe(warm_rooms=rooms)
    try:
        first = play(sandbox_client, recipe, task, [honest_fix(task)])
        (room,) = rooms.rooms(sandbox_client)
        kept = play(sandbox_client, recipe, task, [honest_fix(task), append_to_package(task, SYSV_SEGMENT)])
        assert first.outcome is kept.outcome is Outcome.resolved, kept.outcome_reason
        assert "warm" in kept.verification.seconds
        assert rooms.rooms(sandbox_client) == []  # retired: its IPC namespace holds the segment
        assert room not in {
            s.id for s in sandbox_client.list({"orchard.role": "verifier-warm"}) if s.state.value != "deleted"
        }
        unfixed = play(sandbox_client, recipe, task, [])
        assert unfixed.outcome is Outcome.unresolved and "warm" in unfixed.verification.seconds
        assert rooms.rooms(sandbox_client) not in ([], [room])  # a new room
    finally:
        rooms.close()


def test_idle_rooms_are_deleted(sandbox_client, tasks):
    rooms = WarmRooms(idle_seconds=0.5)
    verdict = play(sandbox_client, SWERecipe(warm_rooms=rooms), tasks[0], [honest_fix(tasks[0])])
    assert verdict.outcome is Outcome.resolved and "warm" in verdict.verification.seconds
    (room,) = rooms.rooms(sandbox_client)
    deadline = time.monotonic() + 10
    while sandbox_client.get(room).state.value != "deleted" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rooms.rooms(sandbox_client) == [] and sandbox_client.get(room).state.value == "deleted"


def test_the_kept_set_up_is_the_set_up(sandbox_client, tasks):
    task = tasks[0]
    recipe = SWERecipe(warm_rooms=False)
    trees = []
    for _ in range(2):  # the first sets the task up in place and keeps it; the second extracts what was kept
        with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
            recipe.setup(sandbox, task)
            trees.append(read_tree(sandbox.download_dir(task.environment.workdir)))
            status = sandbox.exec(["git", "status", "--short"], cwd=task.environment.workdir)
            assert status.ok and status.stdout == "", status
            recipe.release(sandbox)
    assert trees[0] == trees[1] and trees[0].files
    assert len(recipe._setups) == 1


def test_kept_set_ups_are_bounded_by_bytes_least_recently_used_first():
    from components.recipes.swe.change import Tree
    from components.recipes.swe.setups import SetupArchives, TaskSetup, setup_key

    def setup(n: int) -> TaskSetup:
        return TaskSetup(b"a" * n, Tree(files={"f.py": b"b" * n}))

    kept = SetupArchives(max_bytes=100)
    assert kept.put("a", setup(20)) and kept.put("b", setup(20))  # 40 bytes each
    assert kept.get("a") is not None  # a is now the most recently used
    assert kept.put("c", setup(20))  # 120 > 100: b goes
    assert kept.get("b") is None and kept.get("a") is not None and kept.get("c") is not None
    assert not kept.put("huge", setup(60)) and kept.get("huge") is None and len(kept) == 2
    task = generate_tasks("train", 1, 0)[0]
    assert setup_key(task) == setup_key(task.model_copy(update={"id": "other"}))  # by environment, not id
    for update in (
        {"setup_commands": ["pip install x"]},
        {"workdir": "/srv/repo"},
        {"repo_path": "/src", "base_commit": None},
    ):
        assert setup_key(task.model_copy(update={"environment": task.environment.model_copy(update=update)})) is None
