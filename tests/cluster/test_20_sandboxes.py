"""Phase 2: the Kubernetes sandbox backend on real pods, through the in-cluster sandbox service.

Each test is something only a real API server, scheduler, kubelet, runtime and policy enforcer decide:
the injected agent starting in a task image, execs and files over TLS to the pod IP, snapshot and fork,
NetworkPolicy egress actually dropped (and allowed by an allowlist), a command's OOM kill attributed to
the command, sandboxes adopted by a restarted service. The last tests measure create-to-ready on real
pods and keep 100 sandboxes alive at once on the node.
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import os
import statistics
import time

import pytest

from sandbox_service.backends.kubernetes.adopt import CLAIMED_AT_ANNOTATION
from sandbox_service.backends.kubernetes.config import SANDBOX_ID_LABEL
from sandbox_service.backends.kubernetes.objects import label_value
from sandbox_service.backends.kubernetes.pool import POOL_LABEL
from sandbox_service.client import SandboxClient
from sandbox_service.models import ExecOutcome, NetworkPolicy, Resources, SandboxCreate
from tests.cluster.conftest import kubectl, kubectl_json, secret_value, service_url, wait_until

pytestmark = pytest.mark.cluster
# Generated SWE tasks run in the stage runtime's image (Python + pytest), already on the node.
IMAGE = os.environ.get("ORCHARD_TEST_CLUSTER_TASK_IMAGE", "orchard/stage-runtime:0.1.0")


def connect(fresh: bool = False) -> SandboxClient:
    token = secret_value("orchard", "orchard-api-token", "token")
    return SandboxClient(service_url("orchard", "orchard-sandbox-service", fresh=fresh), token, timeout=120)


@pytest.fixture
def client():
    with connect() as c:
        yield c


def spec(**kw) -> SandboxCreate:
    return SandboxCreate(image=IMAGE, resources=Resources(cpu=0.2, memory_mb=256), **kw)


def test_create_exec_files_snapshot_fork_and_delete_on_a_real_pod(client):
    with client.create(spec(), wait_timeout=300) as sandbox:
        result = sandbox.exec(["python", "-c", "import os; print(os.getuid(), open('/proc/1/cmdline').read()[:40])"])
        assert result.ok, result
        sandbox.write_file("notes/a.txt", "first")
        assert sandbox.read_text("notes/a.txt") == "first"
        # No API credentials in a sandbox pod.
        token = sandbox.exec("ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1 || true")
        assert "token" not in token.stdout
        snap = sandbox.snapshot()
        sandbox.write_file("notes/a.txt", "changed")
        with client.create(spec(from_snapshot=snap.id), wait_timeout=300) as fork:
            assert fork.read_text("notes/a.txt") == "first"
        pod = sandbox.id
    wait_until(
        "the sandbox's pod deleted",
        lambda: (
            not kubectl(
                "-n",
                "orchard-sandboxes",
                "get",
                "pods",
                "-l",
                f"{SANDBOX_ID_LABEL}={label_value(pod)}",
                "-o",
                "name",
                check=False,
            ).strip()
        ),
        timeout=120,
    )


def _connect(sandbox, host: str, port: int) -> str:
    code = (
        f"import socket; s = socket.socket(); s.settimeout(3)\n"
        f"try:\n  s.connect(({host!r}, {port})); print('connected')\n"
        f"except OSError as e:\n  print('blocked', e)"
    )
    return sandbox.exec(["python", "-c", code], timeout=20).stdout.strip()


@pytest.fixture(scope="module")
def echo_server():
    """A TCP server in a namespace without policies of its own: only the sandbox's side decides."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orchard-test-echo", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "echo",
                    "image": "docker.io/orchard-cluster/tools:1",
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "while true; do echo hi | nc -l -p 8080; done"],
                }
            ]
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    kubectl("-n", "default", "wait", "--for", "condition=Ready", "pod/orchard-test-echo", "--timeout", "120s")
    yield kubectl_json("-n", "default", "get", "pod", "orchard-test-echo")["status"]["podIP"]
    kubectl("-n", "default", "delete", "pod", "orchard-test-echo", "--wait=false")


def test_network_policy_is_enforced_by_the_node(client, echo_server):
    with client.create(spec(), wait_timeout=300) as closed:
        assert _connect(closed, echo_server, 8080).startswith("blocked")
    with client.create(
        spec(network=NetworkPolicy(mode="allowlist", allow_cidrs=[f"{echo_server}/32"])), wait_timeout=300
    ) as open_:
        assert _connect(open_, echo_server, 8080) == "connected"
        # MLflow and the sandbox API admit pipeline pods only, never a sandbox, whatever its allowlist.
        mlflow = kubectl_json("-n", "orchard", "get", "pods", "-l", "app.kubernetes.io/name=orchard-mlflow")
        assert _connect(open_, mlflow["items"][0]["status"]["podIP"], 5000).startswith("blocked")


