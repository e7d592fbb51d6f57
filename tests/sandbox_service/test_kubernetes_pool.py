"""The Kubernetes warm pool against the fake API server, its pods running the real agent (ProcessKubelet
of the contract test): claims hand over working, re-keyed sandboxes; claims never share a pod; the pool
refills and cleans up after itself."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_kubernetes_contract import agent_node, fake, make_backend, take_over  # noqa: F401 - fixtures

from sandbox_service.agent_link.client import AgentClient
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.backends.kubernetes.config import SANDBOX_ID_LABEL
from sandbox_service.backends.kubernetes.pool import POOL_LABEL
from sandbox_service.errors import SandboxServiceError
from sandbox_service.models import ExecRequest, Resources, SandboxCreate

IMAGE = "ghcr.io/example/swe-task:1"


def wait_until(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def pooled(fake, tmp_path, agent_node):  # noqa: F811 - pytest fixtures
    """A backend with a warm pool of 2 for IMAGE, both warm pods up (their agents answering)."""
    kubelet, settings = agent_node
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    backend = make_backend(
        fake, tmp_path, warm_pools=[{"image": IMAGE, "size": 2, "workdir": str(workspace)}], **settings
    )
    wait_until(lambda: backend.pool.ready() == 2, what="2 warm pods")
    spec = SandboxCreate(image=IMAGE, workdir=str(workspace), labels={"stage": "rl"}, ttl_seconds=600)
    return backend, spec, kubelet


def run_exec(endpoint: AgentEndpoint, command: str, workdir: str) -> str:
    async def go() -> str:
        client = AgentClient(endpoint)
        try:
            result = await client.exec(ExecRequest(command=command), workdir=workdir, env={}, max_output_bytes=4096)
            return result.stdout
        finally:
            await client.close()

    return asyncio.run(go())


def test_a_claim_returns_a_working_sandbox_faster_than_a_cold_create(pooled, fake):
    backend, spec, kubelet = pooled
    warm_pods = {p["metadata"]["name"] for p in fake.of_kind("pods")}
    began = time.monotonic()
    endpoint = backend.start("sb-warm", spec, Resources(), "key-of-sb-warm-0123456789")
    claim_seconds = time.monotonic() - began
    assert run_exec(endpoint, "echo claimed", spec.workdir) == "claimed\n"
    pod = backend._find_pod("sb-warm")
    assert pod.metadata.name in warm_pods  # a warm pod, not a new one
    assert pod.metadata.labels[SANDBOX_ID_LABEL] == "sb-warm" and POOL_LABEL not in pod.metadata.labels
    assert pod.metadata.labels["label.orchard.dev/stage"] == "rl"
    assert 600 < pod.spec.active_deadline_seconds <= 600 + 60  # its age + the sandbox's TTL, set at claim
    secret = fake.objects[("secrets", "orchard", f"{pod.metadata.name}-agent")]
    assert secret["immutable"] is True
    assert base64.b64decode(secret["data"]["agent-secret"]).decode() == "key-of-sb-warm-0123456789"

    cold_spec = spec.model_copy(update={"image": "ghcr.io/example/other:1"})  # no pool: the normal path
    began = time.monotonic()
    cold = backend.start("sb-cold", cold_spec, Resources(), "key-of-sb-cold-0123456789")
    take_over(cold, kubelet.procs[backend._handle("sb-cold").pod_name])  # ready = answered and re-keyed
    cold_seconds = time.monotonic() - began
    assert backend._handle("sb-cold").pod_name not in warm_pods
    assert claim_seconds < cold_seconds, (claim_seconds, cold_seconds)


def test_a_create_asking_for_the_whole_ttl_cap_is_still_served_warm(fake, tmp_path, agent_node):  # noqa: F811
    """Found on a real cluster: warm pods started with the cap as their deadline could never give a create
    the cap's TTL (the default TTL where the service caps at it), so every such create went cold."""
    kubelet, settings = agent_node
    workspace = tmp_path / "ws"
    workspace.mkdir()
    backend = make_backend(
        fake,
        tmp_path,
        warm_pools=[{"image": IMAGE, "size": 1, "workdir": str(workspace)}],
        max_ttl_seconds=600,
        **settings,
    )
    wait_until(lambda: backend.pool.ready() == 1, what="a warm pod")
    time.sleep(1.1)  # the pod is older than a second: age + TTL exceeds the cap
    backend.start(
        "sb-capped",
        SandboxCreate(image=IMAGE, workdir=str(workspace), ttl_seconds=600),
        Resources(),
        "key-of-sb-capped-0123456789",
    )
    assert backend.pool.claimed == 1
    assert 600 < backend._find_pod("sb-capped").spec.active_deadline_seconds <= 600 + 60


