"""Ctrl-C and SIGTERM stop `orchard run` cleanly: a real CLI process, signalled while its sandboxes are live.

Each test starts `python -m pipelines.cli run` (the micro config, with enough distill tasks to be caught
mid-stage) in its own process group, waits until sandbox processes of its embedded service exist, signals
the group as a terminal's Ctrl-C or a CI timeout would, and then checks that the process left within seconds
with the shell's exit code, that no sandbox process or mount and no service is left, and what MLflow says.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from sandbox_service.tools.leaks import leaked_mounts, leaked_processes

REPO = Path(__file__).resolve().parents[2]


def _micro_file(micro_config, tmp_path: Path, **update) -> Path:
    path = tmp_path / "micro.yaml"
    # by default distill runs long enough to be interrupted in the middle
    data = micro_config.updated(**(update or {"provision": {"n_train": 40}})).model_dump(
        mode="json", exclude={"preset"}
    )
    path.write_text(yaml.safe_dump(data))
    return path


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _ready_sandboxes(url: str, token: str) -> list[str]:
    """Sandboxes the service holds in state ready now: live episodes (deleted ones are tombstones)."""
    from sandbox_service.client import SandboxClient

    try:
        with SandboxClient(url, token, timeout=5) as client:
            response = client.request("GET", "/v1/sandboxes", params={"state": "ready"}, retry=False)
            return [item["id"] for item in response.json()]
    except Exception:  # noqa: BLE001 - not up yet, or already gone
        return []


class _Run:
    """`orchard run` in its own process group, with its embedded service's temporary files under `tmp`."""

    def __init__(
        self,
        tmp_path: Path,
        short_tmp: Path,
        micro_config,
        *,
        ignore_sigint: bool,
        extra: tuple[str, ...] = (),
        **update,
    ):
        self.tmp = short_tmp
        self.runs = tmp_path / "runs"
        self.log_path = tmp_path / "orchard.log"
        env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONPATH": str(REPO)}
        # A non-interactive shell starts a background job with SIGINT ignored; Python then installs no
        # KeyboardInterrupt handler (the case where Ctrl-C used to be lost).
        preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipelines.cli",
                    "run",
                    "--preset",
                    "tiny",
                    "--config",
                    str(_micro_file(micro_config, tmp_path, **update)),
                    "--runs-dir",
                    str(self.runs),
                    *extra,
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=preexec,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_sandboxes(self, timeout: float = 240.0, after: str = "done evaluate-teacher") -> tuple[Path, int]:
        """The service's state dir and pid, once it holds a live sandbox in distill (40 tasks: mid-stage).
        The embedded service's port and token are in its temporary directory."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"orchard run ended before any sandbox existed:\n{self.log()[-3000:]}"
            for state in self.tmp.glob("orchard-svc-*/state"):
                svc = state.parent
                if (
                    after in self.log()
                    and (svc / "port").exists()
                    and _ready_sandboxes(
                        f"http://127.0.0.1:{int((svc / 'port').read_text())}", (svc / "token").read_text()
                    )
                ):
                    service = [
                        pid
                        for pid in _children(self.proc.pid)
                        if b"sandbox_service" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    ]
                    assert len(service) == 1, service
                    return state, service[0]
            time.sleep(0.1)
        raise AssertionError(f"no sandbox within {timeout} s:\n{self.log()[-3000:]}")

    def wait_for(self, text: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None and time.monotonic() < deadline, f"no {text!r}:\n{self.log()[-3000:]}"
            time.sleep(0.02)

    def stop_mid_distill(self, sig: int, timeout: float, after: str = "done evaluate-teacher"):
        """Signal the group once distill's sandboxes are live: (state dir, service pid, exit code, seconds)."""
        try:
            state, service = self.wait_for_sandboxes(after=after)
            sent = self.signal(sig)
            code = self.proc.wait(timeout=timeout)
            return state, service, code, time.monotonic() - sent
        finally:
            self.kill()

    def signal(self, sig: int) -> float:
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def short_tmp():
    """TMPDIR of the run: short, as the sandboxes' agent sockets live under it (107-byte socket paths)."""
    path = Path(tempfile.mkdtemp(prefix="oi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _wait_gone(check, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while (left := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _mlflow_runs(runs_dir: Path):
    return _mlflow_runs_at(f"sqlite:///{runs_dir / 'mlflow.db'}")


def _mlflow_runs_at(uri: str):
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("orchard")
    return client.search_runs([experiment.experiment_id])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_stops_the_run_cleanly(tmp_path, short_tmp, micro_config, sig):
    run = _Run(tmp_path, short_tmp, micro_config, ignore_sigint=sig == signal.SIGINT)
    state, service, code, seconds = run.stop_mid_distill(sig, timeout=60)
    log = run.log()
    assert code == 128 + sig, log[-3000:]
    assert seconds < 30, f"took {seconds:.1f} s to stop:\n{log[-3000:]}"
    assert "Traceback" not in log, log[-3000:]
    assert f"interrupted by {signal.Signals(sig).name}: run stopped" in log
    assert not _alive(service), "the embedded sandbox service outlived orchard run"
    assert not leaked_processes(state) and not leaked_mounts(state)

    runs = _mlflow_runs(run.runs)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    parent = next(r for r in runs if r.data.tags.get("orchard.stage") == "pipeline")
    assert parent.info.status == "KILLED"
    assert parent.data.tags["orchard.failure_reason"] == f"RunInterrupted: interrupted by {signal.Signals(sig).name}"
    assert parent.data.tags["orchard.failed_stage"] == "distill"
    assert [r.info.status for r in runs if r.info.run_name == "distill"] == ["KILLED"]
    assert sorted(r.info.run_name for r in runs if r.info.status == "FINISHED") == [
        "evaluate-teacher",
        "init-policy",
        "provision",
    ]


def test_second_ctrl_c_exits_at_once(tmp_path, short_tmp, micro_config):
    run = _Run(tmp_path, short_tmp, micro_config, ignore_sigint=False)
    try:
        state, service = run.wait_for_sandboxes()
        run.signal(signal.SIGINT)
        # As a person does: again once the first was acknowledged. (Two SIGINTs sent 50 ms apart can reach
        # Python's handler as one when the main thread is in C code under load: the kernel does not queue them.)
        run.wait_for("SIGINT: stopping the run", timeout=30)
        sent = run.signal(signal.SIGINT)
        code = run.proc.wait(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        run.kill()
    assert code == 130, run.log()[-3000:]
    assert seconds < 5, f"the second Ctrl-C took {seconds:.1f} s"
    assert "SIGINT again: exiting now" in run.log()
    # Not waited for, but not orphaned either: the service was told to stop and deletes its sandboxes.
    assert not _wait_gone(lambda: [service] if _alive(service) else [], 60), "the sandbox service kept running"
    assert not _wait_gone(lambda: leaked_processes(state) + leaked_mounts(state), 30)


@pytest.mark.slow  # every component is its own Python process: ~1 min before distill
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_a_kfp_local_run_cleanly(tmp_path, short_tmp, micro_config, sig):
    """`orchard run --kfp-local`: the running component ends its stage, no further component starts, the
    embedded service stops, the parent run is KILLED, and the CLI exits with the signal's code."""
    run = _Run(tmp_path, short_tmp, micro_config, ignore_sigint=False, extra=("--kfp-local",))
    state, service, code, seconds = run.stop_mid_distill(sig, timeout=90, after="distill")
    log = run.log()
    assert code == 128 + sig and seconds < 60, (code, seconds, log[-3000:])
    assert f"interrupted by {signal.Signals(sig).name}: run stopped" in log and "exiting now" not in log
    assert not _wait_gone(lambda: [service] if _alive(service) else [], 30), "the sandbox service outlived the run"
    assert not _wait_gone(lambda: leaked_processes(state) + leaked_mounts(state), 30)
    runs = _mlflow_runs(run.runs)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    parent = next(r for r in runs if r.data.tags.get("orchard.stage") == "pipeline")
    assert parent.info.status == "KILLED"
    assert parent.data.tags["orchard.failure_reason"] == f"RunInterrupted: interrupted by {signal.Signals(sig).name}"
    assert not [r for r in runs if r.info.run_name in ("sft", "rl")], "a component started after the signal"


@pytest.mark.slow  # ~50 s on a loaded 2-core machine: a model is built and trains before the signal
def test_sigterm_stops_training_between_optimizer_steps(tmp_path, short_tmp, micro_config):
    run = _Run(tmp_path, short_tmp, micro_config, ignore_sigint=False, sft={"steps": 5000})
    try:
        run.wait_for("done accumulate")
        time.sleep(3)  # inside SFT's training loop
        sent = run.signal(signal.SIGTERM)
        code = run.proc.wait(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        run.kill()
    assert code == 143 and seconds < 30, (code, seconds, run.log()[-3000:])
    runs = {r.info.run_name: r for r in _mlflow_runs(run.runs)}
    parent = next(r for r in runs.values() if r.data.tags.get("orchard.stage") == "pipeline")
    assert parent.data.tags["orchard.failed_stage"] == "sft" and runs["sft"].info.status == "KILLED"
    assert not list(run.runs.glob("*/sft/model/sft_result.json")), "SFT ran to its end"


def test_sigterm_to_an_argo_stage_step_ends_its_episodes_and_kills_its_run(tmp_path, sandbox_service, micro_config):
    """A stopped workflow (or a pod deadline) sends the stage container SIGTERM."""
    from pipelines.layout import RunLayout
    from pipelines.steps import StepContext, run_in_layout, start_pipeline

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = micro_config.updated(provision={"n_train": 40}).model_dump_json()
    config, parent = start_pipeline(
        preset="tiny",
        recipe="swe",
        seed=0,
        sandbox_url=sandbox_service.url,
        mlflow_uri=uri,
        experiment="orchard",
        overrides_json=overrides,
    )
    layout = RunLayout(tmp_path / "run")
    ctx = StepContext(config, parent, sandbox=sandbox_service.connection())
    run_in_layout("provision", layout, ctx)
    env = {**os.environ, "ORCHARD_SANDBOX_TOKEN": sandbox_service.token, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.steps",
            "run",
            "distill",
            "--run-dir",
            str(layout.root),
            "--config-json",
            config.model_dump_json(),
            "--parent-run-id",
            parent,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert (
            _wait_gone(
                lambda: [] if _ready_sandboxes(sandbox_service.url, sandbox_service.token) else ["none yet"], 240
            )
            == []
        ), "no episode started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "error: stage distill interrupted by SIGTERM: stopped" in out, out[-3000:]
    # the episodes deleted theirs (the service keeps running, as the cluster's does, with its agent zygote)
    assert _ready_sandboxes(sandbox_service.url, sandbox_service.token) == []
    (distill,) = [r for r in _mlflow_runs_at(uri) if r.info.run_name == "distill"]
    assert distill.info.status == "KILLED"
    assert distill.data.tags["orchard.failure_reason"] == "RunInterrupted: interrupted by SIGTERM"
