"""Episodes as MLflow traces: real evaluation stages, a real sqlite MLflow store, read back through the client."""

from __future__ import annotations

import mlflow
import pytest

from components.core.data.episode_traces import TraceConfig, as_code, sampled
from components.core.episode.harness import HarnessConfig
from components.core.policy.base import GenerationConfig
from components.core.data.schema import Outcome, Trajectory
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig
from components.evaluate import EvalConfig, evaluate


@pytest.fixture
def tasks(tmp_path):
    from components.recipes import get_recipe

    TaskStore(tmp_path / "tasks").write(get_recipe("swe").tasks("heldout", 2, seed=0))
    return tmp_path / "tasks"


def _tracking(tmp_path, stage: str) -> TrackingConfig:
    return TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="traces", run_name=stage)


def _traces(tmp_path, filter_string: str | None = None):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("traces")
    return client, client.search_traces(experiment_ids=[experiment.experiment_id], filter_string=filter_string)


def test_every_sampled_episode_reads_back_turn_by_turn(sandbox_service, tasks, tmp_path):
    config = EvalConfig(
        policy="scripted",
        scripted_error_rate=0.5,
        k=2,
        seed=3,
        sandbox=sandbox_service.connection(),
        traces=TraceConfig(sample_rate=1.0),
    )
    evaluate(config, tasks, None, tmp_path / "eval", tracking=_tracking(tmp_path, "evaluate-teacher"))
    episodes = {t.id: t for t in TrajectoryStore(tmp_path / "eval" / "trajectories").read()}

    client, traces = _traces(tmp_path)
    assert len(traces) == len(episodes) == 4
    (run,) = client.search_runs([client.get_experiment_by_name("traces").experiment_id])
    assert run.data.metrics["traces_logged"] == 4
    for trace in traces:
        root = next(s for s in trace.data.spans if s.parent_id is None)
        episode = episodes[root.attributes["trajectory_id"]]
        assert trace.info.tags["orchard.task"] == episode.task_id
        assert trace.info.tags["orchard.outcome"] == episode.outcome.value
        assert (trace.info.tags["orchard.stage"], trace.info.tags["orchard.split"]) == ("evaluate-teacher", "heldout")
        assert trace.info.tags["orchard.policy"] == episode.policy_id
        assert trace.info.request_metadata["mlflow.sourceRun"] == run.info.run_id
        turns = [s for s in trace.data.spans if s.span_type == "LLM"]
        tools = [s for s in trace.data.spans if s.span_type == "TOOL"]
        assistant = [s for s in episode.steps if s.role == "assistant"]
        assert [t.outputs["text"] for t in turns] == [s.content for s in assistant]
        assert turns[0].attributes["sampling.temperature"] == config.temperature
        calls = [s.tool_call for s in assistant if s.tool_call is not None]
        assert [(t.name, t.inputs["arguments"]) for t in tools] == [(c.name, c.arguments) for c in calls]
        assert [t.outputs["output"] for t in tools] == [
            as_code(s.content) for s in episode.steps if s.role == "tool" and s.tool_name
        ]
        assert [t.name for t in turns] == [f"turn {n}" for n in range(1, len(assistant) + 1)]  # 1, 2, 3: not step ids
        (verification,) = [s for s in trace.data.spans if s.name == "verification"]
        assert verification.outputs["outcome"] == episode.outcome.value
        # the reward, numeric, at the episode's top level: the root's outputs, a tag, the traces table's column
        assert root.outputs["reward"] == verification.outputs["reward"] == episode.reward == float(episode.resolved)
        assert trace.info.tags["orchard.reward"] == f"{episode.reward:g}"
        (reward,) = [a for a in client.get_trace(trace.info.trace_id).info.assessments if a.name == "reward"]
        assert reward.value == episode.reward and reward.source.source_type == "CODE"
        # the diff keeps its + and - lines as a fenced diff block (Markdown would make bullets of them)
        if episode.final_answer:
            fenced = verification.inputs["final_answer"]
            assert fenced.startswith("```diff\n") and fenced.endswith("\n```")
            assert fenced[len("```diff\n") : -len("\n```")] == episode.final_answer.rstrip()
        assert verification.outputs["test_report"] == episode.test_report.model_dump(mode="json")
        assert all(root.start_time_ns <= s.start_time_ns <= s.end_time_ns <= root.end_time_ns for s in trace.data.spans)
    # what a researcher filters by in the UI: one stage's episodes of one task with one outcome
    for task, outcome in {(t.task_id, t.outcome.value) for t in episodes.values()}:
        _, found = _traces(
            tmp_path,
            f"tags.`orchard.stage` = 'evaluate-teacher' AND tags.`orchard.outcome` = "
            f"'{outcome}' AND tags.`orchard.task` = '{task}'",
        )
        assert len(found) == sum((t.task_id, t.outcome.value) == (task, outcome) for t in episodes.values()) > 0
    assert {t.outcome for t in episodes.values()} == {Outcome.resolved, Outcome.unresolved}  # both kinds shown


