"""Provision + distillation end to end in real sandboxes: counts, resume, infra retries, endpoints, MLflow."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox_service.connection import SandboxConnection
from components.core.episode.harness import HarnessConfig
from components.core.policy.policies import OpenAIPolicyConfig
from components.core.data.schema import Outcome
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig
from components.distill import DistillConfig, distill
from components.provision import ProvisionConfig, ProvisionError, provision_environment
from components.recipes.swe.generator import generate_tasks


def test_provision_then_distill_then_resume(sandbox_service, tmp_path):
    conn = sandbox_service.connection()
    prov = provision_environment(
        ProvisionConfig(n_train=3, n_heldout=2, seed=4, sandbox=conn, latency_probes=3), tmp_path / "tasks"
    )
    assert (
        prov.counts == {"train": 3, "validation": 12, "heldout": 2} and len(TaskStore(tmp_path / "tasks").read()) == 17
    )
    assert 0 < prov.metrics["exec_latency_p50"] < 5 and prov.metrics["sandbox_create_seconds"] > 0

    config = DistillConfig(
        error_rate=0.5, max_parallel=3, sandbox=conn, progress=False, seed=1, harness=HarnessConfig(max_steps=10)
    )
    result = distill(config, tmp_path / "tasks", tmp_path / "trajs")
    trajs = TrajectoryStore(tmp_path / "trajs").read()
    assert len(trajs) == 3 and sum(result.counts.values()) == 3 and result.counts["infra_error"] == 0
    assert {t.task_id for t in trajs} == {t.id for t in TaskStore(tmp_path / "tasks").read(split="train")}
    assert all(t.policy_id.startswith("scripted-teacher") and t.test_report is not None for t in trajs)
    assert result.throughput_per_min > 0 and result.metrics["n_trajectories"] == 3
    # Every verified trajectory carries its share of hidden tests passing; the summary is their mean.
    fractions = [t.hidden_pass_fraction for t in trajs]
    assert all(f is not None and t.test_report.hidden_total >= 1 for f, t in zip(fractions, trajs))
    assert result.metrics["hidden_pass_fraction_n"] == 3
    assert result.metrics["hidden_pass_fraction_mean"] == pytest.approx(sum(fractions) / 3)

    again = distill(config, tmp_path / "tasks", tmp_path / "trajs")
    assert again.skipped == 3 and sum(again.counts.values()) == 0
    assert len(TrajectoryStore(tmp_path / "trajs").read()) == 3


def test_infra_failures_are_retried_then_recorded_never_unresolved(tmp_path):
    TaskStore(tmp_path / "tasks").write(generate_tasks("train", 2, 0))
    dead = SandboxConnection(url="http://127.0.0.1:9", token="x", timeout_seconds=2)
    config = DistillConfig(sandbox=dead, infra_retries=1, retry_backoff_seconds=0, progress=False)
    result = distill(config, tmp_path / "tasks", tmp_path / "trajs")
    assert result.counts == {"resolved": 0, "unresolved": 0, "infra_error": 2}
    trajs = TrajectoryStore(tmp_path / "trajs").read()
    assert all(t.outcome is Outcome.infra_error and t.metadata["infra_retries"] == 1 for t in trajs)
    assert all(reason.startswith("infra_error: sandbox setup failed") for reason in result.failure_reasons)
    assert distill(config, tmp_path / "tasks", tmp_path / "trajs").skipped == 0  # infra errors are retried on resume
    with pytest.raises(ProvisionError, match="not usable"):
        provision_environment(ProvisionConfig(n_train=1, n_heldout=1, sandbox=dead), tmp_path / "t2")


def test_openai_teacher_through_the_same_harness(sandbox_service, tmp_path):
    """A loopback endpoint that reads the module, then submits without fixing it."""
    replies = [
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
    ]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
            data = json.dumps(
                {
                    "choices": [
                        {"message": {"role": "assistant", "content": replies[min(turn, 1)]}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 9},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        TaskStore(tmp_path / "tasks").write(generate_tasks("train", 1, 2))
        endpoint = OpenAIPolicyConfig(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m", api_key_env=None
        )
        result = distill(
            DistillConfig(teacher="openai", openai=endpoint, sandbox=sandbox_service.connection(), progress=False),
            tmp_path / "tasks",
            tmp_path / "trajs",
        )
    finally:
        server.shutdown()
        server.server_close()
    (traj,) = TrajectoryStore(tmp_path / "trajs").read()
    assert result.counts["unresolved"] == 1 and traj.policy_id == "openai:m"
    assert traj.prompt_tokens == 100 and traj.final_answer == "" and traj.status.value == "completed"


@pytest.mark.slow
def test_distill_fifty_tasks_logged_to_mlflow(sandbox_service, tmp_path):
    import mlflow

    conn = sandbox_service.connection()
    provision_environment(ProvisionConfig(n_train=50, n_heldout=0, difficulty=[1, 2, 3], sandbox=conn), tmp_path / "t")
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="distill-50")
    result = distill(
        DistillConfig(error_rate=0.3, max_parallel=4, sandbox=conn, progress=False),
        tmp_path / "t",
        tmp_path / "trajs",
        tracking=tracking,
    )
    print(
        f"\n50-task distillation: {result.counts}, {result.throughput_per_min:.1f} trajectories/min, "
        f"reasons {result.failure_reasons}"
    )
    assert sum(result.counts.values()) == 50 and result.counts["infra_error"] == 0
    assert 0.5 <= result.metrics["resolve_rate"] < 1.0  # a real mix of resolved and unresolved
    (run,) = mlflow.search_runs(experiment_names=["distill-50"], output_format="list")
    assert run.data.metrics["n_trajectories"] == 50.0 and run.data.params["error_rate"] == "0.3"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"failure_reasons.json", "distill_outcomes.png"} <= artifacts


def test_distill_and_credit_use_the_recipes_own_teacher(sandbox_service, tmp_path):
    """The same stages serve another recipe: Claw tasks distilled with Claw's scripted teacher."""
    conn = sandbox_service.connection()
    provision_environment(
        ProvisionConfig(recipe="claw", n_train=2, n_heldout=1, seed=3, sandbox=conn, latency_probes=1),
        tmp_path / "tasks",
    )
    config = DistillConfig(
        recipe="claw", error_rate=0.0, max_parallel=2, sandbox=conn, progress=False, harness=HarnessConfig(max_steps=12)
    )
    result = distill(config, tmp_path / "tasks", tmp_path / "trajs")
    trajs = TrajectoryStore(tmp_path / "trajs").read()
    assert result.counts == {"resolved": 2, "unresolved": 0, "infra_error": 0}
    assert all(t.recipe == "claw" for t in trajs)


def test_scripted_teacher_lookup_names_the_recipe():
    from components.recipes import get_scripted_teacher
    from components.recipes.gui.teacher import ScriptedTeacher as GUITeacher

    assert isinstance(get_scripted_teacher("gui", 0.1, 0), GUITeacher)
    with pytest.raises(ValueError, match="unknown recipe"):
        get_scripted_teacher("nope", 0.1, 0)
