"""The harness in real sandboxes: tool loop, malformed output, limits, infra failures, snapshots, prefixes."""

from __future__ import annotations

import time

import pytest

from components.core.episode.harness import HarnessConfig, run_episode, steps_to_messages
from components.core.policy.base import Generation
from components.core.rendering.protocol import format_tool_call
from components.core.episode.recipe_base import ToolResult, VerifyResult
from components.core.data.schema import EpisodeStatus, Outcome, ToolCall
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import generate_tasks
from components.recipes.swe.teacher import ScriptedTeacher

RECIPE = SWERecipe()
TASK = generate_tasks("train", 1, 21, difficulty=1)[0]


class Scripted:
    """A policy that replies with given texts in turn (then repeats the last), with token ids."""

    def __init__(self, texts, *, prompt_tokens=10, delay=0.0, on_turn=None):
        self.texts, self.prompt_tokens, self.delay, self.on_turn = list(texts), prompt_tokens, delay, on_turn
        self.policy_id = "scripted-texts"
        self.turn = 0

    def generate(self, messages, config):
        self.turn += 1
        if self.on_turn:
            self.on_turn(self.turn)
        time.sleep(self.delay)
        text = self.texts[min(self.turn, len(self.texts)) - 1]
        return Generation(
            text=text, token_ids=[100 + self.turn, 7], prompt_tokens=self.prompt_tokens, completion_tokens=2
        )


class Sloppy(ScriptedTeacher):
    """The teacher, but its first reply is prose (malformed) and every reply carries token ids."""

    def generate(self, messages, config):
        if len(messages) == 2:
            return Generation(text="Let me think about it.", token_ids=[9, 9], completion_tokens=2)
        gen = super().generate(messages, config)
        return gen.model_copy(update={"token_ids": [len(messages), 1, 2]})


