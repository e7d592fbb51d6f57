"""Token-level trajectory export: round trip through parquet and `datasets`, masks equal to the trainer's."""

from __future__ import annotations

import math

import pytest

from components.core.policy.modeling import ModelConfig, TokenizerConfig
from components.tiny_model import build_policy
from components.core.rendering.protocol import format_tool_call
from components.core.rendering.tokens import encode_text, render_trajectory
from components.core.data.schema import EpisodeStatus, Outcome, Step, ToolCall, Trajectory
from components.sft.tokens import export_tokens, read_tokens, trajectory_to_tokens
from components.sft.data import build_samples


@pytest.fixture(scope="module")
def policy():
    return build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))


def _trajectory(tokenizer, outcome: Outcome, credited: bool | None = None, sampled: bool = False) -> Trajectory:
    call = ToolCall(name="bash", arguments={"command": "pytest -q"})
    text = "Run the tests.\n" + format_tool_call(call)
    submit = format_tool_call(ToolCall(name="submit"))
    steps = [
        Step(index=0, role="system", content="You fix bugs."),
        Step(index=1, role="user", content="Fix add()."),
        Step(
            index=2,
            role="assistant",
            content=text,
            tool_call=call,
            credited=credited,
            token_ids=encode_text(text, tokenizer) if sampled else None,
        ),
        Step(index=3, role="tool", content="1 failed", tool_call_id=call.id, tool_name="bash"),
        Step(index=4, role="assistant", content=submit, credited=False),
    ]
    reward = {Outcome.resolved: 1.0, Outcome.unresolved: 0.0}.get(outcome)
    return Trajectory(
        task_id="swe-t",
        recipe="swe",
        policy_id="p",
        steps=steps,
        outcome=outcome,
        reward=reward,
        outcome_reason=None if outcome is Outcome.resolved else "tests failed",
        status=EpisodeStatus.completed if outcome is not Outcome.infra_error else EpisodeStatus.aborted,
    )


@pytest.mark.parametrize("mode", ["whole", "resolved_only", "credited"])
def test_ids_and_masks_are_the_trainers(policy, mode):
    _, tokenizer = policy
    trajs = [
        _trajectory(tokenizer, Outcome.resolved, sampled=True),
        _trajectory(tokenizer, Outcome.unresolved, credited=True),
    ]
    samples, _ = build_samples(trajs, tokenizer, mode, max_len=10_000)
    by_id = {s.trajectory_id: s for s in samples}
    for traj in trajs:
        row = trajectory_to_tokens(traj, tokenizer, mode)
        full = render_trajectory(traj, tokenizer, loss_on="none").input_ids
        assert row["prompt_ids"] + row["response_ids"] == full
        assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n")  # the generation prompt
        assert len(row["loss_mask"]) == len(row["response_ids"])
        if traj.id in by_id:  # the trainer uses it: the same loss tokens, none in the prompt
            assert [0] * len(row["prompt_ids"]) + row["loss_mask"] == by_id[traj.id].loss_mask
        else:  # the trainer drops it under this mode: nothing to learn from it here either
            assert not any(row["loss_mask"])
    if mode == "credited":  # the unresolved trajectory trains on its credited step only
        row = trajectory_to_tokens(trajs[1], tokenizer, mode)
        assert 0 < sum(row["loss_mask"]) < sum(trajectory_to_tokens(trajs[1], tokenizer, "whole")["loss_mask"])


def test_infrastructure_failures_export_without_reward_or_loss(policy):
    _, tokenizer = policy
    row = trajectory_to_tokens(_trajectory(tokenizer, Outcome.infra_error), tokenizer)
    assert row["reward"] is None and not any(row["loss_mask"])
    assert row["failure_reason"] == "infra_error: tests failed"


def test_parquet_round_trip_through_datasets_with_rollout_logprobs(policy, tmp_path):
    datasets = pytest.importorskip("datasets")
    model, tokenizer = policy
    trajs = [
        _trajectory(tokenizer, Outcome.resolved),
        _trajectory(tokenizer, Outcome.unresolved),
        _trajectory(tokenizer, Outcome.infra_error),
    ]
    path = export_tokens(trajs, tokenizer, tmp_path / "tokens.parquet", model=model)
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert loaded.column_names == [
        "trajectory_id",
        "prompt_ids",
        "response_ids",
        "loss_mask",
        "response_logprobs",
        "reward",
        "failure_reason",
        "metadata",
    ]
    rows = read_tokens(path)
    assert [r["trajectory_id"] for r in rows] == [t.id for t in trajs] == loaded["trajectory_id"]
    for row, traj, hf in zip(rows, trajs, loaded):
        expected = trajectory_to_tokens(traj, tokenizer)
        for key in ("prompt_ids", "response_ids", "loss_mask", "reward", "failure_reason"):
            assert row[key] == expected[key] == hf[key]
        assert row["metadata"]["outcome"] == traj.outcome.value and row["metadata"]["task_id"] == "swe-t"
        lp = row["response_logprobs"]
        assert len(lp) == len(row["response_ids"]) and all(x <= 0 and math.isfinite(x) for x in lp)
    # The logprob of the first response token, computed by hand from the model's logits.
    import torch

    row = rows[0]
    ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(row["prompt_ids"]) - 1]
    by_hand = torch.log_softmax(logits.float(), -1)[row["response_ids"][0]].item()
    assert row["response_logprobs"][0] == pytest.approx(by_hand, abs=1e-4)
