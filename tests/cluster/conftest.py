"""Fixtures of the real-cluster tests (`make test-cluster`, marker `cluster`).

They run only against the single-node cluster `scripts/cluster/up.sh` starts (`ORCHARD_TEST_CLUSTER=1`,
set by `scripts/cluster/test.sh`); elsewhere they are skipped, never faked. The modules run in name order
(deploy, sandboxes, pipeline); each prints its phase's time. A failing test prints the events and logs of
every pod that is not Running or Succeeded in the cluster's namespaces.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KUBECONFIG = os.environ.get("KUBECONFIG", "/var/lib/orchard-cluster/admin.kubeconfig")
NAMESPACES = ("orchard", "orchard-sandboxes", "argo", "kube-system", "local-path-storage")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ORCHARD_TEST_CLUSTER") == "1":
        return
    skip = pytest.mark.skip(reason="needs the test cluster: run `make test-cluster`")
    for item in items:
        if "cluster" in item.keywords:
            item.add_marker(skip)


def kubectl(*args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(["kubectl", "--kubeconfig", KUBECONFIG, *args], capture_output=True, text=True,
                          input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def wait_until(what: str, predicate, timeout: float, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)


def secret_value(namespace: str, name: str, key: str) -> str:
    data = kubectl_json("-n", namespace, "get", "secret", name)["data"][key]
    return base64.b64decode(data).decode()


_forwards: dict[tuple[str, str], tuple[subprocess.Popen, str]] = {}


def service_url(namespace: str, name: str, fresh: bool = False) -> str:
    """A local URL of a Service, through `kubectl port-forward` as a user reaches it (namespace orchard's
    NetworkPolicy admits only the pipeline's pods; a port-forward enters the pod's own network). One
    forward per Service for the session; a dead one is started again, and `fresh` starts a new one (a
    forward stays bound to the pod it began with: after a restart it is a stale listener)."""
    key = (namespace, name)
    if fresh and key in _forwards:
        _forwards.pop(key)[0].kill()
    if key in _forwards and _forwards[key][0].poll() is None:
        url = _forwards[key][1]
        try:
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
            return url
        except OSError:
            _forwards[key][0].kill()
    svc = kubectl_json("-n", namespace, "get", "service", name)
    port = svc["spec"]["ports"][0]["port"]
    proc = subprocess.Popen(["kubectl", "--kubeconfig", KUBECONFIG, "-n", namespace, "port-forward",
                             f"service/{name}", f":{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> PORT"
    if "Forwarding from 127.0.0.1:" not in line:
        proc.kill()
        raise AssertionError(f"kubectl port-forward {namespace}/{name}: {line}{proc.stderr.read()[-2000:]}")
    local = int(line.split("127.0.0.1:", 1)[1].split()[0])
    url = f"http://127.0.0.1:{local}"
    _forwards[key] = (proc, url)
    return url


@pytest.fixture(scope="session", autouse=True)
def _stop_port_forwards():
    yield
    for proc, _ in _forwards.values():
        proc.kill()


def dump_unhealthy_pods() -> str:
    out = []
    for ns in NAMESPACES:
        try:
            pods = kubectl_json("-n", ns, "get", "pods")["items"]
        except AssertionError:
            continue
        for pod in pods:
            if pod["status"].get("phase") in ("Running", "Succeeded"):
                if all(c.get("ready") for c in pod["status"].get("containerStatuses", [])):
                    continue
            name = pod["metadata"]["name"]
            out.append(f"==== {ns}/{name}: {pod['status'].get('phase')}")
            out.append(kubectl("-n", ns, "describe", "pod", name, check=False)[-4000:])
            out.append(kubectl("-n", ns, "logs", name, "--all-containers", "--tail", "60", check=False)[-6000:])
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "cluster" in item.keywords:
        report.sections.append(("failing pods: events and logs", dump_unhealthy_pods()))


@pytest.fixture(scope="module", autouse=True)
def _phase_time(request):
    start = time.monotonic()
    yield
    print(f"\n[phase] {request.module.__name__.rsplit('.', 1)[-1]}: {time.monotonic() - start:.1f} s")