def test_a_claimed_pods_agent_rejects_the_pool_key(pooled):
    backend, spec, _ = pooled
    with backend.pool._lock:
        pool_endpoint = backend.pool._ready[next(iter(backend.pool._ready))][0].endpoint
    endpoint = backend.start("sb-rekeyed", spec, Resources(), "the-sandbox-key-0123456789")
    assert endpoint.address == pool_endpoint.address and endpoint.secret != pool_endpoint.secret
    assert run_exec(endpoint, "echo new key", spec.workdir) == "new key\n"
    with pytest.raises(SandboxServiceError, match="secret"):
        run_exec(pool_endpoint, "echo old key", spec.workdir)


def test_concurrent_claims_never_get_the_same_pod(pooled, fake):
    backend, spec, _ = pooled
    barrier = threading.Barrier(4)

    def create(i: int) -> str:
        barrier.wait()
        backend.start(f"sb-race-{i}", spec, Resources(), f"key-of-sb-race-{i}-0123456789")
        return backend._handle(f"sb-race-{i}").pod_name

    with ThreadPoolExecutor(4) as pool:
        names = list(pool.map(create, range(4)))
    assert len(set(names)) == 4  # two claimed (the pool held two), two started cold; none shared
    assert backend.pool.claimed == 2


def test_a_claim_loses_to_a_writer_that_changed_the_pod_first(pooled):
    """Two replicas (or threads) that saw the same resourceVersion: the API server lets one PATCH win."""
    backend, spec, _ = pooled
    warm = backend.pool._take(next(iter(backend.pool.entries)))
    seen = backend.pods.get(warm.pod_name).metadata.resource_version
    with ThreadPoolExecutor(2) as pool:
        won = list(pool.map(lambda sid: backend.pool.relabel(warm, seen, sid, spec, 900), ["sb-a", "sb-b"]))
    assert sorted(won) == [False, True]


def test_the_pool_refills_after_claims(pooled, fake):
    backend, spec, _ = pooled
    backend.start("sb-1", spec, Resources(), "key-of-sb-1-0123456789")
    backend.start("sb-2", spec, Resources(), "key-of-sb-2-0123456789")
    assert backend.pool.claimed == 2
    wait_until(lambda: backend.pool.ready() == 2, what="the pool to refill")
    assert len(fake.of_kind("pods")) == 4 and backend.pool.started == 4


def test_warm_pods_are_never_orphans_and_go_at_shutdown(pooled, fake):
    backend, spec, _ = pooled
    backend.start("sb-kept", spec, Resources(), "key-of-sb-kept-0123456789")
    wait_until(lambda: backend.pool.ready() == 2, what="the pool to refill")
    assert backend.list_orphans() == []  # the sweep leaves this process's warm pods alone
    backend.close()
    left = [p["metadata"]["labels"][SANDBOX_ID_LABEL] for p in fake.of_kind("pods")]
    assert left == ["sb-kept"]  # the warm pods are gone; the claimed sandbox is the service's to stop
    assert [s for s in fake.of_kind("secrets") if POOL_LABEL in s["metadata"]["labels"]] == []


def test_the_fake_enforces_claim_preconditions(fake, tmp_path):  # noqa: F811
    """What the claim relies on from the API server: resourceVersion preconditions on PATCH, deadlines
    only lowered, immutable Secrets unchanged."""
    from kubernetes.client.exceptions import ApiException

    from sandbox_service.backends.kubernetes.testing.fake import running_after

    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)
    backend.start("sb-x", SandboxCreate(image=IMAGE, ttl_seconds=600), Resources(), "s" * 20)
    name = backend._handle("sb-x").pod_name
    rv = fake.objects[("pods", "orchard", name)]["metadata"]["resourceVersion"]
    patch = backend.core.patch_namespaced_pod
    with pytest.raises(ApiException) as err:
        patch(name, "orchard", {"spec": {"activeDeadlineSeconds": 601}})
    assert err.value.status == 422
    patch(name, "orchard", {"metadata": {"resourceVersion": rv}, "spec": {"activeDeadlineSeconds": 300}})
    with pytest.raises(ApiException) as err:
        patch(name, "orchard", {"metadata": {"resourceVersion": rv, "labels": {"a": "b"}}})
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        backend.core.patch_namespaced_secret(f"{name}-agent", "orchard", {"data": {"agent-secret": "eA=="}})
    assert err.value.status == 422


def test_the_service_gets_its_sandboxes_from_the_warm_pool(fake, tmp_path, agent_node):  # noqa: F811
    from test_kubernetes_contract import serve

    kubelet, settings = agent_node
    workspace = tmp_path / "ws"
    backend = make_backend(
        fake, tmp_path, warm_pools=[{"image": IMAGE, "size": 1, "workdir": str(workspace)}], **settings
    )
    wait_until(lambda: backend.pool.ready() == 1, what="a warm pod")
    with serve(backend, tmp_path / "state") as client:
        with client.create(SandboxCreate(image=IMAGE, workdir=str(workspace))) as sandbox:
            assert sandbox.exec("echo from a warm pod").stdout == "from a warm pod\n"
            assert backend.pool.claimed == 1


