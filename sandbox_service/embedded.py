"""`EmbeddedService`: the real sandbox service in a subprocess on a free loopback port.

    with EmbeddedService() as svc:
        with svc.client() as client, client.create() as sandbox:
            sandbox.exec("echo hi")

It runs exactly what production runs (`python -m sandbox_service serve`), with a fresh token (passed
through a 0600 file, never the environment or the command line) and a temporary state directory. On
exit it stops the service (which deletes its sandboxes) and checks that no sandbox process, mount or
cgroup was left behind; a leak raises `LeakError` so tests cannot miss it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sandbox_service.config import ServiceConfig
from sandbox_service.tools.leaks import find_leaks


class LeakError(RuntimeError):
    """The stopped service left sandbox processes, mounts or cgroups behind."""


class EmbeddedService:
    """Context manager around a service subprocess. `.url`, `.token`, `.client()`, `.connection()`."""

    #: Every embedded service started in this process (for a suite-wide leak check).
    started: list["EmbeddedService"] = []

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        startup_timeout: float = 60.0,
        check_leaks: bool = True,
        log_file: Path | None = None,
        python: str | None = None,
    ):
        self.config = config
        self.python = python or sys.executable  # the interpreter the service runs on (path as given)
        self.startup_timeout = startup_timeout
        self.check_leaks = check_leaks
        self.url = ""
        self.token = secrets.token_urlsafe(32)
        self._log_file = log_file
        self._proc: subprocess.Popen | None = None
        self._tmp: Path | None = None
        self.state_dir: Path | None = None
        self.leaks: list[str] = []
        self.sandbox_ids: set[str] = set()

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "EmbeddedService":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="orchard-svc-"))
        base = self.config or ServiceConfig(token="unused")
        fields = base.model_dump(mode="json", exclude={"token", "token_file", "host", "port", "state_dir"})
        explicit_state = self.config is not None and "state_dir" in self.config.model_fields_set
        self.state_dir = Path(base.state_dir) if explicit_state else self._tmp / "state"
        token_file = self._tmp / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.token)
        fields.update(host="127.0.0.1", port=0, state_dir=str(self.state_dir), token_file=str(token_file))
        config_file = self._tmp / "config.json"
        config_file.write_text(json.dumps(fields))
        port_file = self._tmp / "port"
        log_path = self._log_file or self._tmp / "service.log"
        # The child reads its settings from the file only: stray ORCHARD_* variables must not leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
        self._log = open(log_path, "ab")
        self.log_path = log_path
        self._proc = proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "sandbox_service",
                "serve",
                "--config",
                str(config_file),
                "--port-file",
                str(port_file),
                "--log-level",
                "warning",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        EmbeddedService.started.append(self)
        try:
            self._wait_ready(proc, port_file)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, proc: subprocess.Popen, port_file: Path) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox service exited with {proc.returncode} at start:\n{self.log_tail()}")
            if port_file.exists() and not self.url:
                self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
            if self.url:
                try:
                    if httpx.get(self.url + "/healthz", timeout=2.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"sandbox service not healthy after {self.startup_timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.poll() is None:
            self._collect_ids()
            proc.send_signal(signal.SIGTERM)  # graceful: the service deletes its sandboxes
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._log.close()
        self.leaks = self.find_leaks()
        if self.leaks and self.check_leaks:
            raise LeakError(
                f"the sandbox service left {len(self.leaks)} resource(s) behind:\n  "
                + "\n  ".join(self.leaks[:20])
                + f"\nservice log: {self.log_path}"
            )
        if self._log_file is None and self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def request_stop(self) -> None:
        """Ask the service to stop and return at once (it deletes its sandboxes on SIGTERM by itself): for a
        process about to exit without cleaning up (a second Ctrl-C). `stop()` is the normal way: it waits and
        checks for leaks."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def find_leaks(self) -> list[str]:
        """Processes, mounts and cgroups of this service's sandboxes that exist now."""
        return find_leaks(self.state_dir, self.sandbox_ids) if self.state_dir else []

    def _collect_ids(self) -> None:
        """Every sandbox the service still knows (tombstones included), to look for their cgroups later."""
        try:
            with self.client(timeout=10) as client:
                for state in ("pending", "ready", "failed", "deleted"):
                    response = client.request("GET", "/v1/sandboxes", params={"state": state}, retry=False)
                    self.sandbox_ids.update(item["id"] for item in response.json())
        except Exception:  # noqa: BLE001 - a service too broken to answer still gets the other checks
            pass

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    # -- access ---------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The service process's pid while it runs (for CPU accounting, `cpu_accounting.TreeCpu`)."""
        return self._proc.pid if self._proc is not None else None

    def client(self, timeout: float = 60.0):
        from sandbox_service.client import SandboxClient

        return SandboxClient(self.url, self.token, timeout=timeout)

    def async_client(self, timeout: float = 60.0):
        from sandbox_service.client import AsyncSandboxClient

        return AsyncSandboxClient(self.url, self.token, timeout=timeout)

    def connection(self):
        from sandbox_service.connection import SandboxConnection

        return SandboxConnection(url=self.url, token=self.token)
