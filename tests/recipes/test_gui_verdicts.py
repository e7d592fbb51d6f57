"""GUI tool calls with wrongly typed arguments: the policy's error, an observation; the
browser controller answers every request, whatever it holds, and never drops the connection (which
the recipe used to report as "browser controller unreachable", an infrastructure error)."""

from __future__ import annotations

import json

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.schema import Outcome, ToolCall
from components.recipes import get_recipe
from components.recipes.gui.recipe import CTL, SOCKET
from tests.recipes.test_gui_episodes import Scripted


@pytest.fixture(scope="module")
def gui():
    recipe = get_recipe("gui", families=("info_lookup",))
    return recipe, recipe.tasks("heldout", 1)[0]


@pytest.mark.parametrize("amount", [None, [1]], ids=["amount=null", "amount=[1]"])
def test_a_wrongly_typed_scroll_is_the_policys_error(sandbox_client, gui, amount):
    recipe, task = gui
    calls = [
        ToolCall(name="scroll", arguments={"direction": "down", "amount": amount}),
        ToolCall(name="read_page", arguments={}),
        ToolCall(name="answer", arguments={"text": "no idea"}),
    ]
    traj = run_episode(task, recipe, Scripted(calls), sandbox_client, HarnessConfig(max_steps=5))
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    assert traj.steps[3].policy_error and "amount" in traj.steps[3].content
    assert "URL:" in traj.steps[5].content  # the browser still answers


def test_the_controller_answers_every_malformed_request(sandbox_client, gui):
    recipe, task = gui
    with sandbox_client.create(recipe.sandbox_spec(task)) as sb:
        recipe.setup(sb, task)
        for request in (
            {"action": "scroll", "amount": None},
            {"action": "scroll", "amount": [1]},
            {"action": "click", "element_id": {"x": 1}},
            {"action": "type", "element_id": 1, "text": 5},
            {"action": "scroll", "amount": 10**30},
            [1, 2],
            "x",
        ):
            res = sb.exec(["python", "-S", CTL, SOCKET, json.dumps(request)], timeout=60)
            answer = json.loads(res.stdout)
            assert res.exit_code == 0 and answer["ok"] is False and not answer.get("controller_error"), (request, res)
        assert json.loads(sb.exec(["python", "-S", CTL, SOCKET, '{"action": "ping"}']).stdout)["ok"]


def test_form_comments_holding_every_candidate_fail():
    from components.recipes.gui.tasks import COMMENTS, generate_tasks
    from components.recipes.gui.verify import verify_state

    task = generate_tasks("heldout", 1, 0, ("form_register",))[0]
    exp = task.verifier.expected
    honest = {"name": exp["name"], "email": exp["email"], "ticket": exp["ticket"], "workshops": exp["workshops"]}
    assert verify_state({"submissions": [{**honest, "comments": exp["comments"]}]}, None, exp).resolved
    stuffed = {**honest, "comments": " / ".join(COMMENTS)}
    assert not verify_state({"submissions": [stuffed]}, None, exp).resolved