def test_a_claim_retries_when_only_the_status_moved_on(pooled, fake, monkeypatch):
    """The watch lags the kubelet's status writes: a 409 on a pod still in the pool is retried with a
    fresh resourceVersion, not taken for another replica's claim."""
    backend, spec, _ = pooled
    warm = backend.pool._take(next(iter(backend.pool.entries)))
    stale = backend.pods.get(warm.pod_name)
    fake.set_pod_status(warm.pod_name, fake.objects[("pods", "orchard", warm.pod_name)]["status"])  # rv moves on
    monkeypatch.setattr(backend.pods, "get", lambda name, timeout=30.0: stale)
    endpoint = backend.pool._hand_over(warm, "sb-late", spec, 600, "key-of-sb-late-0123456789")
    assert endpoint is not None and backend._handle("sb-late").pod_name == warm.pod_name
    assert len([r for r in fake.sent("PATCH", "pods") if r["name"] == warm.pod_name]) == 2


# -- the warm pool and adoption together ---------------------------------------
def test_a_claimed_sandbox_survives_a_service_restart(pooled, fake, tmp_path, agent_node):  # noqa: F811
    """The claim writes what adoption reads (spec and resources annotations, claim time, the Secret's CA
    and env): a restarted backend adopts the claimed pod under the same id and exec reaches it."""
    backend, spec, _ = pooled
    _, settings = agent_node
    spec = spec.model_copy(update={"env": {"TOKEN": "from-the-claim"}, "ttl_seconds": 900})
    endpoint = backend.start("sb-kept", spec, Resources(), "key-of-sb-kept-0123456789")
    run_exec(endpoint, "echo before > state.txt", spec.workdir)
    pod_name = backend._handle("sb-kept").pod_name
    backend.close()  # a rollout: the pool deletes its idle pods, the claimed sandbox stays

    restarted = make_backend(fake, tmp_path, **settings)
    (adopted,) = restarted.adopt()
    assert adopted.sandbox_id == "sb-kept" and restarted._handle("sb-kept").pod_name == pod_name
    assert adopted.spec.labels == {"stage": "rl"} and adopted.spec.env == {"TOKEN": "from-the-claim"}
    assert adopted.spec.ttl_seconds == 900  # the claim's spec, not the pool's (max TTL, pool label)
    assert (restarted._clock() - adopted.created_at).total_seconds() < 60  # the TTL counts from the claim
    assert adopted.secret == "key-of-sb-kept-0123456789"
    assert run_exec(adopted.endpoint, "cat state.txt", spec.workdir) == "before\n"  # the very same pod
    assert restarted.list_orphans() == []


def test_a_restart_reaps_unclaimed_warm_pods_and_never_adopts_them(pooled, fake, tmp_path, agent_node):  # noqa: F811
    """A process that died with a full pool: its warm pods look like running sandboxes, but their keys
    died with it; the next start reaps them."""
    backend, _, _ = pooled
    _, settings = agent_node
    pool_ids = {p["metadata"]["annotations"]["orchard.dev/sandbox-id"] for p in fake.of_kind("pods")}
    assert len(pool_ids) == 2
    restarted = make_backend(fake, tmp_path, **settings)  # `backend` plays the process that died
    assert restarted.adopt() == []
    assert set(restarted.list_orphans()) == pool_ids
    for orphan in restarted.list_orphans():
        restarted.stop(orphan)
    assert fake.of_kind("pods") == []


def test_two_replicas_pools_never_touch_each_others_pods(fake, tmp_path, agent_node):  # noqa: F811
    """Warm pods carry their replica's owner label; one replica's shutdown (its LIST by pool label) and
    refill leave the other's pool whole."""
    _, settings = agent_node
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    pools = [{"image": IMAGE, "size": 2, "workdir": str(workspace)}]
    a = make_backend(fake, tmp_path, replica="service-0", warm_pools=pools, **settings)
    b = make_backend(fake, tmp_path, replica="service-1", warm_pools=pools, **settings)
    wait_until(lambda: a.pool.ready() == 2 and b.pool.ready() == 2, what="both pools full")
    owners = sorted(p["metadata"]["labels"]["orchard.dev/owner"] for p in fake.of_kind("pods"))
    assert owners == ["service-0"] * 2 + ["service-1"] * 2
    with b.pool._lock:
        b_pods = {w.pod_name for q in b.pool._ready.values() for w in q}
    a.close()
    assert {p["metadata"]["name"] for p in fake.of_kind("pods")} == b_pods
    assert {s["metadata"]["labels"]["orchard.dev/owner"] for s in fake.of_kind("secrets")} == {"service-1"}
    spec = SandboxCreate(image=IMAGE, workdir=str(workspace))
    endpoint = b.start("sb-on-b", spec, Resources(), "key-of-sb-on-b-0123456789")
    assert b._handle("sb-on-b").pod_name in b_pods and b.pool.claimed == 1
    assert run_exec(endpoint, "echo b", str(workspace)) == "b\n"
