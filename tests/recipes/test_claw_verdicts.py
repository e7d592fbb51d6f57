"""Claw verdicts no policy can dodge or inflate, each played through the harness: wrongly typed
tool arguments and hostile journals are the policy's failures (never infrastructure errors), and a
body stuffed with every candidate number never passes a check for the one fact asked."""

from __future__ import annotations

import json
import shlex

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.schema import Outcome, ToolCall
from components.recipes import get_recipe
from tests.recipes.test_claw_gui_reward_hacks import Script, answer, bash, shell  # noqa: F401

JOURNAL = "/workspace/.claw/journal.jsonl"
DB = "/workspace/.claw/state.db"


@pytest.fixture(scope="module")
def tools():
    recipe = get_recipe("claw", harness="tools")
    return recipe, {t.family: t for t in recipe.tasks("heldout", 4)}


def play(client, recipe, task, calls):
    return run_episode(task, recipe, Script(calls), client, HarnessConfig(max_steps=len(calls) + 2))


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("contacts_search", {"query": 1}),
        ("notes_create", {"title": ["a", "b"], "body": "x"}),
        ("mail_read", {"id": 10**30}),
        ("mail_send", {"to": [["nested"]], "subject": "s", "body": "b"}),
    ],
    ids=["query=1", "title=list", "id=10**30", "to=nested-list"],
)
def test_wrongly_typed_tool_arguments_are_the_policys_error(sandbox_client, tools, name, arguments):
    recipe, tasks = tools
    traj = play(
        sandbox_client, recipe, tasks["note_from_file"], [ToolCall(name=name, arguments=arguments), answer("done")]
    )
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    observation = traj.steps[3]
    assert observation.policy_error and "must be" in observation.content, observation


@pytest.mark.parametrize(
    "line",
    [
        repr(json.dumps({"name": "notes_create", "arguments": {"title": ["x"], "body": "y"}})),
        "'[' * 200_000 + ']' * 200_000",
    ],
    ids=["replay-raises", "200000-deep"],
)
def test_a_hostile_journal_line_is_rejected_not_an_infrastructure_error(sandbox_client, shell, line):
    recipe, tasks = shell
    write = bash(f"python3 -c {shlex.quote(f'open({JOURNAL!r}, chr(119)).write({line} + chr(10))')}")
    traj = play(sandbox_client, recipe, tasks["note_from_file"], [write, answer("Note saved.")])
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    assert [i.path for i in traj.verification.ignored][:1] == ["journal.jsonl:1"]


def test_a_note_listing_every_number_does_not_pass(sandbox_client, shell):
    recipe, tasks = shell
    task = tasks["note_from_file"]
    title = task.verifier.expected["title"]
    every = " ".join(str(i) for i in range(3001))
    traj = play(
        sandbox_client,
        recipe,
        task,
        [bash(f"./claw notes create --title {shlex.quote(title)} --body '{every}'"), answer("Note saved.")],
    )
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    assert "no other number" in traj.outcome_reason


def test_a_mail_listing_every_phone_number_does_not_pass(sandbox_client, shell):
    recipe, tasks = shell
    task = tasks["email_contact"]
    phones = " ".join(c["phone"] for c in task.metadata["world"]["contacts"])
    to = task.verifier.expected["to"][0]
    traj = play(
        sandbox_client,
        recipe,
        task,
        [bash(f"./claw mail send --to {to} --subject phones --body '{phones}'"), answer("Email sent.")],
    )
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    assert "no other phone number" in traj.outcome_reason


def test_a_state_db_view_that_never_ends_does_not_hang_verification(sandbox_client, shell):
    """The host read the agent's state.db in-process with no time limit: a view whose SQL never ends
    held the verifier (and the stage) forever."""
    import threading

    recipe, tasks = shell
    view = (
        "DROP TABLE notes; CREATE VIEW notes AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT 't' AS title, 'b' AS body, 'user' AS origin FROM c WHERE x < 0"
    )
    command = f"python3 -c {shlex.quote(f'import sqlite3; db = sqlite3.connect({DB!r}); db.executescript({view!r})')}"
    done: list = []
    worker = threading.Thread(
        target=lambda: done.append(
            play(sandbox_client, recipe, tasks["note_from_file"], [bash(command), answer("Note saved.")])
        ),
        daemon=True,
    )
    worker.start()
    worker.join(90)
    assert done, "verification did not finish"
    assert done[0].outcome is Outcome.unresolved, (done[0].outcome, done[0].outcome_reason)
    assert "took over" in done[0].verification.ignored[0].reason
