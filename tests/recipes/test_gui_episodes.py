"""GUI episodes in real sandboxes: Chromium and the task's site inside a loopback-only sandbox,
driven through the harness. One browser test runs by default; the rest are `slow`."""

from __future__ import annotations

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import Generation
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import EpisodeStatus, Outcome, ToolCall
from components.recipes import get_recipe
from components.recipes.gui.teacher import ScriptedTeacher
from components.recipes.gui.vision import ScreenshotStore

CFG = HarnessConfig(max_steps=30)


class Scripted:
    """A policy that emits a fixed list of calls (the last one repeats)."""

    def __init__(self, calls: list[ToolCall], policy_id: str = "scripted-calls"):
        self.calls, self.policy_id, self.i = calls, policy_id, 0

    def generate(self, messages, config):
        call = self.calls[min(self.i, len(self.calls) - 1)]
        self.i += 1
        return Generation(text=format_tool_call(call))


def test_teacher_checks_out_in_a_real_browser_with_screenshots(sandbox_client):
    store = ScreenshotStore()
    recipe = get_recipe("gui", attach_screenshots=True, screenshot_store=store)
    task = get_recipe("gui", families=("shop_checkout",)).tasks("heldout", 1)[0]
    traj = run_episode(task, recipe, ScriptedTeacher(error_rate=0.0), sandbox_client, CFG)
    assert traj.outcome is Outcome.resolved, (traj.outcome_reason, traj.steps[-1].content)
    assert traj.test_report.passed == 5 and traj.status is EpisodeStatus.completed
    pages = [s.content for s in traj.steps if s.role == "tool"]
    assert any("Order confirmed" in p for p in pages)
    assert any(f'button "Add {task.verifier.expected["product_name"]} to cart"' in p for p in pages)
    shots = [
        store.get(s.tool_call.id)
        for s in traj.steps
        if s.role == "assistant" and s.tool_call.name != "answer" and s.tool_call.name != "read_page"
    ]
    assert shots and all(png and png.startswith(b"\x89PNG") for png in shots)


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_teacher_resolves_every_family_and_doing_nothing_fails(sandbox_client, split):
    recipe = get_recipe("gui")
    for task in recipe.tasks(split, 3):
        traj = run_episode(task, recipe, ScriptedTeacher(error_rate=0.0), sandbox_client, CFG)
        assert traj.outcome is Outcome.resolved, (task.id, traj.outcome_reason)
        idle = run_episode(
            task, recipe, Scripted([ToolCall(name="answer", arguments={"text": "done"})]), sandbox_client, CFG
        )
        assert idle.outcome is Outcome.unresolved, task.id


@pytest.mark.slow
def test_policy_mistakes_are_observations_and_network_is_loopback_only(sandbox_client):
    recipe = get_recipe("gui", families=("info_lookup",))
    task = recipe.tasks("train", 1)[0]
    policy = Scripted(
        [
            ToolCall(name="click", arguments={"element_id": 999}),
            ToolCall(name="navigate", arguments={"url": "http://example.com/"}),
            ToolCall(name="type", arguments={"element_id": "x", "text": "a"}),
            ToolCall(name="screenshot", arguments={}),
            ToolCall(name="navigate", arguments={"url": "/nope"}),
            ToolCall(name="answer", arguments={"text": "no idea"}),
        ]
    )
    traj = run_episode(task, recipe, policy, sandbox_client, CFG)
    assert traj.outcome is Outcome.unresolved
    tools = [s for s in traj.steps if s.role == "tool"]
    assert "no element [999]" in tools[0].policy_error
    assert "only open the task's local sites" in tools[1].policy_error
    assert "must be an integer" in tools[2].policy_error
    assert "Screenshot taken" in tools[3].content and "Not found" in tools[4].content


@pytest.mark.slow
def test_noisy_teacher_recovers_or_fails(sandbox_client):
    recipe = get_recipe("gui")
    teacher = ScriptedTeacher(error_rate=0.3, seed=3)
    trajs = [run_episode(t, recipe, teacher, sandbox_client, CFG) for t in recipe.tasks("train", 6)]
    assert {t.outcome for t in trajs} <= {Outcome.resolved, Outcome.unresolved}
    assert Outcome.unresolved in {t.outcome for t in trajs}


@pytest.mark.slow
def test_an_episode_forked_from_a_mid_episode_snapshot_restarts_the_browser(sandbox_client):
    """A prefix fork (the RL samplers' `from_snapshot`) holds the files, not the site or the browser:
    `run_episode` has the recipe start them again instead of failing 'browser controller not reachable'."""
    recipe = get_recipe("gui", families=("shop_checkout",))
    task = recipe.tasks("train", 1)[0]
    full = run_episode(
        task,
        recipe,
        ScriptedTeacher(error_rate=0.0),
        sandbox_client,
        CFG.model_copy(update={"snapshot_every_step": True}),
    )
    assert full.outcome is Outcome.resolved, full.outcome_reason
    prefix = full.steps[:4]  # system, user, the first action and its observation
    forked = run_episode(
        task,
        recipe,
        ScriptedTeacher(error_rate=0.0, seed=1),
        sandbox_client,
        CFG,
        prefix_steps=prefix,
        from_snapshot=prefix[-1].sandbox_state_id,
    )
    assert forked.outcome is Outcome.resolved, forked.outcome_reason
    assert forked.status is EpisodeStatus.completed and len(forked.steps) > len(prefix)
