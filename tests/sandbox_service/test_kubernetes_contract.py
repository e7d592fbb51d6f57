"""Contract test of the Kubernetes backend against an in-process fake of the API endpoints it uses.

There is no cluster here. What this covers: the real `kubernetes` client, pointed at a small HTTP
server on 127.0.0.1 (`Configuration(host=...)`, `sandbox_service/backends/kubernetes/testing/fake.py`), sends
the requests the backend makes, its pod watch included (410 Gone, re-list); the fake checks each body against the
Kubernetes OpenAPI schema (kubernetes-validate, strict) and the API
server's name/label rules, assigns uids and resourceVersions, garbage-collects dependents by their
ownerReferences, answers 404/409 like the API server, and injects 409/429/5xx faults. Pod status is
scripted per test (Pending -> Running with an IP, OOMKilled, ErrImagePull, Unschedulable, ...).

What it does not cover: a real API server's admission (quotas, PodSecurity, webhooks), a scheduler,
a kubelet pulling images and starting containers, a CNI enforcing the NetworkPolicy. Those run only
in `scripts/smoke-k8s.sh` against a real cluster, which has not been run from this repository's CI.

The last tests run the real agent with the exact command and TLS material the backend puts in the
pod (the injected layout emulated in a temp dir, this machine's Python standing in for the
standalone one), so the pod command, the Secret's certificate and the agent client agree.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from kubernetes import client as k8s

from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.backends.kubernetes.backend import KubernetesBackend, PodStartError
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.decode import FastApiClient
from sandbox_service.backends.kubernetes.testing.fake import FakeKubernetesAPI, running_after, waiting
from sandbox_service.errors import BackendUnavailableError, InvalidRequestError, SandboxServiceError
from sandbox_service.models import ExecOutcome, InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

REPO = Path(__file__).resolve().parents[2]


class Sleeps(list):
    """Records backoff sleeps instead of sleeping, so retry tests take no wall time."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def fake():
    api = FakeKubernetesAPI()
    api.backends = []  # closed at the end: their pod watches stop
    yield api
    for backend in api.backends:
        backend.close()
    api.close()


def make_backend(
    fake: FakeKubernetesAPI,
    tmp_path: Path,
    sleeps: Sleeps | None = None,
    clock=None,
    agent_factory=None,
    resolver=lambda host: ["93.184.216.34"],
    **overrides,
) -> KubernetesBackend:
    settings = dict(
        namespace="orchard",
        snapshot_dir=tmp_path / "snapshots",
        image_pull_grace_seconds=0,
        unschedulable_timeout_seconds=60,
        start_timeout_seconds=20,
        retry_attempts=4,
    )
    settings.update(overrides)
    configuration = k8s.Configuration(host=fake.url)
    kwargs = {"clock": clock} if clock else {}
    if agent_factory is not None:
        kwargs["agent_factory"] = agent_factory
    backend = KubernetesBackend(
        KubernetesBackendConfig(**settings),
        api_client=FastApiClient(configuration),
        sleep=sleeps if sleeps is not None else Sleeps(),
        resolver=resolver,
        **kwargs,
    )
    fake.backends.append(backend)
    return backend


def sandbox_objects(fake: FakeKubernetesAPI) -> dict:
    """Every object but the instance's shared deny-all NetworkPolicy (it outlives sandboxes on purpose)."""
    return {k: v for k, v in fake.objects.items() if not k[2].startswith("orchard-sandboxes-")}


SPEC = SandboxCreate(image="docker.io/library/python:3.12-slim", labels={"task": "swe/django-1234", "stage": "rl"})


def test_the_fake_refuses_what_the_api_server_would(fake, tmp_path):
    """The fake is only a contract if it can say no: schema errors and label rules give 422."""
    core = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=fake.url)))
    bad_label = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="x", labels={"task": "swe/1"}))
    with pytest.raises(k8s.exceptions.ApiException) as caught:
        core.create_namespaced_secret("orchard", bad_label)
    assert caught.value.status == 422 and "label value" in caught.value.body
    bad_schema = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "Sometimes", "bogus": 1}]},
    }
    with pytest.raises(k8s.exceptions.ApiException) as caught:
        core.create_namespaced_pod("orchard", bad_schema)
    assert caught.value.status == 422 and "schema" in caught.value.body
    assert fake.objects == {}


# -- creation -------------------------------------------------------------------------------------------
def test_start_sends_secret_pod_and_networkpolicy_with_labels_and_owners(fake, tmp_path):
    fake.kubelet = running_after(reads_pending=2)
    backend = make_backend(fake, tmp_path)
    endpoint = backend.start("sb-0001", SPEC, Resources(cpu=2, memory_mb=2048), "s3cret")

    assert endpoint.transport == "tcp" and endpoint.address == "10.244.1.7:8700"
    assert endpoint.tls and endpoint.secret == "s3cret" and "BEGIN CERTIFICATE" in endpoint.ca_cert_pem
    assert [(r["method"], r["kind"]) for r in fake.requests[:4]] == [
        ("POST", "networkpolicies"),
        ("POST", "secrets"),
        ("POST", "pods"),
        ("PATCH", "secrets"),
    ]
    # It waited through Pending on the backend's one pod watch: not a single read of its pod.
    assert [r for r in fake.sent("GET", "pods") if r["name"]] == [] and len(fake.sent("GET", "pods")) == 1

    (pod,), (secret,), (policy,) = fake.of_kind("pods"), fake.of_kind("secrets"), fake.of_kind("networkpolicies")
    for obj in (pod, secret):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "orchard"
        assert labels["orchard.dev/sandbox-id"] == "sb-0001"
        assert labels["label.orchard.dev/task"] == "swe-django-1234-" + labels["label.orchard.dev/task"][-8:]
        assert obj["metadata"]["annotations"]["orchard.dev/sandbox-id"] == "sb-0001"
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    assert secret["metadata"]["ownerReferences"] == [owner]
    patch_type = [c for m, p, c in fake.content_types if m == "PATCH"]
    assert patch_type == ["application/strategic-merge-patch+json"]

    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == int(SPEC.ttl_seconds)
    main = spec["containers"][0]
    assert main["image"] == SPEC.image and "--tcp" in main["command"] and "[::]:8700" in main["command"]
    assert "--inherit-env" in main["command"] and "env" not in main  # the image's own ENV reaches commands
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert secret["immutable"] is True
    assert main["resources"]["limits"] == {"cpu": "2000m", "memory": "2112Mi", "ephemeral-storage": "2304Mi"}
    assert not any("serviceaccount" in (m["mountPath"]) for m in main["volumeMounts"])
    assert spec["initContainers"][0]["image"] == backend.config.injector_image
    assert base64.b64decode(secret["data"]["agent-secret"]).decode() == "s3cret"

    # mode none: no policy of its own; the instance's shared one (made before the pod) denies egress
    assert policy["metadata"]["name"] == "orchard-sandboxes-default" and "ownerReferences" not in policy["metadata"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["egress"] == []
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "orchard",
        "orchard.dev/service-instance": "default",
    }
    assert all(pod["metadata"]["labels"][k] == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8700}]

    # ownerReferences point at the right uid: deleting the pod alone takes the others with it
    k8s.CoreV1Api(backend.api_client).delete_namespaced_pod(pod["metadata"]["name"], "orchard")
    assert sandbox_objects(fake) == {}
    backend.close()


