"""The one blame rule in the harness (`components/core/episode/blame.py`): a tool call or a verification that
fails is the policy's outcome, never an infrastructure error it could hide behind, unless the service
reports the sandbox lost or the harness's own health check fails in a fresh sandbox of the task. Running
the policy's own call again on the pristine state is no evidence: its arguments fail there the same way."""

from __future__ import annotations

import time

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.rendering.protocol import format_tool_call
from components.core.episode.recipe_base import ToolResult, VerifyResult
from components.core.data.schema import EpisodeStatus, Outcome, ToolCall
from sandbox_service.errors import InvalidRequestError
from tests.components.test_harness import TASK, FlakyEnvironment, Scripted
from components.recipes.swe import SWERecipe

POISON = "/workspace/.poison"


class Counting(SWERecipe):
    """The SWE recipe counting its setups: the episode's own, then one per fresh sandbox of a health check."""

    def __init__(self):
        super().__init__()
        self.setups = 0

    def setup(self, sandbox, task):
        self.setups += 1
        return super().setup(sandbox, task)


class StateSensitive(Counting):
    """The SWE recipe whose `read_file` tool and verifier fail in the way `mode` names, but only when the
    policy has left /workspace/.poison behind: a dodge played by the policy's own earlier commands."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode

    def _poisoned(self, sandbox) -> bool:
        return sandbox.exec(["test", "-e", POISON], timeout=10).exit_code == 0

    def execute_tool(self, sandbox, task, call):
        if call.name == "read_file" and self._poisoned(sandbox):
            if self.mode == "infra_result":
                return ToolResult(output="", infra_error="AGENT_LOST: the sandbox agent stopped answering")
            if self.mode == "raises":
                raise OSError(36, "File name too long")
            if self.mode == "service_error":
                raise InvalidRequestError("path outside the workspace")
            if self.mode == "hang":
                time.sleep(3)
        return super().execute_tool(sandbox, task, call)

    def judge(self, sandbox, task, final_answer):
        if self.mode == "verifier" and self._poisoned(sandbox):
            return VerifyResult(resolved=False, infra_error="could not read the state file")
        return super().judge(sandbox, task, final_answer)


def _poison_then(*calls: ToolCall) -> Scripted:
    poison = ToolCall(name="bash", arguments={"command": f"touch {POISON}"})
    return Scripted([format_tool_call(c) for c in (poison, *calls, ToolCall(name="submit"))])


@pytest.mark.parametrize("mode", ["infra_result", "raises", "service_error", "hang"])
def test_a_tool_failing_only_on_the_policys_state_is_a_policy_error(sandbox_client, mode):
    view = ToolCall(name="read_file", arguments={"path": "README.md"})
    recipe = StateSensitive(mode)
    traj = run_episode(TASK, recipe, _poison_then(view), sandbox_client, HarnessConfig(tool_call_timeout_seconds=1))
    assert traj.outcome is Outcome.unresolved and traj.status is EpisodeStatus.completed, traj.outcome_reason
    observed = next(s for s in traj.steps if s.role == "tool" and s.tool_name == "read_file")
    assert observed.policy_error and observed.policy_error.startswith("tool read_file: "), observed.policy_error
    assert observed.content.startswith("Error: "), observed.content
    assert traj.reward == 0.0  # the dodge earns the negative reward instead of leaving training
    # A refused request (the service's invalid_request) is the arguments' doing: no fresh sandbox is needed.
    assert recipe.setups == (1 if mode == "service_error" else 2)


class FailsOnItsArguments(Counting):
    """A tool whose call fails with the infrastructure's own words whenever its *argument* says so, on any
    state: run again on the pristine state it fails the same way, which the old rule read as innocence."""

    def execute_tool(self, sandbox, task, call):
        if call.name == "read_file" and call.arguments.get("path") == "poison":
            return ToolResult(output="", infra_error="AGENT_LOST: the sandbox agent stopped answering")
        return super().execute_tool(sandbox, task, call)


def test_a_call_failing_the_same_way_on_the_pristine_state_is_still_the_policys(sandbox_client):
    view = format_tool_call(ToolCall(name="read_file", arguments={"path": "poison"}))
    traj = run_episode(
        TASK,
        FailsOnItsArguments(),
        Scripted([view, format_tool_call(ToolCall(name="submit"))]),
        sandbox_client,
        HarnessConfig(),
    )
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, traj.outcome_reason
    assert "AGENT_LOST" in traj.steps[3].policy_error and "health check passes" in traj.steps[3].policy_error


def test_a_verification_failing_only_on_the_policys_state_is_unresolved(sandbox_client):
    traj = run_episode(TASK, StateSensitive("verifier"), _poison_then(), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, traj.outcome_reason
    assert "no verdict on the state the policy left" in traj.outcome_reason
    assert "could not read the state file" in traj.outcome_reason


@pytest.mark.parametrize(
    "failure, reason", [("agent_lost", "AGENT_LOST"), ("hang", "tool_timeout"), ("verifier", "pytest is not installed")]
)
def test_a_health_check_failing_in_a_fresh_sandbox_is_infrastructure(sandbox_client, failure, reason):
    """The recipe's tools (or verifier) fail for any call on any state: the harness's own health calls fail
    in the fresh sandbox too, and the episode is the infrastructure's."""
    submit = format_tool_call(ToolCall(name="submit"))
    traj = run_episode(
        TASK, FlakyEnvironment(failure), Scripted([submit]), sandbox_client, HarnessConfig(tool_call_timeout_seconds=1)
    )
    assert traj.outcome is Outcome.infra_error and traj.reward is None
    assert reason in traj.outcome_reason and "health check failed in a fresh sandbox" in traj.outcome_reason


