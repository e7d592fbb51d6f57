"""One truncation rule: an episode cut by a wall-clock, step or token limit without a
submit is treated the same way by the fixed sampler and Balanced Adaptive Rollout, and infrastructure
latency never turns into a reward.

The rule (components/rl/sampling/rules.py `carries_reward`, components/core/episode/harness.py `policy_seconds`):
- a step/token cut is the policy's outcome: verified, its reward counts in both samplers;
- the wall-clock budget counts only policy time (generation + the commands' own run time inside the
  sandbox); sandbox creation, setup, exec queueing / transport, snapshots and heartbeats do not count;
- with `time_truncated_to_backfill` (the default) a wall-clock cut carries no reward anywhere in either
  sampler (not in a group, not in the advantage baseline); without it, it is an ordinary verified attempt.
"""

from __future__ import annotations

import time

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import EpisodeStatus as S
from components.core.data.schema import Outcome, ToolCall
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import generate_tasks
from components.rl.sampling import Attempt, RolloutBudget, RolloutConfig, advantages, sample_prompt
from tests.components.test_harness import Scripted

P, N = +1.0, -1.0
TT, TR = S.time_truncated, S.truncated


class Script:
    def __init__(self, outcomes):
        self.outcomes = list(outcomes)

    def __call__(self, prompt_id, n):
        out = []
        for _ in range(n):
            reward, status = self.outcomes.pop(0)
            out.append(Attempt(reward=reward, status=status, attempt_id=f"a{len(out)}"))
        return out


def _cfg(sampler, n, **kw):
    return RolloutConfig(sampler=sampler, group_size=n, max_rollouts_per_prompt=n, stride=n, **kw)


@pytest.mark.parametrize("sampler", ["fixed", "bar"])
def test_a_wall_clock_cut_carries_no_reward_in_either_sampler(sampler):
    # Two completed positives and two negatives, then the same prompt's wall-clock cuts (verified -1).
    outcomes = [(P, S.completed), (P, S.completed), (N, S.completed), (N, S.completed)] + [(N, TT)] * 4
    cfg = RolloutConfig(
        sampler=sampler,
        group_size=4 if sampler == "bar" else 8,
        max_rollouts_per_prompt=8,
        stride=8,
        rho_min=0.5,
        rho_max=0.5,
    )
    res = sample_prompt("p", Script(outcomes), cfg, RolloutBudget())
    assert res.record.kept
    assert all(a.status is S.completed for a in res.group), [a.status for a in res.group]
    # The baseline is the four completed attempts only: +-1 exactly, not shifted by the cut ones' -1.
    assert sorted(a.advantage for a in res.group) == [-1.0, -1.0, 1.0, 1.0]
    assert res.record.pool_time_truncated == 4 and res.record.pool_negatives == 2


@pytest.mark.parametrize("sampler", ["fixed", "bar"])
def test_when_too_few_rewarded_attempts_remain_a_cut_one_never_fills_the_group(sampler):
    outcomes = [(P, S.completed), (N, S.completed), (N, S.completed), (N, TT)]
    res = sample_prompt("p", Script(outcomes), _cfg(sampler, 4), RolloutBudget())
    assert all(a.status is not TT for a in res.group)
    if sampler == "bar":  # BAR's last resort (top-ranked N) took the cut one: the group is dropped
        assert not res.record.kept and res.record.drop_reason == "time_truncated" and res.group == []
    else:  # fixed groups train on what carries a reward, like an attempt the infrastructure lost
        assert res.record.kept and res.record.group_size == 3


@pytest.mark.parametrize("sampler", ["fixed", "bar"])
@pytest.mark.parametrize("status, to_backfill", [(TR, True), (TR, False), (TT, False)])
def test_a_cut_that_carries_its_verified_reward_does_so_in_both_samplers(sampler, status, to_backfill):
    outcomes = [(P, S.completed), (N, S.completed), (P, S.completed), (N, status)]
    res = sample_prompt(
        "p", Script(outcomes), _cfg(sampler, 4, time_truncated_to_backfill=to_backfill), RolloutBudget()
    )
    assert res.record.kept and res.record.group_size == 4
    cut = next(a for a in res.group if a.status is status)
    assert cut.advantage == advantages([N], [P, N, P, N])[0]


# --- the harness: the wall-clock budget is policy time, infrastructure waits do not count

TASK = generate_tasks("train", 1, 21, difficulty=1)[0]
LS = format_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
SUBMIT = format_tool_call(ToolCall(name="submit"))


class SlowInfrastructure(SWERecipe):
    """The SWE recipe with slow infrastructure: setup (sandbox provisioning) and every tool call's
    transport to the sandbox take `delay` seconds that are not the policy's."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def setup(self, sandbox, task):
        time.sleep(self.delay)
        return super().setup(sandbox, task)

    def execute_tool(self, sandbox, task, call):
        time.sleep(self.delay)  # queueing before the command reaches the sandbox
        return super().execute_tool(sandbox, task, call)


def test_infrastructure_latency_does_not_spend_the_wall_clock_budget(sandbox_client):
    delay, limit = 1.2, 1.0  # setup alone outlasts the budget; the commands themselves take milliseconds
    traj = run_episode(
        TASK,
        SlowInfrastructure(delay),
        Scripted([LS, LS, SUBMIT]),
        sandbox_client,
        HarnessConfig(max_wall_seconds=limit),
    )
    assert traj.status is S.completed and traj.outcome is Outcome.unresolved, traj.outcome_reason
    # The infrastructure's time (setup + 3 tool calls) is still recorded in wall_seconds, never charged.
    assert traj.wall_seconds - traj.metadata["policy_seconds"] >= 4 * delay


def test_the_commands_own_run_time_spends_the_wall_clock_budget(sandbox_client):
    sleep = format_tool_call(ToolCall(name="bash", arguments={"command": "sleep 0.5"}))
    traj = run_episode(TASK, SWERecipe(), Scripted([sleep]), sandbox_client, HarnessConfig(max_wall_seconds=1.2))
    assert traj.status is S.time_truncated and traj.outcome is Outcome.unresolved, traj.outcome_reason
    # Three sleeps on an idle machine; on a loaded one a sleep's own run time grows and two can suffice.
    steps, charged = traj.num_assistant_steps, traj.metadata["policy_seconds"]
    assert 2 <= steps <= 3 and charged >= max(1.2, 0.5 * steps), (steps, charged)
