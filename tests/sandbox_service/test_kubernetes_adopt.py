"""Restarts and replicas of the Kubernetes backend, against the fake API server.

A restarted service adopts its replica's running sandboxes (same ids, exec keeps working) and reaps,
in the background, only what cannot be adopted; two replicas of one instance never touch each
other's sandboxes (owner label = replica identity). The service-level tests run real agents in the
"pods" (`ProcessKubelet` of the contract test): exec after a restart really reaches the same agent.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import httpx

from test_kubernetes_contract import (  # noqa: F401 - fixtures are used by name
    SPEC,
    agent_node,
    fake,
    make_backend,
    sandbox_objects,
    serve,
)

from sandbox_service.backends.kubernetes.testing.fake import running_after, waiting
from sandbox_service.models import Resources, SandboxCreate


def _wait(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _sandbox_ids(fake, kind: str = "pods") -> set[str]:
    return {o["metadata"]["annotations"]["orchard.dev/sandbox-id"] for o in fake.of_kind(kind)}


# -- the service keeps serving its sandboxes across a restart -------------------------------------------
def test_a_restarted_service_adopts_its_sandboxes_and_execs_in_the_same_ids(fake, agent_node, tmp_path):
    kubelet, settings = agent_node
    spec = SandboxCreate(
        image="task:1",
        workdir=str(tmp_path / "ws"),
        env={"TOKEN": "from-the-spec"},
        labels={"run": "r1"},
        resources=Resources(memory_mb=768),
    )
    with serve(make_backend(fake, tmp_path, **settings), tmp_path / "state1") as client:
        kept = client.create(spec).info
        lost = client.create(spec).info
        client.attach(kept.id).write_file("state.txt", "before the restart")
    # A rollout's shutdown leaves ready sandboxes running for the next start.
    assert _sandbox_ids(fake) == {kept.id, lost.id}
    (lost_pod,) = [
        p["metadata"]["name"]
        for p in fake.of_kind("pods")
        if p["metadata"]["annotations"]["orchard.dev/sandbox-id"] == lost.id
    ]
    kubelet._kill(lost_pod)  # its agent died while the service was down: it cannot be adopted

    with serve(make_backend(fake, tmp_path, **settings), tmp_path / "state2", adopt_timeout_seconds=5) as client:
        sandbox = client.attach(kept.id)
        info = sandbox.wait_ready(timeout=30)
        assert (info.id, info.labels, info.resources.memory_mb) == (kept.id, {"run": "r1"}, 768)
        assert sandbox.read_file("state.txt") == b"before the restart"  # the very same pod
        assert sandbox.exec("echo $TOKEN").stdout == "from-the-spec\n"  # the spec's env came back from the Secret
        report = _wait(lambda: (r := client.healthz()["startup_cleanup"])["finished"] and r, what="start-up")
        assert report["sandboxes_adopted"] == [kept.id] and report["sandboxes_removed"] == [lost.id]
        assert client.get(lost.id).state.value == "deleted"
        assert _sandbox_ids(fake) == {kept.id}
        sandbox.delete()
    assert sandbox_objects(fake) == {}


def test_without_adoption_a_shutdown_deletes_and_a_start_reaps(fake, agent_node, tmp_path):
    kubelet, settings = agent_node
    settings = {**settings, "adopt_on_restart": False}
    with serve(make_backend(fake, tmp_path, **settings), tmp_path / "state") as client:
        client.create(SandboxCreate(image="task:1", workdir=str(tmp_path / "ws")))
    assert sandbox_objects(fake) == {}


def test_adoption_takes_only_complete_running_unexpired_sandboxes(fake, tmp_path):
    fake.kubelet = running_after(0)
    old = make_backend(fake, tmp_path)
    for sandbox_id in ("sb-good", "sb-no-secret", "sb-short", "sb-crashed"):
        ttl = 60 if sandbox_id == "sb-short" else 7200
        old.start(sandbox_id, SPEC.model_copy(update={"ttl_seconds": ttl}), Resources(), f"secret-{sandbox_id}")
    fake.objects = {
        k: v
        for k, v in fake.objects.items()  # a Secret deleted by hand
        if not (k[0] == "secrets" and "sb-no-secret" in k[2])
    }
    (crashed,) = [p["metadata"]["name"] for p in fake.of_kind("pods") if "sb-crashed" in p["metadata"]["name"]]
    healthy = fake.kubelet
    fake.kubelet = lambda pod, ticks: (
        waiting("CrashLoopBackOff", "back-off") if pod["metadata"]["name"] == crashed else healthy
    )(pod, ticks)
    later = datetime.now(timezone.utc) + timedelta(seconds=120)  # sb-short's hard TTL has passed
    restarted = make_backend(fake, tmp_path, clock=lambda: later)
    fake.set_pod_status(crashed, fake.kubelet(fake.objects[("pods", "orchard", crashed)], 1))

    (adopted,) = restarted.adopt()
    assert adopted.sandbox_id == "sb-good" and adopted.secret == "secret-sb-good"
    assert adopted.endpoint.address == "10.244.1.7:8700" and adopted.endpoint.tls
    assert "BEGIN CERTIFICATE" in adopted.endpoint.ca_cert_pem and adopted.spec.image == SPEC.image
    assert adopted.spec.labels == SPEC.labels
    assert restarted.status("sb-good").alive
    assert restarted.list_orphans() == ["sb-crashed", "sb-no-secret", "sb-short"]
    for orphan in restarted.list_orphans():
        restarted.stop(orphan)
    assert _sandbox_ids(fake) == {"sb-good"}


def test_adoption_lists_once_and_the_reaper_reuses_that_list(fake, tmp_path):
    fake.kubelet = running_after(0)
    old = make_backend(fake, tmp_path)
    for i in range(5):
        old.start(f"sb-{i}", SPEC, Resources(), "s")
    restarted = make_backend(fake, tmp_path)
    before = len(fake.requests)
    assert len(restarted.adopt()) == 5 and restarted.list_orphans() == []
    calls = [(r["method"], r["kind"], r["name"]) for r in fake.requests[before:] if r["method"] != "WATCH"]
    assert sorted(calls) == sorted([("GET", "pods", None), ("GET", "secrets", None), ("GET", "networkpolicies", None)])
    assert restarted.list_orphans() == []  # a later sweep lists again (and still finds nothing to reap)


# -- replicas never fight ------------------------------------------------------------------------------
def test_two_replicas_never_adopt_sweep_or_reap_each_others_sandboxes(fake, tmp_path):
    fake.kubelet = running_after(0)
    a = make_backend(fake, tmp_path, replica="service-0", orphan_sweep_seconds=0.1)
    b = make_backend(fake, tmp_path, replica="service-1", orphan_sweep_seconds=0.1)
    assert a.list_orphans() == [] and b.list_orphans() == []  # start-up: their sweepers run from now on
    a.start("sb-of-a", SPEC, Resources(), "s")
    b.start("sb-of-b", SPEC, Resources(), "s")
    owners = {
        p["metadata"]["annotations"]["orchard.dev/sandbox-id"]: p["metadata"]["labels"]["orchard.dev/owner"]
        for p in fake.of_kind("pods")
    }
    assert owners == {"sb-of-a": "service-0", "sb-of-b": "service-1"}
    time.sleep(0.6)  # several sweeps of each
    assert _sandbox_ids(fake) == {"sb-of-a", "sb-of-b"}
    assert not a.status("sb-of-b").alive  # a replica does not even see the other's pods

    # replica 0 restarts without adoption: it reaps its own sandboxes, never replica 1's
    restarted = make_backend(fake, tmp_path, replica="service-0", adopt_on_restart=False)
    assert restarted.adopt() == [] and restarted.list_orphans() == ["sb-of-a"]
    restarted.stop("sb-of-a")
    assert _sandbox_ids(fake) == {"sb-of-b"} and b.status("sb-of-b").alive
    # and a restarted replica 1 adopts exactly its own
    assert [s.sandbox_id for s in make_backend(fake, tmp_path, replica="service-1").adopt()] == ["sb-of-b"]


def test_two_services_on_one_cluster_restart_without_touching_each_other(fake, agent_node, tmp_path):
    kubelet, settings = agent_node
    spec = SandboxCreate(image="task:1", workdir=str(tmp_path / "ws"))
    with (
        serve(make_backend(fake, tmp_path, replica="r0", **settings), tmp_path / "s0") as c0,
        serve(make_backend(fake, tmp_path, replica="r1", **settings), tmp_path / "s1") as c1,
    ):
        s0, s1 = c0.create(spec).info, c1.create(spec).info
        # replica 0 restarts while replica 1 keeps running (a rolling restart of a StatefulSet)
    with serve(make_backend(fake, tmp_path, replica="r1", **settings), tmp_path / "s1b") as c1:
        with serve(make_backend(fake, tmp_path, replica="r0", **settings), tmp_path / "s0b") as c0:
            for client, mine, theirs in ((c0, s0, s1), (c1, s1, s0)):
                assert client.attach(mine.id).wait_ready(timeout=30).state.value == "ready"
                assert client.attach(mine.id).exec("echo ok").stdout == "ok\n"
                assert theirs.id not in {s.id for s in client.list()}
            for client in (c0, c1):
                _wait(lambda: client.healthz()["startup_cleanup"]["finished"], what="start-up clean-up")
                assert client.healthz()["startup_cleanup"]["sandboxes_removed"] == []
            c0.attach(s0.id).delete()
            c1.attach(s1.id).delete()
    assert sandbox_objects(fake) == {}


def test_with_the_api_down_at_start_adoption_is_retried_and_nothing_is_reaped_before_it(fake, agent_node, tmp_path):
    kubelet, settings = agent_node
    spec = SandboxCreate(image="task:1", workdir=str(tmp_path / "ws"))
    with serve(make_backend(fake, tmp_path, **settings), tmp_path / "state1") as client:
        kept = client.create(spec).info
    fake.fail("GET", "pods", 503, "ServiceUnavailable", times=10_000)  # the API server is down at the restart
    restarted = make_backend(fake, tmp_path, read_deadline_seconds=0.3, **settings)
    with serve(restarted, tmp_path / "state2") as client:
        down = httpx.get(client.base_url + "/healthz", timeout=30)  # not ready: it cannot create sandboxes
        assert down.status_code == 503 and down.json()["code"] == "backend_unavailable"
        assert any("adopting sandboxes" in e for e in down.json()["startup_cleanup"]["errors"])
        time.sleep(1.5)  # the background task keeps trying; it must not reap what it could not adopt yet
        assert _sandbox_ids(fake) == {kept.id}
        fake.faults.clear()  # the API is back
        sandbox = _wait(
            lambda: kept.id in {s.id for s in client.list()} and client.attach(kept.id), what="the adoption retry"
        )
        assert sandbox.wait_ready(timeout=30).state.value == "ready"
        assert sandbox.exec("echo still here").stdout == "still here\n"
        report = _wait(lambda: (r := client.healthz()["startup_cleanup"])["finished"] and r, what="start-up")
        assert report["sandboxes_adopted"] == [kept.id] and report["sandboxes_removed"] == []
        sandbox.delete()
