"""`orchard ui`: a real `mlflow server` on a run's store, on the port asked for or the first free one from 5000,
its link printed with that port and opening the runs table of the latest run's experiment; stopped afterwards.
The pages themselves, in a real browser: tests/pipelines/test_mlflow_ui.py (slow)."""

from __future__ import annotations

import socket
import time

import httpx
import mlflow
import pytest

from components.core.tracking import TrackingConfig, ensure_experiment, open_pipeline_run
from pipelines import ui
from pipelines.cli import main


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    (tmp_path / "runs").mkdir()
    tracking = TrackingConfig(tracking_uri=uri, experiment="first-steps")
    older = open_pipeline_run(tracking, "older")
    ensure_experiment(TrackingConfig(tracking_uri=uri, experiment="elsewhere"))
    time.sleep(0.01)  # start times in milliseconds: the newer run starts later
    newer = open_pipeline_run(tracking, "newer")
    experiment = mlflow.MlflowClient(uri).get_run(newer).info.experiment_id
    return uri, experiment, older, newer


def test_a_taken_port_moves_the_ui_or_is_refused_when_asked_for(busy_port, monkeypatch):
    with pytest.raises(ui.UIError, match=f"port {busy_port} on 127.0.0.1 is in use .*pass --port N"):
        ui.choose_port("127.0.0.1", busy_port)
    monkeypatch.setattr(ui, "DEFAULT_PORT", busy_port)
    assert ui.choose_port("127.0.0.1", None) > busy_port  # the next free one
    assert ui.choose_port("127.0.0.1", 0) not in (0, busy_port)


def test_orchard_ui_serves_the_store_and_prints_the_runs_table_link_on_its_port(
    tmp_path, busy_port, monkeypatch, capsys
):
    uri, experiment, _, newer = _store(tmp_path)
    monkeypatch.setattr(ui, "DEFAULT_PORT", busy_port)  # 5000 "taken": the UI says so and moves
    seen = {}

    def check(link: str, server) -> int:
        seen["link"], seen["server"] = link, server
        base = link.split("/#/")[0]
        seen["runs"] = httpx.post(
            f"{base}/ajax-api/2.0/mlflow/runs/search", json={"experiment_ids": [experiment]}, timeout=30
        ).json()
        seen["page"] = httpx.get(base, timeout=30).text
        return 0

    assert ui.serve(tmp_path / "runs", browser=False, on_ready=check) == 0
    out = capsys.readouterr().out
    port = int(seen["link"].split(":")[2].split("/")[0])
    assert port > busy_port and f"MLflow UI on port {port} (port {busy_port} is taken): " in out
    assert seen["link"] == f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs?workflowType=machine_learning"
    assert f"the latest run: http://127.0.0.1:{port}/#/experiments/{experiment}/runs/{newer}?" in out
    assert {r["info"]["run_name"] for r in seen["runs"]["runs"]} == {"older", "newer"}  # the store it serves
    assert "<html" in seen["page"].lower()
    assert seen["server"].poll() is not None, "the server is stopped when the UI ends"


def test_orchard_ui_without_a_store_says_what_to_run(tmp_path, capsys):
    assert main(["ui", "--runs-dir", str(tmp_path / "nothing"), "--no-browser"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"orchard: no MLflow store at {tmp_path / 'nothing' / 'mlflow.db'}: run `orchard run --runs-dir "
        f"{tmp_path / 'nothing'}` first, or pass --runs-dir / --tracking-uri of an existing one"
    )


def test_a_run_names_the_command_that_opens_it(tmp_path):
    from pipelines.cli import _open_it

    db = tmp_path / "runs" / "mlflow.db"
    line = _open_it(f"sqlite:///{db}", "orchard", "abc123", str(tmp_path / "runs"))
    assert line.startswith(f"orchard ui --runs-dir {tmp_path / 'runs'} --run abc123 ")
    elsewhere = _open_it("sqlite:////data/m.db", "orchard", "abc123", "runs")
    assert elsewhere.startswith("orchard ui --tracking-uri sqlite:////data/m.db --run abc123 ")