def test_teacher_episode_with_malformed_turn_snapshots_and_continuations(sandbox_client):
    config = HarnessConfig(snapshot_every_step=True)
    traj = run_episode(TASK, RECIPE, Sloppy(error_rate=0.0), sandbox_client, config)
    assert traj.outcome is Outcome.resolved and traj.status is EpisodeStatus.completed, traj.outcome_reason
    roles = [s.role for s in traj.steps]
    assert roles[:2] == ["system", "user"] and roles[2:] == ["assistant", "tool"] * ((len(roles) - 2) // 2)
    assert traj.steps[3].policy_error.startswith("no tool call found") and traj.steps[3].content.startswith("Error:")
    assert traj.steps[2].token_ids == [9, 9] and traj.steps[4].token_ids == [4, 1, 2]  # ids kept as generated
    assert traj.test_report.passed >= 2 and traj.test_report.failed == 0 and traj.reward == 1.0
    assert "+" + TASK.metadata["fix"]["new"] in traj.final_answer
    assert all(s.sandbox_state_id for s in traj.steps if s.role == "tool" or s.index == 1)
    assert [m.role for m in steps_to_messages(traj.steps)] == roles
    assert steps_to_messages(traj.steps)[5].tool_call_id == traj.steps[4].tool_call.id

    # Continue from the state right after the fix: fork its snapshot, or replay the prefix's tool calls.
    edit = next(i for i, s in enumerate(traj.steps) if s.tool_call and s.tool_call.name == "str_replace")
    prefix = traj.steps[: edit + 2]
    forked = run_episode(
        TASK,
        RECIPE,
        ScriptedTeacher(0.0, seed=1),
        sandbox_client,
        HarnessConfig(),
        prefix_steps=prefix,
        from_snapshot=prefix[-1].sandbox_state_id,
    )
    replayed = run_episode(
        TASK, RECIPE, ScriptedTeacher(0.0, seed=2), sandbox_client, HarnessConfig(), prefix_steps=prefix
    )
    for cont in (forked, replayed):
        assert cont.outcome is Outcome.resolved, cont.outcome_reason
        assert [(s.role, s.content) for s in cont.steps[: len(prefix)]] == [(s.role, s.content) for s in prefix]
        new_calls = [s.tool_call.name for s in cont.steps[len(prefix) :] if s.tool_call]
        assert "str_replace" not in new_calls and new_calls[-1] == "submit"  # the fix was already in place


def test_step_limit_truncates_and_is_still_verified(sandbox_client):
    ls = format_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
    traj = run_episode(TASK, RECIPE, Scripted([ls]), sandbox_client, HarnessConfig(max_steps=2))
    assert traj.status is EpisodeStatus.truncated and traj.outcome is Outcome.unresolved
    assert traj.num_assistant_steps == 2 and traj.outcome_reason.startswith("truncated")
    big = run_episode(
        TASK, RECIPE, Scripted([ls], prompt_tokens=5000), sandbox_client, HarnessConfig(max_total_tokens=4000)
    )
    assert big.status is EpisodeStatus.truncated and big.num_assistant_steps == 1


def test_an_episode_records_the_rank_of_the_process_that_ran_it(sandbox_client, monkeypatch):
    """Under a distributed launch (a PyTorchJob's ranks each roll out) every episode says which rank ran it."""
    ls = format_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
    assert run_episode(TASK, RECIPE, Scripted([ls]), sandbox_client, HarnessConfig(max_steps=1)).metadata["rank"] == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_episode(TASK, RECIPE, Scripted([ls]), sandbox_client, HarnessConfig(max_steps=1)).metadata["rank"] == 1


def test_wall_clock_limit_is_time_truncated(sandbox_client):
    ls = format_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
    traj = run_episode(TASK, RECIPE, Scripted([ls], delay=0.4), sandbox_client, HarnessConfig(max_wall_seconds=1.5))
    assert traj.status is EpisodeStatus.time_truncated and traj.outcome is Outcome.unresolved


def test_sandbox_lost_mid_episode_is_infra_error_not_unresolved(sandbox_client):
    def kill_sandbox(turn):
        if turn == 2:
            for info in sandbox_client.list(labels={"orchard.task": TASK.id}):
                sandbox_client.attach(info.id).delete()

    ls = format_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
    traj = run_episode(TASK, RECIPE, Scripted([ls], on_turn=kill_sandbox), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and traj.status is EpisodeStatus.aborted
    assert "sandbox" in traj.outcome_reason and traj.reward is None


def test_policy_endpoint_failure_is_infra_error(sandbox_client):
    class Broken:
        policy_id = "broken"

        def generate(self, messages, config):
            raise ConnectionError("endpoint down")

    traj = run_episode(TASK, RECIPE, Broken(), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and "endpoint down" in traj.outcome_reason


def test_unreachable_service_is_infra_error():
    from sandbox_service.client import SandboxClient

    with SandboxClient("http://127.0.0.1:9", timeout=2) as client:
        traj = run_episode(TASK, RECIPE, Scripted(["x"]), client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and "unreachable" in traj.outcome_reason
    assert [s.role for s in traj.steps] == ["system", "user"]


@pytest.mark.parametrize("text", ["", "<tool_call>{oops", '<tool_call>{"name": "bash", "arguments": 3}</tool_call>'])
def test_malformed_output_never_crashes(sandbox_client, text):
    traj = run_episode(TASK, RECIPE, Scripted([text]), sandbox_client, HarnessConfig(max_steps=1))
    assert traj.outcome is Outcome.unresolved and traj.steps[-1].policy_error


class FlakyEnvironment(SWERecipe):
    """The SWE recipe with one failure injected at a boundary (what a lost agent or a hang looks like)."""

    def __init__(self, failure):
        super().__init__()
        self.failure = failure

    def execute_tool(self, sandbox, task, call):
        if self.failure == "agent_lost":
            return ToolResult(output="", infra_error="AGENT_LOST: the sandbox agent stopped answering")
        if self.failure == "hang":
            time.sleep(3)
        return super().execute_tool(sandbox, task, call)

    def judge(self, sandbox, task, final_answer):
        if self.failure == "verifier":
            return VerifyResult(resolved=False, infra_error="pytest is not installed in the sandbox's python")
        return super().judge(sandbox, task, final_answer)


class TightMemory(SWERecipe):
    """The SWE recipe in a 128 MiB sandbox; `verifier_hog` makes its verification run out of memory."""

    def __init__(self, verifier_hog: bool = False):
        super().__init__()
        self.verifier_hog = verifier_hog

    def sandbox_spec(self, task):
        spec = super().sandbox_spec(task)
        return spec.model_copy(update={"resources": spec.resources.model_copy(update={"memory_mb": 128})})

    def judge(self, sandbox, task, final_answer):
        if self.verifier_hog:
            res = sandbox.exec(["python3", "-c", f"x = b'a' * {HOG_BYTES}"], timeout=60)
            if res.is_infra_error:
                return VerifyResult(resolved=False, infra_error=f"{res.infra_error}: {res.message}")
        return super().judge(sandbox, task, final_answer)


HOG_BYTES = 512 << 20


def test_a_policy_cannot_turn_its_own_failures_into_infra_errors(sandbox_client):
    """Signals to the agent and the policy's own OOM are the policy's outcome: the episode is verified
    (unresolved), never dropped as an infrastructure error (which would hide it from the reward)."""
    attack = format_tool_call(
        ToolCall(
            name="bash",
            arguments={
                "command": f"kill -INT 1; kill -TERM 1; kill -HUP 1; kill -KILL 1; python3 -c \"x = b'a' * {HOG_BYTES}\""  # noqa: E501
            },
        )
    )
    submit = format_tool_call(ToolCall(name="submit"))
    traj = run_episode(TASK, TightMemory(), Scripted([attack, submit]), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.unresolved and traj.status is EpisodeStatus.completed, traj.outcome_reason
    tool = next(s for s in traj.steps if s.role == "tool")
    assert "out of memory" in tool.content and tool.policy_error == "command ran out of memory"


def test_a_verification_run_out_of_memory_is_the_infrastructures(sandbox_client):
    submit = format_tool_call(ToolCall(name="submit"))
    traj = run_episode(TASK, TightMemory(verifier_hog=True), Scripted([submit]), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.infra_error and traj.status is EpisodeStatus.aborted
    assert "OOM_KILLED" in traj.outcome_reason


class SeedDrawn(Scripted):
    """`Scripted`, but each turn also draws its sampling uniform as a local policy does: a generator seeded
    with the turn's `GenerationConfig.seed` (LocalTransformersPolicy reseeds torch on every call)."""

    def __init__(self, texts):
        super().__init__(texts)
        self.draws: list[tuple[int | None, float]] = []

    def generate(self, messages, config):
        import random

        self.draws.append((config.seed, random.Random(config.seed).random()))
        return super().generate(messages, config)


def test_every_turn_samples_with_fresh_random_numbers(sandbox_client):
    """One seed handed to every turn replays the same uniforms: turn 2's first token sits at the CDF position
    of turn 1's (correlation 1). Each turn's seed is derived from (episode seed, turn): the turns' draws are
    uncorrelated, and the same episode seed still gives the same draws."""
    import numpy as np

    from components.core.policy.base import GenerationConfig

    ls = format_tool_call(ToolCall(name="bash", arguments={"command": "true"}))
    first, second, seeds = [], [], []
    for episode in range(24):
        policy = SeedDrawn([ls])
        config = HarnessConfig(max_steps=2, generation=GenerationConfig(temperature=1.0, seed=1000 + episode))
        run_episode(TASK, RECIPE, policy, sandbox_client, config)
        (s1, u1), (s2, u2) = policy.draws
        assert s1 == 1000 + episode and s2 not in (None, s1)
        first.append(u1)
        second.append(u2)
        seeds += [s1, s2]
    assert len(set(seeds)) == len(seeds)  # no turn of one episode shares a seed with any turn of another
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.5
    again = SeedDrawn([ls])
    run_episode(
        TASK,
        RECIPE,
        again,
        sandbox_client,
        HarnessConfig(max_steps=2, generation=GenerationConfig(temperature=1.0, seed=1000)),
    )
    assert [u for _, u in again.draws] == [first[0], second[0]]  # reproducible from the episode seed