def test_image_pull_failure_fails_start_with_the_image_name_and_leaks_nothing(fake, tmp_path):
    fake.kubelet = waiting("ErrImagePull", 'rpc error: manifest for "nope:1" not found')
    backend = make_backend(fake, tmp_path)
    with pytest.raises(PodStartError) as caught:
        backend.start("sb-pull", SPEC.model_copy(update={"image": "registry.example/nope:1"}), Resources(), "s")
    assert caught.value.infra_error == InfraErrorKind.IMAGE_PULL_FAILED
    assert "registry.example/nope:1" in caught.value.message and "ErrImagePull" in caught.value.message
    assert not isinstance(caught.value, BackendUnavailableError)  # the service must not retry a bad image
    assert sandbox_objects(fake) == {}


def test_image_pull_backoff_within_grace_keeps_waiting(fake, tmp_path):
    state = {"pull_failed_reads": 3}

    def kubelet(pod, reads):
        if reads <= state["pull_failed_reads"]:
            return waiting("ImagePullBackOff", "Back-off pulling image")(pod, reads)
        return running_after(0)(pod, reads)

    fake.kubelet = kubelet
    backend = make_backend(fake, tmp_path, image_pull_grace_seconds=30)
    assert backend.start("sb-slowpull", SPEC, Resources(), "s").address.endswith(":8700")


def test_unschedulable_for_too_long_is_retryable_unavailable(fake, tmp_path):
    created = datetime.now(timezone.utc)
    fake.kubelet = lambda pod, reads: {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory.",
            }
        ],
    }
    backend = make_backend(fake, tmp_path, clock=lambda: created + timedelta(seconds=61))
    with pytest.raises(BackendUnavailableError) as caught:
        backend.start("sb-big", SPEC, Resources(memory_mb=512_000), "s")
    assert caught.value.infra_error == InfraErrorKind.UNAVAILABLE
    assert "Insufficient memory" in caught.value.message
    assert sandbox_objects(fake) == {}


def test_start_timeout_is_retryable_and_cleans_up(fake, tmp_path):
    fake.kubelet = lambda pod, reads: {"phase": "Pending"}
    backend = make_backend(fake, tmp_path, start_timeout_seconds=0.3)
    with pytest.raises(BackendUnavailableError) as caught:
        backend.start("sb-slow", SPEC, Resources(), "s")
    assert caught.value.infra_error == InfraErrorKind.TIMEOUT
    assert sandbox_objects(fake) == {}


def test_missing_image_is_refused_before_any_request(fake, tmp_path):
    backend = make_backend(fake, tmp_path)
    with pytest.raises(InvalidRequestError, match="SandboxCreate.image"):
        backend.start("sb-noimage", SandboxCreate(), Resources(), "s")
    assert fake.sent("POST", "pods") == [] and sandbox_objects(fake) == {}


def test_a_create_without_an_image_runs_the_services_default_image(fake, tmp_path):
    # Generated tasks name no image: on a cluster they run in the configured one (dev: the stage runtime).
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path, default_image="orchard/stage-runtime:0.1.0")
    backend.start("sb-default", SandboxCreate(), Resources(), "s")
    (pod,) = fake.of_kind("pods")
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert "orchard/stage-runtime:0.1.0" in images.values(), images


# -- retries ----------------------------------------------------------------------------------------------
def test_retries_429_with_retry_after_500_and_quota_conflict_then_succeeds(fake, tmp_path):
    fake.kubelet = running_after(0)
    fake.fail("POST", "pods", 429, "TooManyRequests", headers={"Retry-After": "3"})
    fake.fail("POST", "pods", 500, "InternalError")
    fake.fail("POST", "pods", 409, "Conflict")  # e.g. "Operation cannot be fulfilled on resourcequotas"
    sleeps = Sleeps()
    backend = make_backend(fake, tmp_path, sleeps=sleeps)
    backend.start("sb-retry", SPEC, Resources(), "s")
    assert len(fake.sent("POST", "pods")) == 4 and len(fake.of_kind("pods")) == 1
    assert sleeps[0] == 3.0  # Retry-After obeyed
    assert all(0 <= s <= backend.config.retry_max_seconds for s in sleeps[1:3])


def test_lost_create_response_reads_back_the_existing_pod(fake, tmp_path):
    fake.kubelet = running_after(0)
    fake.fail("POST", "pods", 503, "ServiceUnavailable", after=True)  # created, but the answer was lost
    backend = make_backend(fake, tmp_path)
    endpoint = backend.start("sb-lost", SPEC, Resources(), "s")
    assert endpoint.address.startswith("10.244.1.7")
    posts = fake.sent("POST", "pods")
    assert len(posts) == 2 and len(fake.of_kind("pods")) == 1  # the retry met AlreadyExists, then read it