def test_a_command_killed_at_the_memory_limit_is_the_commands_oom(client):
    with client.create(spec(), wait_timeout=300) as sandbox:
        hog = sandbox.exec(["python", "-c", "b = [bytearray(16 << 20) for _ in range(64)]"], timeout=60)
        assert hog.outcome is not ExecOutcome.infrastructure_error, hog
        assert hog.reason == "oom", hog
        after = sandbox.exec(["true"], timeout=60)
        assert after.ok, after


def test_sandboxes_survive_a_restart_of_the_service(client):
    sandbox = client.create(spec(), wait_timeout=300)
    sandbox.write_file("kept.txt", "still here")
    kubectl("-n", "orchard", "rollout", "restart", "deploy/orchard-sandbox-service")
    kubectl("-n", "orchard", "rollout", "status", "deploy/orchard-sandbox-service", "--timeout", "300s", timeout=320)
    with connect(fresh=True) as restarted:  # the old port-forward ended with the old pod
        try:
            adopted = wait_until(
                "the restarted service knows the sandbox", lambda: _get(restarted, sandbox.id), timeout=120
            )
            assert adopted.state.value == "ready", adopted
            assert restarted.attach(sandbox.id).read_text("kept.txt") == "still here"
        finally:
            restarted.attach(sandbox.id).delete()


def _get(client, sandbox_id):
    try:
        return client.get(sandbox_id)
    except Exception:
        return None


def test_create_to_ready_on_real_pods(client):
    seconds = []
    for _ in range(10):
        start = time.monotonic()
        with client.create(spec(), wait_timeout=300) as sandbox:
            seconds.append(time.monotonic() - start)
            assert sandbox.exec(["true"]).ok
    seconds.sort()
    print(
        f"\n[figure] create-to-ready on real pods, n=10 sequential: p50 {statistics.median(seconds):.2f} s, "
        f"max {seconds[-1]:.2f} s"
    )


def _ready_pods(selector: str) -> list[dict]:
    pods = kubectl_json("-n", "orchard-sandboxes", "get", "pods", "-l", selector)["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
    ]


def test_a_warm_pool_hands_out_ready_pods_and_refills():
    size, warm = 2, POOL_LABEL
    pool = [{"image": IMAGE, "resources": spec().resources.model_dump(mode="json"), "size": size}]
    kubectl(
        "-n", "orchard", "set", "env", "deploy/orchard-sandbox-service", f"ORCHARD_K8S_WARM_POOLS={json.dumps(pool)}"
    )
    try:
        kubectl(
            "-n", "orchard", "rollout", "status", "deploy/orchard-sandbox-service", "--timeout", "300s", timeout=320
        )
        wait_until(f"{size} ready warm pods", lambda: len(_ready_pods(warm)) >= size, timeout=300)
        with connect(fresh=True) as client:
            start = time.monotonic()
            with client.create(spec(), wait_timeout=300) as sandbox:
                claimed = time.monotonic() - start
                assert sandbox.exec(["true"]).ok
                pod = kubectl_json(
                    "-n", "orchard-sandboxes", "get", "pods", "-l", f"{SANDBOX_ID_LABEL}={label_value(sandbox.id)}"
                )["items"]
                assert len(pod) == 1 and CLAIMED_AT_ANNOTATION in pod[0]["metadata"]["annotations"], pod
                wait_until("the pool refilled", lambda: len(_ready_pods(warm)) >= size, timeout=300)
        print(f"\n[figure] create-to-ready from a warm pool on real pods: {claimed:.2f} s")
    finally:
        kubectl("-n", "orchard", "set", "env", "deploy/orchard-sandbox-service", "ORCHARD_K8S_WARM_POOLS-")
        kubectl(
            "-n", "orchard", "rollout", "status", "deploy/orchard-sandbox-service", "--timeout", "300s", timeout=320
        )


def test_a_hundred_sandboxes_alive_at_once_on_the_node():
    n = 100
    # The dev overlay caps a service at 50 sandboxes; the restart comes back through adoption.
    kubectl("-n", "orchard", "set", "env", "deploy/orchard-sandbox-service", f"ORCHARD_MAX_SANDBOXES={n + 20}")
    kubectl("-n", "orchard", "rollout", "status", "deploy/orchard-sandbox-service", "--timeout", "300s", timeout=320)
    client = connect(fresh=True)
    small = SandboxCreate(image=IMAGE, resources=Resources(cpu=0.2, memory_mb=64), labels={"orchard.test": "hundred"})
    start = time.monotonic()

    def one(i):
        return client.create(small, wait_timeout=900)

    sandboxes = []
    try:
        with futures.ThreadPoolExecutor(16) as pool:
            sandboxes = list(pool.map(one, range(n)))
        ready = time.monotonic() - start
        alive = kubectl_json("-n", "orchard-sandboxes", "get", "pods", "--field-selector", "status.phase=Running")
        assert len(alive["items"]) >= n
        with futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda s: s.exec(["true"], timeout=120), sandboxes))
        assert all(r.ok for r in results)
        print(
            f"\n[figure] {n} sandboxes alive at once: all ready in {ready:.1f} s, one exec each ok "
            f"({time.monotonic() - start:.1f} s in all)"
        )
    finally:
        with futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda s: s.delete(), sandboxes))
        client.close()
