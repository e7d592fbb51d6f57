"""Set-ups that run commands kept as snapshots (`swe/setups.py` SetupSnapshots): the commands run once per
task environment, later episodes restore the snapshot (on the local backend a mounted layer, no copy) and
verify from it, with the verdicts a set-up in place gives."""

from __future__ import annotations

import re

import pytest

from components.core.data.schema import Outcome
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import generate_tasks
from components.recipes.swe.setups import SetupSnapshots, snapshot_key
from tests.recipes.test_swe_reward_hacks import bash, honest_fix
from tests.recipes.test_swe_warm_rooms import play, wrong_fix

# Set-up that changes the sandbox outside the workdir, with a value no two runs share.
TOKEN_SETUP = "mkdir -p /opt/tool && head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /opt/tool/token"
SHOW_TOKEN = bash("echo token=$(cat /opt/tool/token)")


@pytest.fixture()
def task():
    task = generate_tasks("train", 1, 3, difficulty=1)[0]
    env = task.environment.model_copy(update={"setup_commands": [TOKEN_SETUP]})
    return task.model_copy(update={"environment": env})


def _token(traj) -> str:
    seen = [m for step in traj.steps for m in re.findall(r"token=([0-9a-f]{16})", step.content or "")]
    assert seen, [step.content for step in traj.steps]
    return seen[0]


def _snapshots(client) -> set[str]:
    return {s["id"] for s in client.request("GET", "/v1/snapshots").json()}


def test_set_up_commands_run_once_and_later_episodes_restore_them_with_the_same_verdicts(sandbox_client, task):
    recipe = SWERecipe(warm_rooms=False)
    before = _snapshots(sandbox_client)
    honest = [SHOW_TOKEN, honest_fix(task)]
    first = play(sandbox_client, recipe, task, honest)
    assert first.outcome is Outcome.resolved, first.outcome_reason
    (kept,) = _snapshots(sandbox_client) - before  # the first episode's pristine state, kept for the task
    runs = [
        play(sandbox_client, recipe, task, honest),
        play(sandbox_client, recipe, task, [SHOW_TOKEN, *wrong_fix(task)]),
    ]
    assert [t.outcome for t in runs] == [Outcome.resolved, Outcome.unresolved], [t.outcome_reason for t in runs]
    assert {_token(t) for t in (first, *runs)} == {_token(first)}  # set-up ran once, later episodes restored it
    assert _snapshots(sandbox_client) - before == {kept}  # no snapshot per episode, and none left behind
    recipe.drop_kept_snapshots()
    assert _snapshots(sandbox_client) - before == set()


def test_a_kept_set_up_the_service_lost_is_set_up_again(sandbox_client, task):
    recipe = SWERecipe(warm_rooms=False)
    before = _snapshots(sandbox_client)
    first = play(sandbox_client, recipe, task, [SHOW_TOKEN])
    (kept,) = _snapshots(sandbox_client) - before
    sandbox_client.request("DELETE", f"/v1/snapshots/{kept}")  # as a restarted service would have
    again = play(sandbox_client, recipe, task, [SHOW_TOKEN, honest_fix(task)])
    assert again.outcome is Outcome.resolved, again.outcome_reason  # never an infrastructure error
    assert _token(again) != _token(first)
    third = play(sandbox_client, recipe, task, [SHOW_TOKEN])  # kept anew by the next episode
    assert _token(third) != _token(again) and len(_snapshots(sandbox_client) - before) == 1
    recipe.drop_kept_snapshots()
    assert _snapshots(sandbox_client) - before == set()


def test_the_table_keeps_the_most_recent_and_deletes_a_dropped_one_at_its_last_release():
    table = SetupSnapshots(max_kept=2)
    assert table.put("a", "s1") == [] and table.put("b", "s2") == []  # each used by the episode that made it
    assert table.acquire("a") == "s1"  # a is now the most recently used, by two episodes
    assert table.put("c", "s3") == []  # b drops from the table, but its episode still uses it
    assert table.acquire("b") is None and table.release("s2") is True  # its last release deletes it
    assert table.release("s1") is False and table.release("s1") is False  # kept, unused
    assert table.put("d", "s4") == ["s1"]  # dropped and unused: deleted now
    assert table.release("own-snapshot") is None  # not a kept set-up: the caller's own to delete
    table.forget("c", "s3")
    assert table.acquire("c") is None and table.release("s3") is True
    assert table.drain() == [] and len(table) == 0  # d's episode still uses s4: deleted at its release
    assert table.release("s4") is True


def test_the_snapshot_key_covers_every_fact_set_up_reads(task):
    key = snapshot_key(task)
    assert key == snapshot_key(task.model_copy(update={"id": "other"}))
    for update in ({"setup_commands": ["true"]}, {"files": {"x.py": ""}}, {"image": "bookworm"}):
        other = task.model_copy(update={"environment": task.environment.model_copy(update=update)})
        assert snapshot_key(other) not in (None, key)
    unpinned = task.environment.model_copy(update={"repo_path": "/src", "base_commit": None})
    assert snapshot_key(task.model_copy(update={"environment": unpinned})) is None
