"""`orchard ui`: the MLflow UI on a run's store, opened on the runs table of the run's experiment.

It serves the runs directory's sqlite store (`<runs-dir>/mlflow.db`, or `--tracking-uri`) with `mlflow server`
on loopback, on the port asked for (`--port`; by default 5000, or the next free one when 5000 is taken), waits
until the server answers, then prints the link to the experiment of the latest pipeline run (or of `--run`) on
its model-training runs table (`components.core.tracking.ui_link`) and opens it in a browser when this session
has a display. Ctrl-C stops the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

DEFAULT_PORT = 5000


class UIError(ValueError):
    """The UI cannot start as asked: the message says what to change."""


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_port(host: str, asked: int | None) -> int:
    """`asked` when free (UIError when taken); with none asked, DEFAULT_PORT or the next free port above it."""
    if asked is not None:
        if asked and not port_free(host, asked):
            raise UIError(
                f"port {asked} on {host} is in use (another MLflow UI?); pass --port N for another, "
                "or leave --port out to take the first free one from 5000"
            )
        return asked or _any_port(host)
    for port in range(DEFAULT_PORT, DEFAULT_PORT + 50):
        if port_free(host, port):
            return port
    return _any_port(host)


def _any_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def store_uri(runs_dir: str | Path, tracking_uri: str | None) -> str:
    """The store to serve: `tracking_uri`, else the runs directory's sqlite file (which must exist)."""
    if tracking_uri:
        return tracking_uri
    db = Path(runs_dir).resolve() / "mlflow.db"
    if not db.is_file():
        raise UIError(
            f"no MLflow store at {db}: run `orchard run --runs-dir {runs_dir}` first, or pass "
            "--runs-dir / --tracking-uri of an existing one"
        )
    return f"sqlite:///{db}"


def latest_pipeline_run(uri: str, run_id: str | None = None) -> tuple[str, str | None]:
    """(experiment id, run id) of `run_id`, else of the newest pipeline parent run, else the first experiment."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    if run_id:
        return client.get_run(run_id).info.experiment_id, run_id
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = (
        client.search_runs(
            experiments,
            filter_string="tags.`orchard.stage` = 'pipeline'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if experiments
        else []
    )
    if runs:
        return runs[0].info.experiment_id, runs[0].info.run_id
    if not experiments:
        raise UIError(f"{uri} holds no experiment yet: run `orchard run` first")
    return experiments[0], None


def start_server(uri: str, host: str, port: int, log: Path) -> subprocess.Popen:
    """`mlflow server` on the store, in its own process group (Ctrl-C here stops it with us)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            uri,
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_ready(server: subprocess.Popen, base: str, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise UIError(f"mlflow server exited ({server.returncode}): {tail[0][:300]} (log: {log})")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise UIError(f"mlflow server did not answer at {base} within {timeout:.0f} s (log: {log})")


def stop_server(server: subprocess.Popen) -> None:
    import signal

    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def has_display() -> bool:
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def serve(
    runs_dir: str | Path = "runs",
    tracking_uri: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    run_id: str | None = None,
    browser: bool = True,
    on_ready: Any = None,
) -> int:
    """Serve the UI until Ctrl-C (or until `on_ready(link, server)` returns, for tests); returns the exit code."""
    from components.core.tracking import TrackingConfig, ui_link

    uri = store_uri(runs_dir, tracking_uri)
    if uri.startswith(("http://", "https://")):  # already a server: nothing to start
        experiment, run = latest_pipeline_run(uri, run_id)
        print(ui_link(TrackingConfig(tracking_uri=uri), experiment))
        return 0
    experiment, run = latest_pipeline_run(uri, run_id)
    chosen = choose_port(host, port)
    log = Path(runs_dir) / "mlflow-ui.log" if Path(runs_dir).is_dir() else Path(f"/tmp/orchard-ui-{chosen}.log")
    server = start_server(uri, host, chosen, log)
    try:
        base = f"http://{host}:{chosen}"
        wait_ready(server, base, log)
        link = ui_link(TrackingConfig(tracking_uri=base), experiment)
        moved = f" (port {DEFAULT_PORT} is taken)" if port is None and chosen != DEFAULT_PORT else ""
        print(f"MLflow UI on port {chosen}{moved}: {link}")
        if run:
            print(f"the latest run: {ui_link(TrackingConfig(tracking_uri=base), experiment, run)}")
        print("Ctrl-C stops it.", flush=True)
        if on_ready is not None:
            return on_ready(link, server)
        if browser and has_display():
            import webbrowser

            webbrowser.open(link)
        server.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_server(server)
