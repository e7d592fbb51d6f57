"""`--set credit.estimator=judge` reaches the LLM judge (components/credit/judge.py) through the local
pipeline's credit step, against a real OpenAI-compatible HTTP server on loopback."""

from __future__ import annotations

import pytest

from components.core.data.schema import Outcome, Task
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from pipelines.config import ConfigError, resolve
from pipelines.layout import RunLayout
from pipelines.steps import StepContext, run_in_layout
from tests.components.credit.test_credit import FakeOpenAI, _answer, _trajectory


def test_set_estimator_judge_runs_the_judge_in_the_pipelines_credit_step(tmp_path):
    layout = RunLayout.new(tmp_path / "runs")
    # What provision and distill leave in the run directory: a task and its trajectories.
    TaskStore(layout.artifact("provision", "tasks")).write(
        [Task(id="task-1", recipe="swe", split="train", prompt="Fix add.")]
    )
    TrajectoryStore(layout.artifact("distill", "trajectories")).append(
        [_trajectory(3, Outcome.unresolved, "task-1"), _trajectory(2, Outcome.resolved, "task-1")]
    )
    with FakeOpenAI([(200, _answer(0.1, [(2, 0.6), (4, 0.6), (6, 0.2)]))]) as server:
        config = resolve(
            "tiny",
            [
                "credit.estimator=judge",
                f"credit.judge.base_url={server.base_url}",
                "credit.judge.model=judge-1",
                "credit.judge.api_key_env=null",
            ],
        )
        record = run_in_layout("credit", layout, StepContext(config, None))
    assert [r["body"]["model"] for r in server.requests] == ["judge-1"]  # one unresolved trajectory judged
    assert record["labelled"] == 1 and record["failed"] == 0
    labelled = next(
        t for t in TrajectoryStore(layout.artifact("credit", "credited")).read() if t.outcome is Outcome.unresolved
    )
    assert labelled.metadata["credit"]["estimator"] == "judge"
    assert [s.value_estimate for s in labelled.steps if s.role == "assistant"] == [0.6, 0.6, 0.2]
    assert [s.credited for s in labelled.steps if s.role == "assistant"] == [True, False, False]


def test_the_judge_without_an_endpoint_is_refused_with_the_config():
    with pytest.raises(ConfigError, match="credit.judge.base_url"):
        resolve("tiny", ["credit.estimator=judge"])