class BreaksItsSandbox(Counting):
    """A tool whose sandbox is gone when it fails: the service's record shows it, so no fresh sandbox is needed."""

    def execute_tool(self, sandbox, task, call):
        if call.name == "read_file":
            sandbox.delete()
            return ToolResult(output="", infra_error="AGENT_LOST: the sandbox agent stopped answering")
        return super().execute_tool(sandbox, task, call)


def test_a_sandbox_the_service_reports_lost_is_infrastructure_without_a_fresh_sandbox(sandbox_client):
    recipe = BreaksItsSandbox()
    view = format_tool_call(ToolCall(name="read_file", arguments={"path": "README.md"}))
    traj = run_episode(TASK, recipe, Scripted([view]), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and "the service reports the sandbox lost" in traj.outcome_reason
    assert recipe.setups == 1  # the episode's own setup only


def test_a_fresh_sandbox_that_cannot_start_leaves_the_failure_to_the_infrastructure(sandbox_client):
    class NoSecondSandbox(StateSensitive):
        def __init__(self):
            super().__init__("infra_result")

        def setup(self, sandbox, task):
            if self.setups >= 1:
                self.setups += 1
                raise RuntimeError("image pull failed")
            return super().setup(sandbox, task)

    view = ToolCall(name="read_file", arguments={"path": "README.md"})
    traj = run_episode(TASK, NoSecondSandbox(), _poison_then(view), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error
    assert "could not set up a fresh sandbox" in traj.outcome_reason and "image pull failed" in traj.outcome_reason


class ResumesOnlyCleanStates(Counting):
    """A recipe whose processes cannot restart on a state the policy poisoned: forking that state fails."""

    def resume(self, sandbox, task):
        if sandbox.exec(["test", "-e", POISON], timeout=10).exit_code == 0:
            raise RuntimeError("the site cannot start on this state")
        return super().resume(sandbox, task)


def test_a_fork_that_fails_on_the_saved_state_replays_the_prefix_instead(sandbox_client):
    """A continuation forked from a state a policy made (prefix forks of the RL samplers, MC credit) used to
    end as the infrastructure's when the fork failed; the fresh sandbox comes up, so the state is the cause:
    the task is set up and the prefix replayed instead, and the continuation is judged on its own moves."""
    from components.recipes.swe.teacher import ScriptedTeacher

    recipe = ResumesOnlyCleanStates()
    first = run_episode(TASK, recipe, _poison_then(), sandbox_client, HarnessConfig(snapshot_every_step=True))
    prefix = first.steps[:4]  # system, user, the poisoning command and its observation
    assert prefix[-1].sandbox_state_id, prefix[-1]
    cont = run_episode(
        TASK,
        recipe,
        ScriptedTeacher(0.0, seed=1),
        sandbox_client,
        HarnessConfig(),
        prefix_steps=prefix,
        from_snapshot=prefix[-1].sandbox_state_id,
    )
    assert cont.outcome is Outcome.resolved and cont.status is EpisodeStatus.completed, cont.outcome_reason
    assert [(s.role, s.content) for s in cont.steps[:4]] == [(s.role, s.content) for s in prefix]