def test_a_local_model_turn_carries_its_tokens_and_logprobs(sandbox_service, tasks, tmp_path):
    from components.core.policy.modeling import ModelConfig, TokenizerConfig, save_policy
    from components.tiny_model import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=0))
    save_policy(build_tiny_model(ModelConfig(), tokenizer), tokenizer, tmp_path / "model")
    config = EvalConfig(
        k=1,
        max_tasks=1,
        sandbox=sandbox_service.connection(),
        traces=TraceConfig(sample_rate=1.0),
        harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=8)),
    )
    evaluate(config, tasks, tmp_path / "model", tmp_path / "eval", tracking=_tracking(tmp_path, "evaluate-sft"))
    (episode,) = TrajectoryStore(tmp_path / "eval" / "trajectories").read()
    (step,) = [s for s in episode.steps if s.role == "assistant"]
    _, (trace,) = _traces(tmp_path, "tags.`orchard.stage` = 'evaluate-sft'")
    (turn,) = [s for s in trace.data.spans if s.span_type == "LLM"]
    assert turn.attributes["completion_tokens"] == len(step.token_ids) > 0
    assert turn.attributes["logprob.mean"] == pytest.approx(sum(step.logprobs) / len(step.logprobs))
    assert turn.attributes["sampling.max_new_tokens"] == 8


def test_the_off_switch_and_the_sample_rate_bound_the_volume(sandbox_service, tasks, tmp_path):
    config = EvalConfig(
        policy="scripted", k=2, sandbox=sandbox_service.connection(), traces=TraceConfig(enabled=False, sample_rate=1.0)
    )
    evaluate(config, tasks, None, tmp_path / "eval", tracking=_tracking(tmp_path, "evaluate-teacher"))
    assert _traces(tmp_path)[1] == []

    many = [Trajectory(task_id=f"t{i}", recipe="swe", policy_id="p", outcome=Outcome.resolved) for i in range(400)]
    half = sampled(many, TraceConfig(sample_rate=0.5, max_per_stage=1000))
    assert 150 < len(half) < 250 and sampled(many, TraceConfig(sample_rate=0.5, max_per_stage=1000)) == half
    assert len(sampled(many, TraceConfig(sample_rate=1.0, max_per_stage=7))) == 7
    assert sampled(many, TraceConfig(sample_rate=0.0)) == []


def test_multi_line_values_are_fenced_so_the_ui_keeps_every_character():
    diff = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    return a - b\n+    return a + b\n"
    assert as_code(diff) == "```diff\n" + diff.rstrip() + "\n```"
    assert as_code("3 passed\n1 failed") == "```text\n3 passed\n1 failed\n```"
    assert as_code("one line") == "one line" and as_code(None) is None and as_code("") == ""
    assert as_code("a\n```\nb") == "~~~~text\na\n```\nb\n~~~~"  # a fence inside is kept: another fence
