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


def service_url(namespace: str, name: str) -> str:
    """http://<ClusterIP>:<port>: the host routes the Service range into the cluster's namespace."""
    svc = kubectl_json("-n", namespace, "get", "service", name)
    return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"


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