def test_persistent_5xx_becomes_backend_unavailable_after_the_configured_attempts(fake, tmp_path):
    fake.fail("POST", "secrets", 503, "ServiceUnavailable", times=100)
    backend = make_backend(fake, tmp_path, retry_attempts=3)
    with pytest.raises(BackendUnavailableError, match="after 3 attempts") as caught:
        backend.start("sb-down", SPEC, Resources(), "s")
    assert caught.value.infra_error == InfraErrorKind.UNAVAILABLE
    assert len(fake.sent("POST", "secrets")) == 3


def test_forbidden_is_not_retried_and_names_the_role(fake, tmp_path):
    fake.fail("POST", "secrets", 403, "Forbidden")
    backend = make_backend(fake, tmp_path)
    with pytest.raises(SandboxServiceError, match="rbac.yaml") as caught:
        backend.start("sb-rbac", SPEC, Resources(), "s")
    assert not isinstance(caught.value, BackendUnavailableError)
    assert len(fake.sent("POST", "secrets")) == 1


# -- status -----------------------------------------------------------------------------------------------
def _terminated(reason: str, code: int) -> dict:
    return {"terminated": {"reason": reason, "exitCode": code}}


@pytest.mark.parametrize(
    "status, kind, alive, words",
    [
        ({"phase": "Running", "podIP": "10.0.0.9"}, None, True, ""),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "sandbox",
                        "image": "i",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": _terminated("OOMKilled", 137),
                    }
                ],
            },
            InfraErrorKind.OOM_KILLED,
            False,
            "memory limit",
        ),
        (
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: ephemeral-storage.",
                "containerStatuses": [
                    {
                        "name": "sandbox",
                        "image": "i",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": _terminated("ContainerStatusUnknown", 137),
                    }
                ],
            },
            InfraErrorKind.SANDBOX_CRASHED,
            False,
            "evicted",
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded"}, InfraErrorKind.SANDBOX_DELETED, False, "lifetime"),
        (
            {
                "phase": "Running",
                "podIP": "10.0.0.9",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "drain",
                    }
                ],
            },
            InfraErrorKind.SANDBOX_CRASHED,
            False,
            "disrupted",
        ),
        ({"phase": "Unknown"}, InfraErrorKind.AGENT_LOST, False, "node"),
    ],
)
def test_status_maps_pod_state(fake, tmp_path, status, kind, alive, words):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)
    backend.start("sb-status", SPEC, Resources(), "s")
    fake.kubelet = None
    fake.set_pod_status(fake.of_kind("pods")[0]["metadata"]["name"], status)
    assert backend.pods.wait_version(fake._rv, timeout=10)  # the watch delivers the kubelet's update
    seen = backend.status("sb-status")
    assert (seen.alive, seen.infra_error) == (alive, kind)
    assert words in (seen.message or "")


def test_status_of_a_deleted_pod_and_of_a_restarted_service(fake, tmp_path):
    fake.kubelet = running_after(0)
    first = make_backend(fake, tmp_path)
    first.start("sb-st2", SPEC, Resources(), "s")
    second = make_backend(fake, tmp_path)  # knows no pod names: finds the pod by its labels
    assert second.status("sb-st2").alive
    k8s.CoreV1Api(first.api_client).delete_namespaced_pod(fake.of_kind("pods")[0]["metadata"]["name"], "orchard")
    deadline = time.monotonic() + 10
    while (gone := first.status("sb-st2")).alive:  # the watch delivers the deletion
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert (gone.alive, gone.infra_error) == (False, InfraErrorKind.SANDBOX_DELETED)


# -- deletion and orphans -------------------------------------------------------------------------------
def test_stop_deletes_every_object_and_is_idempotent(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path, delete_grace_seconds=2)
    backend.start("sb-stop", SPEC, Resources(), "s")
    backend.stop("sb-stop")
    assert sandbox_objects(fake) == {}
    deletes = fake.sent("DELETE", "pods")
    assert deletes[0]["query"]["gracePeriodSeconds"] == ["2"]
    backend.stop("sb-stop")  # nothing left: still fine
    backend.stop("sb-never-existed")


def test_list_orphans_finds_a_dead_services_sandboxes_and_only_its_instances(fake, tmp_path):
    fake.kubelet = running_after(0)
    old = make_backend(fake, tmp_path)
    old.start("sb-a", SPEC, Resources(), "s")
    old.start("sb-b", SPEC, Resources(), "s")
    other = make_backend(fake, tmp_path, instance="other")
    other.start("sb-c", SPEC, Resources(), "s")
    # half-created leftovers count too: a Secret whose pod never came
    fake.objects = {
        k: v
        for k, v in fake.objects.items()
        if not (k[0] == "pods" and "sb-b" in v["metadata"]["annotations"]["orchard.dev/sandbox-id"])
    }
    assert old.list_orphans() == []  # everything it holds it knows
    restarted = make_backend(fake, tmp_path)
    assert restarted.list_orphans() == ["sb-a", "sb-b"]
    for sandbox_id in restarted.list_orphans():
        restarted.stop(sandbox_id)
    left = {o["metadata"]["annotations"]["orchard.dev/sandbox-id"] for o in sandbox_objects(fake).values()}
    assert left == {"sb-c"}


