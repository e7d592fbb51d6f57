"""Every external thing a run's config names is checked before anything starts: `orchard run` with a wrong
tracking URI, checkpoint or tasks file fails within 10 s in one line that names the setting and the fix, and
leaves nothing behind (no runs directory, no service, no MLflow run). `orchard check` runs the same checks alone.

The tracking servers here are real sockets on loopback: one refusing connections, one accepting and never
answering (a firewall or a hung server: MLflow's own client retries such a server for minutes), one answering
HTML (a web page where the server should be)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipelines.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bring-your-own"


def _fails_fast_in_one_line(argv: list[str], tmp_path: Path, capsys) -> str:
    """`orchard run` with `argv` exits 1 within 10 s with one line on stderr (returned) and starts nothing."""
    t0 = time.perf_counter()
    code = main(["run", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), *argv])
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert seconds <= 10, f"{seconds:.1f} s: {err}"
    assert "\n" not in err and "Traceback" not in err and err.startswith("orchard: "), err
    assert err.endswith("(PreflightError; --debug shows the traceback)"), err
    assert not (tmp_path / "runs").exists(), "nothing started: no run directory, no sandbox service, no MLflow run"
    return err


@pytest.fixture
def silent_server():
    """A port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def web_page():
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"<html><body>It works!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_unreachable_tracking_uri_fails_in_seconds_with_the_fix(tmp_path, capsys, silent_server, web_page):
    refused = f"http://127.0.0.1:{_closed_port()}"
    err = _fails_fast_in_one_line(["--set", f"tracking_uri={refused}"], tmp_path, capsys)
    assert f"tracking_uri: MLflow at {refused} does not answer (ConnectError" in err
    assert "start it (mlflow server --host 0.0.0.0 --port 5000), fix tracking_uri, or leave tracking_uri unset" in err
    err = _fails_fast_in_one_line(["--set", f"tracking_uri={silent_server}"], tmp_path, capsys)
    assert f"tracking_uri: MLflow at {silent_server} does not answer (ReadTimeout" in err
    err = _fails_fast_in_one_line(["--set", f"tracking_uri={web_page}"], tmp_path, capsys)
    assert f"tracking_uri: {web_page} answered 200 with text/html to MLflow's REST API" in err
    assert "not an MLflow tracking server" in err
    err = _fails_fast_in_one_line(["--set", f"tracking_uri={tmp_path / 'mlruns'}"], tmp_path, capsys)
    assert "is a file store, which MLflow 3 no longer writes; use a database, e.g. tracking_uri=sqlite:///" in err


def test_a_real_tracking_server_passes(tmp_path):
    """`mlflow server` on loopback: the check's REST call is the one it answers (404 for a new experiment)."""
    from pipelines.config import resolve
    from pipelines.preflight import preflight
    from pipelines.ui import _any_port, start_server, stop_server, wait_ready

    port = _any_port("127.0.0.1")
    server = start_server(f"sqlite:///{tmp_path / 'mlflow.db'}", "127.0.0.1", port, tmp_path / "server.log")
    try:
        wait_ready(server, f"http://127.0.0.1:{port}", tmp_path / "server.log")
        preflight(resolve("tiny", [f"tracking_uri=http://127.0.0.1:{port}", "experiment=new-one"]))
        preflight(resolve("tiny", [f"tracking_uri=http://127.0.0.1:{port}", "experiment=Default"]))
    finally:
        stop_server(server)


def test_a_missing_checkpoint_fails_at_once_not_at_init_policy(tmp_path, capsys):
    err = _fails_fast_in_one_line(["--set", "model.path=/models/Qwen3-1.7B"], tmp_path, capsys)
    assert err.startswith(
        "orchard: model.path: /models/Qwen3-1.7B is not a model directory; set model.path to a "
        "save_pretrained directory (`orchard make-checkpoint --out DIR` writes a small one)"
    ), err
    (tmp_path / "empty").mkdir()
    err = _fails_fast_in_one_line(["--set", f"model.path={tmp_path / 'empty'}"], tmp_path, capsys)
    assert "is not a model directory (no config.json)" in err
    err = _fails_fast_in_one_line(["--set", "model.path=someone/not-in-the-cache"], tmp_path, capsys)
    assert "'someone/not-in-the-cache' is neither a local directory nor in the local hub cache" in err


