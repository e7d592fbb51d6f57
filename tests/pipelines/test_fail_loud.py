"""Fail loudly: each case through the real local runner (real service, real stages, real MLflow)."""

from __future__ import annotations

import socket

import mlflow
import pytest

from pipelines.local import SandboxUnreachable, external_connection, run_local
from pipelines.preflight import PreflightError
from pipelines.stages import StageFailed

pytestmark = pytest.mark.timeout(600)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: connections are refused


def _runs(tmp_path) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{(tmp_path / 'runs').resolve() / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "orchard"]
    return client.search_runs([experiment.experiment_id])


def _parent_status(tmp_path) -> str:
    (run,) = [r for r in _runs(tmp_path) if r.data.tags.get("orchard.stage") == "pipeline"]
    return run.info.status


def test_an_unreachable_sandbox_url_stops_the_run_instead_of_starting_another_service(tmp_path, micro_config):
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(
        PreflightError,
        match=f"sandbox_url: {url} does not answer .*; start the sandbox service "
        "there, or leave sandbox_url unset to run one locally",
    ):
        run_local(micro_config.updated(sandbox_url=url), tmp_path / "runs")  # the run's preflight
    assert not (tmp_path / "runs").exists(), "nothing ran"
    with pytest.raises(SandboxUnreachable, match=f"sandbox_url {url} does not answer"):
        external_connection(url)  # and the runner's own check, right before it uses the service


def test_a_stage_whose_every_episode_is_an_infra_error_fails_with_the_reason(
    tmp_path, sandbox_service, micro_config, monkeypatch
):
    """A wrong token: every sandbox create is refused (401); the stage fails and quotes it."""
    monkeypatch.setenv("ORCHARD_SANDBOX_TOKEN", "not-the-token")
    config = micro_config.updated(
        sandbox_url=sandbox_service.url, provision={"check_sandbox": False}, evaluate_teacher={"infra_retries": 0}
    )
    with pytest.raises(StageFailed) as err:
        run_local(config, tmp_path / "runs")
    message = str(err.value)
    assert message.startswith("stage evaluate-teacher: 1 of 1 episodes were infrastructure errors (limit 100%)")
    assert "401" in message or "nauthorized" in message, message
    # MLflow says the same: the parent and the stage's own run (finished before the runner's check) FAILED,
    # both with the reason; nothing left RUNNING.
    runs = {r.info.run_name: r for r in _runs(tmp_path)}
    (parent,) = [r for r in runs.values() if r.data.tags.get("orchard.stage") == "pipeline"]
    for run in (parent, runs["evaluate-teacher"]):
        assert run.info.status == "FAILED"
        assert run.data.tags["orchard.failure_reason"] == f"StageFailed: {message}"[:500]
        assert run.data.tags["orchard.failed_stage"] == "evaluate-teacher"
    assert {r.info.status for name, r in runs.items() if name not in ("evaluate-teacher", parent.info.run_name)} == {
        "FINISHED"
    }


def test_the_infra_error_limit_is_configurable_per_stage(tmp_path, sandbox_service, micro_config, monkeypatch):
    """Below the limit a stage hands its output on; the limit is a setting (here: per stage)."""
    from pipelines.config import resolve
    from pipelines.steps import check_infra_errors

    config = resolve("tiny", ['failure.per_stage={"distill": 0.5}'])
    record = {"counts": {"resolved": 3, "unresolved": 1, "infra_error": 1}}
    check_infra_errors("distill", record, config)  # 20% < 50%
    record["counts"]["infra_error"] = 4
    with pytest.raises(StageFailed, match="stage distill: 4 of 8 episodes"):
        check_infra_errors("distill", record, config)
    check_infra_errors("evaluate-sft", {"infra_errors": 4, "attempts": 8}, config)  # default limit: all


def test_evaluating_an_unreachable_endpoint_fails_with_the_connection_error(tmp_path, external_service, micro_config):
    from pipelines.preflight import PreflightError
    from pipelines.stages import check_endpoint

    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    config = micro_config.updated(
        sandbox_url=external_service.url,
        evaluate_teacher={
            "policy": "openai",
            "endpoint": {"base_url": base_url, "model": "teacher", "connect_timeout_seconds": 2},
        },
    )
    with pytest.raises(PreflightError, match=f"evaluate_teacher.endpoint: {base_url} does not answer .*ConnectError"):
        run_local(config, tmp_path / "runs")  # before anything ran
    assert not (tmp_path / "runs").exists()
    # the stage asks again when it starts (on a cluster, hours after the run's start step)
    with pytest.raises(StageFailed, match=f"evaluation endpoint: {base_url} does not answer .*ConnectError"):
        check_endpoint(config.evaluate_teacher)
