"""Failures only Events tell, against the fake API server emitting Events as a
kubelet or the scheduler would: final ones fail a create promptly with their reason, transient ones
after a grace counted from the first one seen, and an error the pod got past never fails it."""

from __future__ import annotations

import time

import pytest
from test_kubernetes_contract import SPEC, fake, make_backend  # noqa: F401 - fixtures are used by name

from sandbox_service.backends.kubernetes.backend import PodStartError
from sandbox_service.backends.kubernetes.testing.fake import running_after
from sandbox_service.errors import BackendUnavailableError
from sandbox_service.models import InfraErrorKind, Resources

NO_RUNTIME = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: "
    'no runtime for "runsc" is configured'
)
NO_IPS = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox: "
    'plugin type="calico" failed (add): failed to allocate for range 0: no IP addresses available in range set'
)
NO_NODE = (
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: "
    "0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def pending_with_event(fake, reason: str, message: str, *, from_tick: int = 1, every: int = 25):
    """A kubelet that leaves the pod Pending without an IP and reports `reason` from `from_tick` on,
    again every `every` ticks (kubelet retries; the API server bumps the event's count)."""

    def kubelet(pod, ticks):
        if ticks >= from_tick and (ticks - from_tick) % every == 0:
            fake.emit_event(pod["metadata"]["name"], reason, message)
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}

    return kubelet


def _pods_and_secrets(fake) -> list:
    return fake.of_kind("pods") + fake.of_kind("secrets")


def test_a_final_sandbox_event_fails_the_create_at_once_with_its_reason(fake, tmp_path):
    fake.kubelet = pending_with_event(fake, "FailedCreatePodSandBox", NO_RUNTIME)
    backend = make_backend(fake, tmp_path, start_timeout_seconds=60, runtime_class_name="gvisor")
    started = time.monotonic()
    with pytest.raises(PodStartError) as caught:
        backend.start("sb-noruntime", SPEC, Resources(), "s")
    assert time.monotonic() - started < 30  # not the 60 s start timeout
    assert caught.value.infra_error == InfraErrorKind.UNAVAILABLE and not isinstance(
        caught.value, BackendUnavailableError
    )
    assert "FailedCreatePodSandBox" in caught.value.message and 'no runtime for "runsc"' in caught.value.message
    assert _pods_and_secrets(fake) == []


def test_a_transient_event_fails_only_after_its_grace_from_the_first_one_seen(fake, tmp_path):
    fake.kubelet = pending_with_event(fake, "FailedCreatePodSandBox", NO_IPS, from_tick=50)  # ~1 s in
    backend = make_backend(fake, tmp_path, start_timeout_seconds=60, event_error_grace_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError) as caught:  # retryable: the next pod may land on a node with IPs
        backend.start("sb-noips", SPEC, Resources(), "s")
    elapsed = time.monotonic() - started
    assert 1.9 <= elapsed < 30, elapsed  # the first error came ~1 s in; its grace ran from there
    assert caught.value.infra_error == InfraErrorKind.UNAVAILABLE
    assert "no IP addresses available" in caught.value.message and "FailedCreatePodSandBox" in caught.value.message
    assert _pods_and_secrets(fake) == []


def test_an_early_failed_mount_never_fails_a_pod_that_got_past_it(fake, tmp_path):
    def kubelet(pod, ticks):
        if ticks == 1:  # the Secret had not reached the node yet
            fake.emit_event(
                pod["metadata"]["name"],
                "FailedMount",
                'MountVolume.SetUp failed for volume "orchard-secret" : secret not found',
            )
        if ticks < 60:  # then a slow image pull: the pod has its IP, the container is not running yet
            return {
                "phase": "Pending",
                "podIP": "10.244.1.7",
                "containerStatuses": [
                    {
                        "name": "sandbox",
                        "image": SPEC.image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                ],
            }
        return running_after(0)(pod, ticks)

    fake.kubelet = kubelet
    backend = make_backend(fake, tmp_path, event_error_grace_seconds=0.2)
    assert backend.start("sb-slowpull", SPEC, Resources(), "s").address == "10.244.1.7:8700"


def test_no_node_can_ever_take_it_is_final_without_an_autoscaler_and_waits_with_one(fake, tmp_path):
    fake.kubelet = pending_with_event(fake, "FailedScheduling", NO_NODE)
    fixed = make_backend(
        fake, tmp_path, autoscaled_nodes=False, start_timeout_seconds=60, node_selector={"pool": "sandboxes"}
    )
    with pytest.raises(PodStartError, match="No node can ever take") as caught:
        fixed.start("sb-nonode", SPEC, Resources(), "s")
    assert "didn't match Pod's node affinity/selector" in caught.value.message
    # A pool scaled to zero may still get a node: wait (here, until the start timeout, which names the event).
    autoscaled = make_backend(fake, tmp_path, start_timeout_seconds=1.5)
    with pytest.raises(BackendUnavailableError, match="FailedScheduling") as caught:
        autoscaled.start("sb-scaling", SPEC, Resources(), "s")
    assert caught.value.infra_error == InfraErrorKind.TIMEOUT


def test_one_event_watch_per_backend_of_warning_events_about_pods(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)
    for i in range(3):
        backend.start(f"sb-ev-{i}", SPEC, Resources(), "s")
    (watch,) = fake.sent("WATCH", "events")
    assert watch["query"]["fieldSelector"] == ["type=Warning,involvedObject.kind=Pod"]
    assert len(fake.sent("GET", "events")) == 1  # one LIST, then the watch