# -- network policy ----------------------------------------------------------------------------------------
def test_apply_network_policy_replaces_with_a_conflict_retry(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)
    backend.start(
        "sb-net",
        SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_cidrs=["10.30.0.0/16"])}),
        Resources(),
        "s",
    )
    fake.fail("PUT", "networkpolicies", 409, "Conflict")
    backend.apply_network_policy(
        "sb-net", NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"], allow_cidrs=["10.20.0.0/16"])
    )
    assert len(fake.sent("PUT", "networkpolicies")) == 2
    (policy,) = [p for p in fake.of_kind("networkpolicies") if "ownerReferences" in p["metadata"]]
    assert policy["spec"]["policyTypes"] == ["Egress"] and "ingress" not in policy["spec"]
    egress = policy["spec"]["egress"]
    assert egress[0]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}, {"ipBlock": {"cidr": "93.184.216.34/32"}}]
    assert egress[1]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert egress[1]["to"][1] == {"ipBlock": {"cidr": "169.254.20.10/32"}}  # NodeLocal DNSCache
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    backend.apply_network_policy("sb-net", NetworkPolicy(mode="none"))
    assert [p["metadata"]["name"] for p in fake.of_kind("networkpolicies")] == ["orchard-sandboxes-default"]
    with pytest.raises(InvalidRequestError, match="not a CIDR"):
        backend.apply_network_policy("sb-net", NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/33"]))


# The nodes' own addresses (node_cidrs) and an allowlist that holds them: through a wider CIDR (10.0.0.0/8,
# ::/0) they stay closed, named one by one (10.30.0.7/32) they open, and a CIDR made only of them
# (10.30.0.128/25) opens nothing (the local backend's rule for the host's own addresses).
NODE_CIDRS = ["10.30.0.0/24", "fd00:30::/64"]
NODES_IN_ALLOWLIST = NetworkPolicy(
    mode="allowlist", allow_cidrs=["10.0.0.0/8", "10.30.0.7/32", "10.30.0.128/25", "::/0"]
)


def test_the_nodes_own_addresses_open_only_when_named_one_by_one(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path, node_cidrs=NODE_CIDRS)
    backend.start("sb-nodes", SPEC.model_copy(update={"network": NODES_IN_ALLOWLIST}), Resources(), "s")
    (policy,) = [p for p in fake.of_kind("networkpolicies") if "ownerReferences" in p["metadata"]]
    assert policy["spec"]["egress"][0]["to"] == [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.30.0.0/24"]}},
        {"ipBlock": {"cidr": "10.30.0.7/32"}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128", "fd00:ec2::23/128", "fd00:30::/64"]}},
    ]


# -- RBAC: the Role grants exactly what the backend uses ---------------------------------------------------
class AnsweringAgent:
    """An agent that answers a warm pool's ping and re-key (the real one runs in the tests below)."""

    def __init__(self, endpoint: AgentEndpoint):
        self.endpoint = endpoint

    async def ping(self, timeout: float = 1.0) -> dict:
        return {}

    async def rekey(self, new_secret: str) -> None:
        pass

    async def close(self) -> None:
        pass


# The fake's kind keys of the FQDN policies, and every kind key as `resource.group` (what a Role names).
KIND_KEYS = {"antrea-fqdn": "networkpolicies.crd.antrea.io", "calico-dns": "networkpolicies.projectcalico.org"}
_GROUPS = {
    "pods": "",
    "secrets": "",
    "events": "",
    "networkpolicies": "networking.k8s.io",
    "ciliumnetworkpolicies": "cilium.io",
}


def qualified(kind: str) -> str:
    if "." in kind:  # already `plural.group`
        return kind
    return f"{kind}.{_GROUPS[kind]}" if _GROUPS[kind] else kind


def test_the_role_in_the_manifests_grants_exactly_the_calls_the_backend_makes(fake, tmp_path):
    import yaml

    fake.kubelet = running_after(0)
    fake.gc_enabled = False  # so stop() deletes the Secret and NetworkPolicy itself
    fake.fail("POST", "secrets", 500, "InternalError", after=True)  # so the create reads its Secret back
    fake.fail("POST", "pods", 500, "InternalError", after=True)  # and its pod
    backend = make_backend(fake, tmp_path)
    backend.start("sb-rbac-1", SPEC, Resources(), "s")
    backend.status("sb-rbac-1")
    backend.apply_network_policy("sb-rbac-1", NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/8"]))
    backend.apply_network_policy("sb-rbac-1", NetworkPolicy(mode="allowlist", allow_cidrs=["10.1.0.0/16"]))
    backend.stop("sb-rbac-1")
    make_backend(fake, tmp_path).status("sb-unknown")  # the by-label path
    backend.list_orphans()
    pooled = make_backend(
        fake,
        tmp_path,
        agent_factory=AnsweringAgent,  # a warm pool: fill, claim, shutdown
        warm_pools=[{"image": SPEC.image, "size": 1}],
    )
    deadline = time.monotonic() + 20
    while not pooled.pool.ready():
        assert time.monotonic() < deadline, "no warm pod"
        time.sleep(0.02)
    pooled.start("sb-rbac-2", SPEC, Resources(), "s" * 20)
    pooled.close()
    cilium = make_backend(fake, tmp_path, host_policy="cilium-fqdn")  # its CiliumNetworkPolicy rule
    fake.fail("POST", "ciliumnetworkpolicies", 500, "InternalError", after=True)  # read back: get
    cilium.start(
        "sb-rbac-3",
        SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"])}),
        Resources(),
        "s",
    )
    cilium.apply_network_policy("sb-rbac-3", NetworkPolicy(mode="allowlist", allow_hosts=["files.pythonhosted.org"]))
    cilium.stop("sb-rbac-3")
    for n, host_policy in enumerate(("antrea-fqdn", "calico-dns")):  # the other FQDN policies' rules
        fqdn = make_backend(fake, tmp_path, host_policy=host_policy)
        fake.fail("POST", KIND_KEYS[host_policy], 500, "InternalError", after=True)
        fqdn.start(
            f"sb-rbac-fqdn-{n}",
            SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"])}),
            Resources(),
            "s",
        )
        fqdn.stop(f"sb-rbac-fqdn-{n}")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete", "WATCH": "watch"}
    used = {(qualified(r["kind"]), verb.get(r["method"]) or ("get" if r["name"] else "list")) for r in fake.requests}
    (role,) = [d for d in yaml.safe_load_all((REPO / "manifests/base/rbac.yaml").read_text()) if d["kind"] == "Role"]
    # tier.networkpolicies is no resource anyone requests: Calico's API server checks it on top of networkpolicies
    granted = {
        (f"{resource}.{group}" if group else resource, v)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if resource != "tier.networkpolicies"
        for v in rule["verbs"]
    }
    assert used == granted


# -- the real agent with what the backend puts into the pod ------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inject_layout(mount: Path) -> None:
    """Lay out the agent exactly as the injector's Dockerfile COPY lines do, with /opt/orchard -> mount."""
    (mount / "python" / "bin").mkdir(parents=True)
    os.symlink(sys._base_executable, mount / "python" / "bin" / "python3")  # stands in for the standalone build
    dockerfile = (REPO / "docker" / "agent-injector" / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(\S+) /opt/orchard/(\S+)$", dockerfile, re.M)
    assert copies, "no COPY into /opt/orchard in docker/agent-injector/Dockerfile"
    for source, target in copies:
        destination = mount / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / source, destination)


# What a container runtime gives a task image's first process: the image's ENV (here a JDK and a conda
# image's kind), not the pod spec's (which is empty).
IMAGE_ENV = {
    "PATH": f"/opt/conda/bin:/opt/jdk/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
    "JAVA_HOME": "/opt/jdk",
    "HOME": "/home/task",
    "CONDA_PREFIX": "/opt/conda",
}


class ProcessKubelet:
    """A kubelet for one node: on a pod's first read it mounts the pod's Secret (writes its files) and
    runs the main container's command as a local process with the image's environment (IMAGE_ENV);
    deleting the pod kills it. Each pod gets its own loopback address (127.0.0.N) as its pod IP, the
    agent's bind address rewritten to it: pods on a real node each have their own network namespace.
    `oom(pod_name)` kills it the way the kernel would and reports OOMKilled from then on."""

    def __init__(self, fake: FakeKubernetesAPI, secret_dir: Path, cwd: Path):
        self.fake, self.secret_dir, self.cwd = fake, secret_dir, cwd
        self.procs: dict[str, subprocess.Popen] = {}
        self.ips: dict[str, str] = {}
        self.oom_killed: dict[str, float] = {}  # pod name -> when the kubelet reports it
        fake.kubelet = self
        fake.on_delete = self.deleted

    def __call__(self, pod: dict, reads: int) -> dict:
        name = pod["metadata"]["name"]
        main = pod["spec"]["containers"][0]
        if name in self.oom_killed and time.monotonic() >= self.oom_killed[name]:
            return {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": main["name"],
                        "image": main["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                    }
                ],
            }
        if name not in self.procs:
            volume = next(v["secret"] for v in pod["spec"]["volumes"] if "secret" in v)
            secret = self.fake.objects.get(("secrets", "orchard", volume["secretName"]))
            if secret is None:  # a real kubelet waits too (FailedMount) until the Secret exists
                return {"phase": "Pending"}
            mounted = self.secret_dir / name  # each pod its own volume: concurrent pods must not share files
            mounted.mkdir(parents=True, exist_ok=True)
            # as the kubelet projects a secret volume: the listed items only, when it lists any
            for item in volume.get("items") or [{"key": k, "path": k} for k in secret["data"]]:
                (mounted / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
            ip = self.ips[name] = f"127.0.0.{len(self.ips) + 1}"
            command = [arg.replace(str(self.secret_dir), str(mounted)) for arg in main["command"]]
            port = command[command.index("--tcp") + 1].rpartition(":")[2]
            command[command.index("--tcp") + 1] = f"{ip}:{port}"
            self.procs[name] = subprocess.Popen(
                command,
                cwd=self.cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**IMAGE_ENV, "PYTHONPATH": "/nonexistent-breaks-nothing-under-I"},
            )
        return running_after(0, ip=self.ips[name])(pod, reads)

    def oom(self, pod_name: str, report_after: float = 0.0) -> None:
        """Kill as the kernel would; the status says so `report_after` seconds later (kubelet lag)."""
        self.oom_killed[pod_name] = time.monotonic() + report_after
        self._kill(pod_name)

    def deleted(self, obj: dict) -> None:
        if obj.get("kind") == "Pod":
            self._kill(obj["metadata"]["name"])

    def _kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        for name in list(self.procs):
            self._kill(name)


@pytest.fixture
def agent_node(fake, tmp_path):
    """Settings and a ProcessKubelet under which sandbox pods really run the injected agent."""
    mount, secret_dir = tmp_path / "orchard", tmp_path / "orchard-secret"
    inject_layout(mount)
    kubelet = ProcessKubelet(fake, secret_dir, tmp_path)
    settings = dict(agent_port=_free_port(), agent_mount_path=str(mount), secret_mount_path=str(secret_dir))
    yield kubelet, settings
    kubelet.close()


@pytest.fixture
def injected_agent(fake, tmp_path, agent_node):
    """A sandbox started through the backend whose pod runs the real agent (see ProcessKubelet)."""
    kubelet, settings = agent_node
    workspace = tmp_path / "workspace"
    backend = make_backend(fake, tmp_path, **settings)
    endpoint = backend.start(
        "sb-agent", SPEC.model_copy(update={"workdir": str(workspace)}), Resources(), "agent-secret-value"
    )
    (proc,) = kubelet.procs.values()
    take_over(endpoint, proc)  # what the service does before it uses a new sandbox (runtime.take_over)
    try:
        yield backend, endpoint, workspace, proc
    finally:
        backend.close()


def take_over(endpoint: AgentEndpoint, proc: subprocess.Popen) -> AgentEndpoint:
    """Re-key a fresh agent from its boot key to the endpoint's own, as the service's runtime does."""
    import asyncio

    from sandbox_service.agent_link.client import AgentClient

    boot = endpoint.model_copy(update={"secret": endpoint.boot_secret, "boot_secret": None})
    _wait_for_agent(boot, proc)

    async def rekey() -> None:
        client = AgentClient(boot)
        try:
            await client.rekey(endpoint.secret)
        finally:
            await client.close()

    asyncio.run(rekey())
    return endpoint.model_copy(update={"boot_secret": None})


def test_the_pods_files_hold_no_key_the_agent_accepts(injected_agent, tmp_path):
    """The workload can read the pod's secret volume; the live key is not in it, and the boot key that is
    was re-keyed away before the sandbox was handed out."""
    from sandbox_service.errors import UnauthorizedError

    backend, endpoint, workspace, proc = injected_agent
    mounted = next((tmp_path / "orchard-secret").iterdir())
    files = {f.name: f.read_text() for f in mounted.iterdir()}
    assert set(files) == {"agent-boot-secret", "tls.crt", "tls.key"}
    assert endpoint.secret not in files.values()
    _wait_for_agent(endpoint, proc)  # the live key works
    with pytest.raises(UnauthorizedError):
        _wait_for_agent(endpoint.model_copy(update={"secret": files["agent-boot-secret"]}), proc, timeout=2.0)


def _wait_for_agent(endpoint: AgentEndpoint, proc: subprocess.Popen, timeout: float = 20.0) -> dict:
    import asyncio

    from sandbox_service.agent_link.client import AgentClient

    async def ping() -> dict:
        client = AgentClient(endpoint)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return await client.ping(timeout=1.0)
                except Exception:
                    if proc.poll() is not None:
                        raise AssertionError(f"agent exited with {proc.returncode}")
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
        finally:
            await client.close()

    return asyncio.run(ping())


def test_the_pod_command_runs_the_injected_agent_over_tls_with_the_secrets_certificate(injected_agent):
    backend, endpoint, workspace, proc = injected_agent
    answer = _wait_for_agent(endpoint, proc)
    assert answer  # a real answer over TLS, verified against the endpoint's own CA
    wrong_ca = endpoint.model_copy(update={"ca_cert_pem": backend.certificates.issue("x")[0]})
    with pytest.raises(Exception):
        _wait_for_agent(wrong_ca, proc, timeout=1.0)  # another sandbox's CA does not vouch for this agent


def test_snapshot_and_restore_through_the_agent(injected_agent):
    backend, endpoint, workspace, proc = injected_agent
    _wait_for_agent(endpoint, proc)
    (workspace / "keep.txt").write_text("v1")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "a.py").write_text("print(1)")
    size = backend.snapshot("sb-agent", "snap-1")
    assert size > 0 and (backend.config.snapshot_dir / "snap-1.tar.gz").stat().st_size == size
    (workspace / "keep.txt").write_text("v2")
    (workspace / "later.txt").write_text("made after the snapshot")
    backend.restore("sb-agent", "snap-1")
    assert (workspace / "keep.txt").read_text() == "v1"
    assert (workspace / "sub" / "a.py").read_text() == "print(1)"
    assert not (workspace / "later.txt").exists()
    backend.delete_snapshot("snap-1")
    backend.delete_snapshot("snap-1")  # idempotent
    assert not (backend.config.snapshot_dir / "snap-1.tar.gz").exists()


def test_without_a_cluster_the_backend_says_how_to_get_one(tmp_path, monkeypatch):
    from sandbox_service.config import ServiceConfig

    monkeypatch.setenv("ORCHARD_K8S_API_MODE", "kubeconfig")
    monkeypatch.setenv("ORCHARD_K8S_KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(BackendUnavailableError, match="ORCHARD_K8S_KUBECONFIG"):
        KubernetesBackend.from_service_config(ServiceConfig(backend="kubernetes", state_dir=tmp_path, token="t"))


# -- the real service on the Kubernetes backend ---------------------------------------------------------------
@contextlib.contextmanager
def serve(backend: KubernetesBackend, state_dir: Path, start_timeout: float = 20, **settings):
    """The real FastAPI service (uvicorn on loopback) on `backend`; yields a client once it listens."""
    import uvicorn

    from sandbox_service.server.app import create_app
    from sandbox_service.client import SandboxClient
    from sandbox_service.config import ServiceConfig

    config = ServiceConfig(
        backend="kubernetes", token="tok", state_dir=state_dir, **{"ready_timeout_seconds": 20, **settings}
    )
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(config, backend=backend), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), f"the service did not listen within {start_timeout} s"
        time.sleep(0.02)
    client = SandboxClient(f"http://127.0.0.1:{port}", "tok", timeout=30)
    try:
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture
def service_on_fake_cluster(fake, tmp_path, agent_node):
    """The real service with the Kubernetes backend pointed at the fake, its pods running real agents."""
    kubelet, settings = agent_node
    with serve(make_backend(fake, tmp_path, **settings), tmp_path / "state") as client:
        yield client, kubelet


def test_the_service_creates_execs_snapshots_and_deletes_on_the_kubernetes_backend(
    fake, service_on_fake_cluster, tmp_path
):
    client, kubelet = service_on_fake_cluster
    with client.create(SandboxCreate(image="task:1", workdir=str(tmp_path / "ws"))) as sandbox:
        assert sandbox.info.backend == "kubernetes" and sandbox.info.state.value == "ready"
        result = sandbox.exec("echo hello from the pod; exit 3")
        assert (result.exit_code, result.stdout, result.outcome.value) == (3, "hello from the pod\n", "command_failed")
        sandbox.write_file("notes.txt", "v1")
        snap = sandbox.snapshot()
        sandbox.write_file("notes.txt", "v2")
        sandbox.restore(snap.id)
        assert sandbox.read_file("notes.txt") == b"v1"
        assert len(fake.of_kind("pods")) == 1
    assert sandbox_objects(fake) == {}  # deleted through the API: pod, Secret and NetworkPolicy
    assert all(proc.poll() is not None for proc in kubelet.procs.values())


@pytest.mark.parametrize("kubelet_lag", [0.0, 1.5])
def test_a_pod_oom_killed_by_its_command_is_the_commands_outcome_and_recreated_as_it_was(
    fake, service_on_fake_cluster, tmp_path, kubelet_lag
):
    """Also when the kubelet reports the OOM kill after the agent is already gone (it lags seconds)."""
    client, kubelet = service_on_fake_cluster
    spec = SandboxCreate(image="task:1", resources=Resources(memory_mb=512), workdir=str(tmp_path / "ws"))
    with client.create(spec) as sandbox:
        (first,) = fake.of_kind("pods")
        kubelet.oom(first["metadata"]["name"], report_after=kubelet_lag)  # the agent goes with the container
        result = sandbox.exec("echo after")
        assert result.outcome is ExecOutcome.command_failed and result.reason == "oom" and not result.is_infra_error
        info = sandbox.wait_ready(timeout=30)
        assert info.escalations == [] and info.resources.memory_mb == 512
        (second,) = fake.of_kind("pods")
        assert second["metadata"]["name"] != first["metadata"]["name"]
        limit = second["spec"]["containers"][0]["resources"]["limits"]["memory"]
        assert limit == f"{512 + KubernetesBackendConfig().agent_memory_overhead_mb}Mi"
        assert sandbox.exec("echo again").stdout == "again\n"
    assert sandbox_objects(fake) == {}


def test_an_oom_killed_pod_in_a_verification_run_is_recreated_with_more_memory(fake, service_on_fake_cluster, tmp_path):
    client, kubelet = service_on_fake_cluster
    spec = SandboxCreate(image="task:1", resources=Resources(memory_mb=512), workdir=str(tmp_path / "ws"))
    with client.create(spec) as plain:
        sandbox = plain.verifying()
        (first,) = fake.of_kind("pods")
        kubelet.oom(first["metadata"]["name"])
        result = sandbox.exec("echo after")
        assert result.infra_error is InfraErrorKind.OOM_KILLED and result.is_infra_error
        info = sandbox.wait_ready(timeout=30)
        assert [(e.from_memory_mb, e.to_memory_mb) for e in info.escalations] == [(512, 1024)]
        (second,) = fake.of_kind("pods")
        assert second["metadata"]["name"] != first["metadata"]["name"]
        limit = second["spec"]["containers"][0]["resources"]["limits"]["memory"]
        assert limit == f"{1024 + KubernetesBackendConfig().agent_memory_overhead_mb}Mi"
        assert sandbox.exec("echo again").stdout == "again\n"
    assert sandbox_objects(fake) == {}


# -- what a first real cluster run would break on -----------------------------------------------
def test_commands_get_the_task_images_environment(fake, service_on_fake_cluster, tmp_path):
    """The pod spec cannot know the image's ENV; the agent inherits it from the runtime and passes it on."""
    client, _ = service_on_fake_cluster
    with client.create(SandboxCreate(image="task:1", workdir=str(tmp_path / "ws"))) as sandbox:
        result = sandbox.exec('echo "$JAVA_HOME|$HOME|$CONDA_PREFIX|$PATH"')
        assert result.stdout.strip() == "|".join(IMAGE_ENV[k] for k in ("JAVA_HOME", "HOME", "CONDA_PREFIX", "PATH"))
        # the caller's variables still win over the image's
        assert sandbox.exec("echo $HOME", env={"HOME": "/tmp/h"}).stdout == "/tmp/h\n"


def test_a_fork_starts_from_the_snapshot(fake, service_on_fake_cluster, tmp_path):
    client, _ = service_on_fake_cluster
    with client.create(SandboxCreate(image="task:1", workdir=str(tmp_path / "ws-a"))) as parent:
        parent.write_file("state.txt", "from the parent")
        parent.write_file("sub/deep.py", "x = 1")
        snap = parent.snapshot()
        parent.write_file("state.txt", "changed after the snapshot")
        fork_spec = SandboxCreate(image="task:1", workdir=str(tmp_path / "ws-b"), from_snapshot=snap.id)
        with client.create(fork_spec) as child:
            assert child.read_file("state.txt") == b"from the parent"
            assert child.read_file("sub/deep.py") == b"x = 1"
            assert len(fake.of_kind("pods")) == 2
        assert parent.read_file("state.txt") == b"changed after the snapshot"


def test_a_restart_with_many_orphans_listens_at_once_and_reaps_them_in_the_background(fake, tmp_path):
    fake.kubelet = running_after(0, ip="127.0.0.1")  # running pods whose agents are gone: nothing to adopt
    crashed = make_backend(fake, tmp_path, agent_port=_free_port())
    orphans = [f"sb-orphan-{i:03d}" for i in range(40)]
    for sandbox_id in orphans:
        crashed.start(sandbox_id, SPEC, Resources(), "s")
    fake.latency[("DELETE", "pods")] = 0.25  # a loaded API server: 40 deletes one by one take 10 s+
    requests_before = len(fake.requests)
    with serve(make_backend(fake, tmp_path), tmp_path / "state", start_timeout=30, adopt_timeout_seconds=3) as client:
        # It listens before any is reaped: they are pending (adopted) until their agents fail to answer,
        # then failed while their objects are deleted.
        assert len(fake.of_kind("pods")) == len(orphans)
        assert {s.state.value for s in client.list()} <= {"pending", "failed"}
        deadline = time.monotonic() + 60
        while fake.of_kind("pods"):
            assert time.monotonic() < deadline, f"{len(fake.of_kind('pods'))} orphan pods left"
            time.sleep(0.05)
    assert sandbox_objects(fake) == {}
    reaping = fake.requests[requests_before:]
    lists = [r["kind"] for r in reaping if r["method"] == "GET" and r["name"] is None]
    # one LIST per kind for all orphans (pods: also the pod watch's first LIST); each is then deleted by name
    assert lists.count("secrets") == lists.count("networkpolicies") == 1 and lists.count("pods") <= 2
    assert len([r for r in reaping if r["method"] == "DELETE"]) <= 3 * len(orphans)


def test_stop_deletes_by_name_without_listing(fake, tmp_path):
    fake.kubelet = running_after(0)
    fake.gc_enabled = False
    backend = make_backend(fake, tmp_path)
    backend.start("sb-byname", SPEC, Resources(), "s")
    before = len(fake.requests)
    backend.stop("sb-byname")
    assert sandbox_objects(fake) == {}
    assert {(r["method"], r["kind"]) for r in fake.requests[before:] if r["method"] != "WATCH"} == {
        ("DELETE", "pods"),
        ("DELETE", "secrets"),
    }  # mode none: it had no policy of its own


def test_the_agent_bind_in_the_pod_command_serves_ipv4_and_ipv6(monkeypatch):
    """`[::]` is dual stack (IPv6-only and dual-stack clusters); a node without IPv6 falls back to IPv4."""
    from sandbox_service.agent import __main__ as agent_main

    args = agent_main._parse(["--tcp", "[::]:0", "--secret-file", "unused"])
    with agent_main._listen(args) as sock:
        port = sock.getsockname()[1]
        assert sock.family == socket.AF_INET6
        for host in ("127.0.0.1", "::1"):
            with socket.create_connection((host, port), timeout=5):
                pass
    real_socket = socket.socket

    def no_ipv6(family=socket.AF_INET, *rest):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real_socket(family, *rest)

    monkeypatch.setattr(agent_main.socket, "socket", no_ipv6)
    with agent_main._listen(args) as sock:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "0.0.0.0"


# -- API load: one watch, a shared rate limit, reads retried until a deadline -------------------------------
def test_the_pod_watch_lists_again_after_410_gone_and_keeps_serving(fake, tmp_path):
    fake.kubelet = running_after(1)
    backend = make_backend(fake, tmp_path)
    backend.start("sb-w1", SPEC, Resources(), "s")
    assert backend.pods.relists == 1
    fake.expire_watches()
    deadline = time.monotonic() + 10
    while backend.pods.relists < 2:
        assert time.monotonic() < deadline, "the cache did not list again after 410 Gone"
        time.sleep(0.02)
    assert backend.start("sb-w2", SPEC, Resources(), "s").address.endswith(":8700")
    assert backend.status("sb-w1").alive and backend.status("sb-w2").alive
    assert [r for r in fake.sent("GET", "pods") if r["name"]] == []  # still not one read of a single pod


def test_the_token_bucket_spaces_calls_after_the_burst():
    from sandbox_service.backends.kubernetes.ratelimit import TokenBucket

    now, waits = [0.0], []
    bucket = TokenBucket(10, 2, clock=lambda: now[0], sleep=waits.append)
    assert [bucket.acquire() for _ in range(4)] == pytest.approx([0, 0, 0.1, 0.2])
    now[0] += 1.0  # a lull refills up to the burst, not beyond
    assert [bucket.acquire() for _ in range(3)] == pytest.approx([0, 0, 0.1])


def test_every_api_call_takes_a_token_from_the_shared_bucket(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)
    taken = []
    real = backend.limiter.acquire
    backend.limiter.acquire = lambda: taken.append(1) or real()
    backend.start("sb-rl", SPEC, Resources(), "s")
    backend.stop("sb-rl")
    deadline = time.monotonic() + 10
    while not fake.sent("WATCH", "events"):  # the event watch starts on its own thread
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert len(taken) == len(fake.requests)  # every LIST, WATCH, create, patch and delete


def test_reads_retry_until_a_deadline_not_a_count(fake, tmp_path):
    fake.fail("GET", "secrets", 503, "ServiceUnavailable", times=8)
    backend = make_backend(fake, tmp_path, retry_attempts=2, read_deadline_seconds=60)
    assert backend.list_orphans() == []  # 9 attempts for one LIST: throttling alone never fails a read
    assert len(fake.sent("GET", "secrets")) == 9
    fake.fail("GET", "secrets", 503, "ServiceUnavailable", times=1000)
    impatient = make_backend(fake, tmp_path, read_deadline_seconds=0.5, retry_base_seconds=0.2)
    with pytest.raises(BackendUnavailableError, match="for 0.5 s"):
        impatient.list_orphans()


# -- transient errors are not final ---------------------------------------------------------------------
def test_a_create_container_error_that_passes_does_not_fail_the_sandbox(fake, tmp_path):
    def kubelet(pod, ticks):
        if ticks <= 5:
            return waiting("CreateContainerError", "failed to reserve container name")(pod, ticks)
        return running_after(0)(pod, ticks)

    fake.kubelet = kubelet
    backend = make_backend(fake, tmp_path, container_error_grace_seconds=30)
    assert backend.start("sb-cce", SPEC, Resources(), "s").address == "10.244.1.7:8700"


def test_a_throttled_registry_is_retried_a_missing_image_is_not(fake, tmp_path):
    fake.kubelet = waiting("ErrImagePull", "429 Too Many Requests: toomanyrequests: pull rate limit")
    backend = make_backend(fake, tmp_path, image_pull_grace_seconds=0)
    with pytest.raises(BackendUnavailableError) as caught:  # the service makes another attempt later
        backend.start("sb-429", SPEC, Resources(), "s")
    assert caught.value.infra_error == InfraErrorKind.IMAGE_PULL_FAILED
    assert sandbox_objects(fake) == {}


def test_the_agent_in_a_pod_counts_oom_kills_from_the_containers_memory_events(tmp_path):
    from sandbox_service.agent import __main__ as agent_main
    from sandbox_service.agent.proctree import CgroupTracker

    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n")
    fd = agent_main._container_oom_counter(str(tmp_path))
    tracker = CgroupTracker(None, fd)
    assert tracker.oom_kills() == 1
    events.write_text("low 0\nhigh 0\nmax 14\noom 3\noom_kill 2\noom_group_kill 0\n")  # a command was killed
    assert tracker.oom_kills() == 2
    assert agent_main._container_oom_counter(str(tmp_path / "no-cgroup")) is None  # nothing readable: no counter


def test_the_agent_in_a_pod_on_cgroup_v1_counts_oom_kills_from_memory_oom_control(tmp_path):
    # cgroup v1 nodes (the test cluster's): runc mounts the container's memory group at /sys/fs/cgroup/memory.
    from sandbox_service.agent import __main__ as agent_main
    from sandbox_service.agent.proctree import CgroupTracker

    control = tmp_path / "memory" / "memory.oom_control"
    control.parent.mkdir()
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    tracker = CgroupTracker(None, agent_main._container_oom_counter(str(tmp_path)))
    assert tracker.oom_kills() == 0
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert tracker.oom_kills() == 1


def test_orphans_left_by_a_failed_cleanup_are_swept_periodically(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path, orphan_sweep_seconds=0.2)
    assert backend.list_orphans() == []  # the service's start-up call; sweeps run from then on
    backend.start("sb-kept", SPEC, Resources(), "s")
    fake.fail("DELETE", "pods", 503, "ServiceUnavailable", times=100)  # the API is down when it fails
    healthy, crashing = fake.kubelet, waiting("CrashLoopBackOff", "back-off")
    fake.kubelet = lambda pod, ticks: (crashing if "sb-leak" in pod["metadata"]["name"] else healthy)(pod, ticks)
    with pytest.raises(PodStartError):
        backend.start("sb-leak", SPEC, Resources(), "s")
    assert any(
        "sb-leak" in o["metadata"]["annotations"].get("orchard.dev/sandbox-id", "")
        for o in sandbox_objects(fake).values()
    )
    fake.faults.clear()  # the API is back
    deadline = time.monotonic() + 15
    while any(
        "sb-leak" in o["metadata"]["annotations"].get("orchard.dev/sandbox-id", "")
        for o in sandbox_objects(fake).values()
    ):
        assert time.monotonic() < deadline, "the leaked objects were not swept"
        time.sleep(0.05)
    assert backend.status("sb-kept").alive  # a sandbox it knows is never swept
