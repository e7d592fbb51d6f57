"""Claw episodes in real sandboxes through the harness: the reference teacher resolves every family
in both harnesses, a policy that does nothing fails, and bad tool use is the policy's error."""

from __future__ import annotations

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import Generation
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import Outcome, ToolCall
from components.recipes import get_recipe
from components.recipes.claw.tasks import FAMILIES
from components.recipes.claw.teacher import ScriptedTeacher


class Scripted:
    """A policy that emits a fixed list of calls (then answers)."""

    def __init__(self, calls: list[ToolCall], policy_id: str = "scripted-calls"):
        self.calls, self.policy_id, self.i = calls, policy_id, 0

    def generate(self, messages, config):
        call = self.calls[min(self.i, len(self.calls) - 1)]
        self.i += 1
        return Generation(text=format_tool_call(call))


def _answer_now() -> Scripted:
    return Scripted([ToolCall(name="answer", arguments={"text": "done"})], "answer-now")


@pytest.mark.parametrize("harness", ["tools", "shell"])
def test_reference_teacher_resolves_every_family_and_doing_nothing_fails(sandbox_client, harness):
    recipe = get_recipe("claw", harness=harness)
    teacher = ScriptedTeacher(error_rate=0.0)  # auto: picks the harness off the system prompt
    cfg = HarnessConfig(max_steps=10)
    for task in recipe.tasks("heldout", len(FAMILIES)):
        traj = run_episode(task, recipe, teacher, sandbox_client, cfg)
        assert traj.outcome is Outcome.resolved, (task.id, traj.outcome_reason, [s.content for s in traj.steps])
        names = {s.tool_call.name for s in traj.steps if s.role == "assistant"}
        assert names <= ({"bash", "answer"} if harness == "shell" else {t.name for t in recipe.tools()})
        if harness == "tools":  # doing nothing fails (once per family is enough)
            idle = run_episode(task, recipe, _answer_now(), sandbox_client, cfg)
            assert idle.outcome is Outcome.unresolved and idle.test_report.failed >= 1, task.id


def test_bad_tool_use_is_a_policy_error_not_infrastructure(sandbox_client):
    recipe = get_recipe("claw")
    task = recipe.tasks("train", 1)[0]
    policy = Scripted(
        [
            ToolCall(name="mail_read", arguments={"id": 999}),
            ToolCall(name="calendar_create", arguments={"title": "x", "start": "soon"}),
            ToolCall(name="bash", arguments={"command": "ls"}),
            ToolCall(name="answer", arguments={"text": "gave up"}),
        ]
    )
    traj = run_episode(task, recipe, policy, sandbox_client, HarnessConfig(max_steps=6))
    assert traj.outcome is Outcome.unresolved
    errors = [s.policy_error for s in traj.steps if s.role == "tool"]
    assert errors[0] and "no message with id 999" in errors[0]
    assert errors[1] and "start must look like" in errors[1]
    assert errors[2] and "unknown tool 'bash'" in errors[2]


def test_pass_at_3_through_the_evaluate_stage_with_mlflow(sandbox_service, tmp_path):
    """Claw-Eval style reporting: k=3 attempts per held-out task, pass@1 and pass@3, logged to MLflow."""
    import mlflow

    from components.core.data.parquet_store import TaskStore
    from components.core.tracking import TrackingConfig
    from components.evaluate import EvalConfig, evaluate

    TaskStore(tmp_path / "tasks").write(get_recipe("claw").tasks("heldout", len(FAMILIES), seed=1))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = EvalConfig(
        recipe="claw",
        policy="scripted",
        scripted_error_rate=0.4,
        k=3,
        seed=1,
        harness=HarnessConfig(max_steps=8),
        sandbox=sandbox_service.connection(),
        workers=1,
    )
    # One worker: the teacher's mistakes then follow a fixed sequence, so the figures are reproducible.
    result = evaluate(
        config,
        tmp_path / "tasks",
        None,
        tmp_path / "eval",
        tracking=TrackingConfig(tracking_uri=uri, experiment="claw-test"),
    )
    assert result.tasks == len(FAMILIES) and result.attempts == 3 * len(FAMILIES) and result.infra_errors == 0
    assert 0.0 < result.pass_at_1 < 1.0 and result.pass_at_k >= result.pass_at_1  # errors fail some attempts
    assert result.pass_at_k_tasks == len(FAMILIES)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claw-test"])
    assert runs["metrics.pass_at_3"].iloc[0] == pytest.approx(result.pass_at_k)