@pytest.fixture
def tasks(tmp_path):
    """The example's tasks file and its checkouts (examples/bring-your-own)."""
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_repos.py"), str(tmp_path / "repos")], check=True, capture_output=True
    )
    return [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()], tmp_path / "repos"


def _source(path: Path, repos: Path) -> list[str]:
    endpoint = json.dumps({"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": None})
    return [
        "--set",
        "provision.source=" + json.dumps({"kind": "swebench", "path": str(path), "repos_dir": str(repos)}),
        "--set",
        "distill.teacher=openai",
        "--set",
        f"distill.openai={endpoint}",
        "--set",
        "evaluate_teacher.policy=openai",
        "--set",
        f"evaluate_teacher.endpoint={endpoint}",
        "--set",
        'credit.monte_carlo.teacher={"kind": "openai", "endpoint": ' + endpoint + "}",
    ]


def test_a_bad_task_row_is_named_by_file_and_line(tmp_path, capsys, tasks):
    rows, repos = tasks
    path = tmp_path / "tasks.jsonl"
    lines = [json.dumps(r) for r in rows]
    path.write_text("\n".join([lines[0], lines[1][:101], *lines[2:]]) + "\n")  # row 2 cut mid-string
    err = _fails_fast_in_one_line(_source(path, repos), tmp_path, capsys)
    assert f"provision.source: {path}:2: not valid JSON (Unterminated string starting at column " in err, err
    broken = {**rows[2]}
    del broken["test_patch"]
    path.write_text("\n".join([lines[0], "", json.dumps(broken)]) + "\n")  # blank lines keep the numbering
    err = _fails_fast_in_one_line(_source(path, repos), tmp_path, capsys)
    assert f"{path}:3: acme__textkit-3: missing fields ['test_patch']" in err
    path.write_text("\n".join([lines[0], json.dumps({**rows[1], "base_commit": "0" * 40})]) + "\n")
    err = _fails_fast_in_one_line(_source(path, repos), tmp_path, capsys)
    assert f"{path}:2: base_commit {'0' * 40} is not a commit of {repos.resolve() / 'acme__textkit'}" in err
    path.write_text("\n".join([lines[0], json.dumps({**rows[1], "repo": "acme/other"})]) + "\n")
    err = _fails_fast_in_one_line(_source(path, repos), tmp_path, capsys)
    assert f"{path}:2: acme__textkit-2: no git checkout of acme/other found" in err
    err = _fails_fast_in_one_line(_source(path, tmp_path / "no-repos"), tmp_path, capsys)
    assert f"repos_dir {tmp_path / 'no-repos'} is not a directory" in err


def test_orchard_check_runs_the_checks_alone(tmp_path, capsys, tasks):
    _, repos = tasks
    assert main(["check", "--preset", "tiny"]) == 0
    assert "nothing external to check" in capsys.readouterr().out
    assert main(["check", "--preset", "tiny", *_source(EXAMPLE / "tasks.jsonl", repos)]) == 1  # port 9: refused
    err = capsys.readouterr().err
    assert "provision.source" not in err and "distill.openai: http://127.0.0.1:9/v1 does not answer" in err


def test_the_cluster_start_step_checks_the_network_not_the_stage_pods_paths():
    from pipelines.config import resolve
    from pipelines.preflight import PreflightError, preflight

    config = resolve("tiny", ["model.path=/models/on-the-stage-pods-volume"])
    preflight(config, files=False)  # the start pod does not mount /models: not its to judge
    with pytest.raises(PreflightError, match="model.path: /models/on-the-stage-pods-volume is not a model directory"):
        preflight(config)
