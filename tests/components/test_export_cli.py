"""`orchard export tokens|openai`: a trajectory store to the datasets other trainers load, from the command line."""

from __future__ import annotations

import pytest

from components.core.policy.modeling import ModelConfig, TokenizerConfig, save_policy
from components.tiny_model import build_policy
from components.core.rendering.openai_format import read_openai
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import EpisodeStatus, Outcome, Step, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore
from components.sft.tokens import read_tokens, trajectory_to_tokens
from pipelines.cli import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("model")), tokenizer


def _trajectory(outcome: Outcome) -> Trajectory:
    call = ToolCall(name="bash", arguments={"command": "pytest -q"})
    steps = [
        Step(index=0, role="system", content="You fix bugs."),
        Step(index=1, role="user", content="Fix add()."),
        Step(index=2, role="assistant", content="Run them.\n" + format_tool_call(call), tool_call=call),
        Step(index=3, role="tool", content="1 failed", tool_call_id=call.id, tool_name="bash"),
        Step(index=4, role="assistant", content=format_tool_call(ToolCall(name="submit"))),
    ]
    return Trajectory(
        task_id="swe-t",
        recipe="swe",
        policy_id="p",
        steps=steps,
        outcome=outcome,
        reward={Outcome.resolved: 1.0, Outcome.unresolved: 0.0}.get(outcome),
        outcome_reason=None if outcome is Outcome.resolved else "tests failed",
        status=EpisodeStatus.aborted if outcome is Outcome.infra_error else EpisodeStatus.completed,
    )


@pytest.fixture
def store(tmp_path):
    trajectories = [_trajectory(o) for o in (Outcome.resolved, Outcome.unresolved, Outcome.infra_error)]
    TrajectoryStore(tmp_path / "trajectories").append(trajectories)
    return tmp_path / "trajectories", trajectories


def test_export_tokens_writes_the_trainers_rows_with_logprobs(checkpoint, store, tmp_path, capsys):
    model_dir, tokenizer = checkpoint
    store_dir, trajectories = store
    out = tmp_path / "ds" / "tokens.parquet"
    assert (
        main(
            [
                "export",
                "tokens",
                "--trajectories",
                str(store_dir),
                "--model",
                str(model_dir),
                "--out",
                str(out),
                "--logprobs",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == str(out)
    rows = read_tokens(out)
    assert [r["trajectory_id"] for r in rows] == [t.id for t in trajectories]
    for row, traj in zip(rows, trajectories):
        expected = trajectory_to_tokens(traj, tokenizer)
        for key in ("prompt_ids", "response_ids", "loss_mask", "reward", "failure_reason"):
            assert row[key] == expected[key]
        assert len(row["response_logprobs"]) == len(row["response_ids"])
        assert all(lp <= 0 for lp in row["response_logprobs"])


def test_export_openai_writes_the_published_shape(store, tmp_path):
    store_dir, trajectories = store
    out = tmp_path / "messages.parquet"
    assert main(["export", "openai", "--trajectories", str(store_dir), "--out", str(out)]) == 0
    assert read_openai(out) == trajectories  # our rows import back equal


def test_a_missing_store_or_model_is_one_line_and_exit_2(checkpoint, store, tmp_path, capsys):
    model_dir, _ = checkpoint
    store_dir, _ = store
    assert (
        main(
            [
                "export",
                "tokens",
                "--trajectories",
                str(tmp_path / "nope"),
                "--model",
                str(model_dir),
                "--out",
                str(tmp_path / "t.parquet"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("orchard export: ") and "does not exist" in err and err.count("\n") == 1
    assert (
        main(
            [
                "export",
                "tokens",
                "--trajectories",
                str(store_dir),
                "--model",
                str(tmp_path / "no-model"),
                "--out",
                str(tmp_path / "t.parquet"),
            ]
        )
        == 2
    )
    assert "cannot load the model" in capsys.readouterr().err
    assert not (tmp_path / "t.parquet").exists()
