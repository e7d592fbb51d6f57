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
NAMESPACES = ("orchard", "orchard-sandboxes", "argo", "kubeflow", "kube-system", "local-path-storage")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ORCHARD_TEST_CLUSTER") == "1":
        return
    skip = pytest.mark.skip(reason="needs the test cluster: run `make test-cluster`")
    for item in items:
        if "cluster" in item.keywords:
            item.add_marker(skip)


def kubectl(*args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", KUBECONFIG, *args], capture_output=True, text=True, input=input, timeout=timeout
    )
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
    proc = subprocess.Popen(
        ["kubectl", "--kubeconfig", KUBECONFIG, "-n", namespace, "port-forward", f"service/{name}", f":{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


# --- Workflows and their MLflow runs (the pipeline phases) ----------------------------------------
def submit(spec: dict, name_prefix: str) -> str:
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": name_prefix, "namespace": "orchard"},
        "spec": spec,
    }
    out = kubectl("create", "-f", "-", "-o", "name", input=json.dumps(workflow))
    return out.strip().split("/", 1)[1]


def workflow_finished(name: str) -> dict | None:
    wf = kubectl_json("-n", "orchard", "get", "workflow", name)
    return wf if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error") else None


def node_seconds(node: dict) -> float:
    from datetime import datetime

    start, end = (datetime.fromisoformat(node[k].replace("Z", "+00:00")) for k in ("startedAt", "finishedAt"))
    return (end - start).total_seconds()


def check_succeeded(wf: dict, started: float) -> dict:
    """Print the workflow's steps with their times ([figure]) and fail with every failed step's message
    unless it succeeded."""
    nodes = wf["status"].get("nodes", {}).values()
    steps = sorted(
        (n["startedAt"], n["displayName"], n["phase"], node_seconds(n) if n.get("finishedAt") else -1)
        for n in nodes
        if n.get("type") == "Pod"
    )
    print(
        f"\n[figure] workflow {wf['metadata']['name']}: {wf['status']['phase']} in {time.monotonic() - started:.0f} s; "
        + ", ".join(f"{s[1]} {s[2]} {s[3]:.0f} s" for s in steps)
    )
    failed = [n for n in nodes if n.get("phase") in ("Failed", "Error")]
    assert wf["status"]["phase"] == "Succeeded", (
        wf["status"].get("message"),
        [(n["displayName"], n.get("message")) for n in failed],
    )
    return wf


def wait_workflow(name: str, timeout: float) -> dict:
    start = time.monotonic()
    wf = wait_until(f"workflow {name} finished", lambda: workflow_finished(name), timeout=timeout, interval=5)
    return check_succeeded(wf, start)


def parameters(**values) -> dict:
    return {"parameters": [{"name": k, "value": str(v)} for k, v in values.items()]}


def mlflow_client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=service_url("orchard", "orchard-mlflow"))


def parent_run_id(workflow: dict) -> str | None:
    """The MLflow parent run the workflow's start step opened (a global output), None before it ran."""
    status = workflow.get("status", {})
    for outputs in (status.get("outputs") or {}, *(n.get("outputs") or {} for n in status.get("nodes", {}).values())):
        for p in outputs.get("parameters", []):
            if p["name"] == "parent_run_id" and p.get("value"):
                return p["value"]
    return None


def parent_run(client, workflow: dict, experiment: str):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment}"
    runs = [r for r in client.search_runs([found.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    parent_id = parent_run_id(workflow)
    assert any(r.info.run_id == parent_id for r in runs), "the workflow's parent run is not in MLflow"
    return client.get_run(parent_id)


def child_runs(client, parent) -> list:
    return client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")


def stage_of(run) -> str:
    return run.data.tags.get("orchard.stage") or run.info.run_name
