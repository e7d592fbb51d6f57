"""RL and SFT train on the context the model is sampled in, also when `harness.tool_format` is set
explicitly and differs from the chat template's own."""

from __future__ import annotations

from components.core.policy.modeling import TokenizerConfig
from components.tiny_model import build_tokenizer
from components.core.rendering.protocol import format_tool_call, tools_prompt
from components.core.rendering.tokens import chat_format, render_prompt, steps_as_messages
from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
from components.rl.rollout import episode_tokens
from components.rl.sampling import Attempt
from components.sft.data import build_samples

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _protocol_episode() -> Trajectory:
    """An episode sampled in the text protocol (the tools described in the system prompt)."""
    call = ToolCall(name="read_file", arguments={"path": "mathkit/core.py"})
    steps = [
        Step(index=0, role="system", content=f"You fix bugs.\n\n{tools_prompt(TOOLS)}"),
        Step(index=1, role="user", content="Fix `add`."),
        Step(index=2, role="assistant", content=format_tool_call(call), tool_call=call),
        Step(index=3, role="tool", content="def add(a, b):\n    return a - b\n", tool_call_id=call.id),
    ]
    return Trajectory(
        task_id="t",
        recipe="swe",
        policy_id="p",
        steps=steps,
        tools=TOOLS,
        outcome=Outcome.resolved,
        reward=1.0,
        metadata={"tool_format": "protocol"},
    )


def _sampled_prompt(traj: Trajectory, tokenizer, tool_format: str) -> list[int]:
    """The ids the policy generated its first turn from (what `LocalTransformersPolicy` renders)."""
    return render_prompt(steps_as_messages(traj.steps[:2]), tokenizer, tools=traj.tools, tool_format=tool_format)  # type: ignore[arg-type]


def test_rl_and_sft_render_in_the_format_the_episode_was_sampled_in():
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=4))
    assert chat_format(tokenizer).tool_format == "hermes"  # the template's own differs from the harness's
    traj = _protocol_episode()
    sampled = _sampled_prompt(traj, tokenizer, "protocol")

    ids, mask = episode_tokens(Attempt(reward=1.0, payload=traj), tokenizer, max_len=100_000)
    assert ids[: len(sampled)] == sampled and mask.index(1) == len(sampled)

    (sample,), _ = build_samples([traj], tokenizer, "resolved_only", 100_000, tool_format="protocol")
    assert sample.input_ids[: len(sampled)] == sampled and sample.loss_mask.index(1) == len(sampled)
    # a student sampled natively trains natively: the call is re-rendered in the template's format
    (native,), _ = build_samples([traj], tokenizer, "resolved_only", 100_000)
    hermes = _sampled_prompt(traj, tokenizer, "hermes")
    assert native.input_ids[: len(hermes)] == hermes and len(hermes) != len(sampled)


def test_the_pipeline_refuses_two_tool_formats_for_one_student():
    import pytest

    from pipelines.config import ConfigError, resolve

    with pytest.raises(ConfigError, match="one tool format"):
        resolve("tiny", sets=["evaluate.harness.tool_format=protocol", "rl.harness.tool_format=protocol"])
    cfg = resolve(
        "tiny",
        sets=["evaluate.harness.tool_format=protocol", "rl.harness.tool_format=protocol", "sft.tool_format=protocol"],
    )
    assert cfg.sft.tool_format == "protocol"
