"""Blame by control run in the harness (issue 27 item 2): a tool call or a verification that fails only
on the state the policy left is the policy's outcome, never an infrastructure error it could hide behind;
the same failure on the pristine state, or a failed health probe, stays the infrastructure's."""

from __future__ import annotations

import time

import pytest

from components.core.harness import HarnessConfig, run_episode
from components.core.protocol import format_tool_call
from components.core.recipe_base import ToolResult, VerifyResult
from components.core.schema import EpisodeStatus, Outcome, ToolCall
from sandbox_service.errors import InvalidRequestError
from tests.components.test_harness import TASK, FlakyEnvironment, Scripted
from components.recipes.swe import SWERecipe

POISON = "/workspace/.poison"


class StateSensitive(SWERecipe):
    """The SWE recipe whose `view` tool and verifier fail in the way `mode` names, but only when the
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

    def verify(self, sandbox, task, final_answer):
        if self.mode == "verifier" and self._poisoned(sandbox):
            return VerifyResult(resolved=False, infra_error="could not read the state file")
        return super().verify(sandbox, task, final_answer)


def _poison_then(*calls: ToolCall) -> Scripted:
    poison = ToolCall(name="bash", arguments={"command": f"touch {POISON}"})
    return Scripted([format_tool_call(c) for c in (poison, *calls, ToolCall(name="submit"))])


@pytest.mark.parametrize("mode", ["infra_result", "raises", "service_error", "hang"])
def test_a_tool_failing_only_on_the_policys_state_is_a_policy_error(sandbox_client, mode):
    view = ToolCall(name="read_file", arguments={"path": "README.md"})
    traj = run_episode(TASK, StateSensitive(mode), _poison_then(view), sandbox_client,
                       HarnessConfig(tool_call_timeout_seconds=1))
    assert traj.outcome is Outcome.unresolved and traj.status is EpisodeStatus.completed, traj.outcome_reason
    observed = next(s for s in traj.steps if s.role == "tool" and s.tool_name == "read_file")
    assert observed.policy_error and "not on the pristine state" in observed.policy_error
    assert observed.content.startswith("Error: the tool failed on the state your actions left")
    assert traj.reward == 0.0  # the dodge earns the negative reward instead of leaving training


def test_a_verification_failing_only_on_the_policys_state_is_unresolved(sandbox_client):
    traj = run_episode(TASK, StateSensitive("verifier"), _poison_then(), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, traj.outcome_reason
    assert "not on the pristine state" in traj.outcome_reason and "could not read the state file" in traj.outcome_reason


@pytest.mark.parametrize("failure, reason", [("agent_lost", "AGENT_LOST"), ("hang", "TIMEOUT"),
                                             ("verifier", "pytest is not installed")])
def test_the_same_failure_on_the_pristine_state_stays_infrastructure(sandbox_client, failure, reason):
    submit = format_tool_call(ToolCall(name="submit"))
    traj = run_episode(TASK, FlakyEnvironment(failure), Scripted([submit]), sandbox_client,
                       HarnessConfig(tool_call_timeout_seconds=1))
    assert traj.outcome is Outcome.infra_error and traj.reward is None
    assert reason in traj.outcome_reason and "fails the same way on the pristine state" in traj.outcome_reason


class BreaksItsSandbox(SWERecipe):
    """A tool whose sandbox is gone when it fails: the health probe finds it, so no control is needed."""

    def __init__(self):
        super().__init__()
        self.controls = 0

    def setup(self, sandbox, task):
        self.controls += 1
        return super().setup(sandbox, task)

    def execute_tool(self, sandbox, task, call):
        if call.name == "read_file":
            sandbox.delete()
            return ToolResult(output="", infra_error="AGENT_LOST: the sandbox agent stopped answering")
        return super().execute_tool(sandbox, task, call)


def test_a_failed_health_probe_is_infrastructure_without_a_control_run(sandbox_client):
    recipe = BreaksItsSandbox()
    view = format_tool_call(ToolCall(name="read_file", arguments={"path": "README.md"}))
    traj = run_episode(TASK, recipe, Scripted([view]), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and "health probe failed" in traj.outcome_reason
    assert recipe.controls == 1  # the episode's own setup only


def test_a_control_that_cannot_start_leaves_the_failure_to_the_infrastructure(sandbox_client):
    class NoSecondSandbox(StateSensitive):
        def __init__(self):
            super().__init__("infra_result")
            self.setups = 0

        def setup(self, sandbox, task):
            self.setups += 1
            if self.setups > 1:
                raise RuntimeError("image pull failed")
            return super().setup(sandbox, task)

    view = ToolCall(name="read_file", arguments={"path": "README.md"})
    traj = run_episode(TASK, NoSecondSandbox(), _poison_then(view), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error
    assert "no control run" in traj.outcome_reason and "image pull failed" in traj.outcome_reason
