"""Claw: task generation, the in-sandbox CLI on a real sqlite file (run as a subprocess, as in the
sandbox), and verifiers on hand-built database states."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from components.recipes import get_recipe
from components.recipes.claw.tasks import FAMILIES, generate_tasks
from components.recipes.claw.teacher import render_cli
from components.recipes.claw.verify import verify_db

CLAW = Path(__file__).parents[2] / "components/recipes/claw/sandbox/claw.py"


@pytest.fixture
def world_db(tmp_path):
    """A database initialised from a generated task's world; `run(*argv)` runs the CLI on it."""

    def make(family: str):
        task = generate_tasks("train", 1, families=(family,))[0]
        (tmp_path / "seed.json").write_text(json.dumps(task.metadata["world"]))
        env = {**os.environ, "CLAW_DB": str(tmp_path / "state.db")}

        def run(*argv: str) -> tuple[int, object]:
            proc = subprocess.run([sys.executable, "-S", str(CLAW), *argv], env=env, capture_output=True, text=True)
            return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr

        assert run("init", str(tmp_path / "seed.json"))[0] == 0
        return task, run, str(tmp_path / "state.db")

    return make


def test_tasks_deterministic_and_split_disjoint():
    recipe = get_recipe("claw")
    a, b = recipe.tasks("train", 8), recipe.tasks("train", 8)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert {t.family for t in a} == set(FAMILIES)
    held = recipe.tasks("heldout", 40)
    goal = lambda t: (t.prompt, json.dumps(t.verifier.expected, sort_keys=True))  # noqa: E731
    # Prompts may repeat across splits (small name pools); the goal in its world never does.
    assert {t.id for t in a}.isdisjoint({t.id for t in held})
    assert {goal(t) for t in recipe.tasks("train", 40)}.isdisjoint({goal(t) for t in held})
    assert get_recipe("claw", harness="shell").harness == "shell"
    with pytest.raises(ValueError):
        get_recipe("claw", harness="gui")


def test_cli_and_function_call_reach_the_same_state(world_db):
    task, run, db = world_db("schedule_from_thread")
    search = task.metadata["plan"][0]["arguments"]
    code, via_call = run("call", "mail_search", json.dumps(search))
    code2, via_cli = run(*shlex.split(render_cli("mail_search", search))[1:])  # what the shell teacher types
    assert code == code2 == 0 and via_call == via_cli and len(via_call) == 2
    latest = task.metadata["plan"][1]["arguments"]["id"]
    assert via_call[0]["id"] == latest  # newest first
    code, msg = run("mail", "read", "--id", str(latest))
    assert task.verifier.expected["start"].replace(" ", " at ") in msg["body"]
    assert run("mail", "read", "--id", "999") == (2, {"error": "no message with id 999; ids come from mail_search"})
    code, err = run("call", "calendar_create", json.dumps({"title": "x", "start": "tomorrow"}))
    assert code == 2 and "start must look like" in err["error"]
    code, err = run("call", "calendar_create", json.dumps({"title": "x", "start": "2026-03-03 10:00", "bogus": 1}))
    assert code == 2 and "does not take ['bogus']" in err["error"]
    assert not verify_db(db, task.verifier.expected, None).resolved  # nothing done yet
    exp = task.verifier.expected
    run(
        "calendar",
        "create",
        "--title",
        exp["title"],
        "--start",
        exp["start"],
        "--attendees",
        ",".join(exp["attendees"]),
    )
    assert verify_db(db, exp, None).resolved
    run("calendar", "create", "--title", exp["title"], "--start", exp["start"], "--attendees", exp["attendees"][0])
    result = verify_db(db, exp, None)
    assert not result.resolved and "exactly one event" in result.reason  # an extra wrong event fails


@pytest.mark.parametrize("family", ["email_contact", "note_from_file", "calendar_answer"])
def test_verifiers_accept_the_plan_and_reject_near_misses(world_db, family):
    task, run, db = world_db(family)
    exp = task.verifier.expected
    assert not verify_db(db, exp, None).resolved
    if family == "calendar_answer":
        assert verify_db(db, exp, f"It starts at {exp['answer']}.").resolved
        assert not verify_db(db, exp, "12:45").resolved
        run("notes", "create", "--title", "t", "--body", "b")
        assert not verify_db(db, exp, exp["answer"]).resolved  # answering must not change anything
        return
    for step in task.metadata["plan"]:
        assert run("call", step["name"], json.dumps(step["arguments"]))[0] == 0
    assert verify_db(db, exp, None).resolved
    if family == "email_contact":
        run("mail", "send", "--to", "someone@else.test", "--subject", "s", "--body", exp["body_contains"])
    else:
        run("notes", "create", "--title", exp["title"], "--body", "Total: $1")
    assert not verify_db(db, exp, None).resolved
