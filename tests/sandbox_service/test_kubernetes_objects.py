"""The objects the Kubernetes backend sends, checked offline (no cluster here).

Every Pod, Secret and NetworkPolicy it builds validates against the Kubernetes OpenAPI schema of
several API versions (kubernetes-validate's bundled schemas, strict: unknown fields are errors) and
against the API server's name and label rules, which the schema does not express. What this cannot
show: admission on a real cluster (PodSecurity, quotas, webhooks) or a CNI enforcing the policy.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import kubernetes_validate
import pytest
from cryptography import x509
from kubernetes import client as k8s

from sandbox_service.agent_link.client import AGENT_TLS_SERVER_NAME
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig, Toleration
from sandbox_service.backends.kubernetes.objects import (
    AGENT_CONTAINER,
    INJECTOR_CONTAINER,
    allowlist_cidrs,
    build_network_policy,
    build_pod,
    build_secret,
    build_shared_network_policy,
    dns_label,
    label_value,
    object_labels,
    pod_name_for,
    to_dict,
)
from sandbox_service.backends.kubernetes.status import assess_pod
from sandbox_service.backends.kubernetes.tls import AgentCertificates
from sandbox_service.errors import InvalidRequestError
from sandbox_service.models import InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

# The oldest and newest API versions kubernetes-validate ships, and the one kubernetes==30 speaks.
VERSIONS = ["1.28", "1.30", "1.33", kubernetes_validate.latest_version()]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

CONFIGS = {
    "default": KubernetesBackendConfig(),
    "hardened": KubernetesBackendConfig(
        namespace="sandboxes",
        runtime_class_name="gvisor",
        priority_class_name="sandbox-low",
        service_account_name="orchard-sandbox",
        image_pull_secrets=["regcred"],
        node_selector={"pool": "sandbox"},
        tolerations=[
            Toleration(key="sandbox", operator="Exists", effect="NoSchedule"),
            Toleration(key="spot", value="true", effect="NoExecute", toleration_seconds=30),
        ],
        service_namespace="orchard-system",
        cpu_request_ratio=0.25,
        pod_annotations={"sidecar.istio.io/inject": "false"},
    ),
}
SPECS = {
    "plain": SandboxCreate(image="python:3.12-slim"),
    "labelled": SandboxCreate(
        image="ghcr.io/org/swe-task@sha256:" + "a" * 64,
        labels={"task": "django/django#1234", "Stage Name": "rl", "x" * 90: "y" * 90},
        network=NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"], allow_cidrs=["10.0.0.0/8", "2001:db8::/32"]),
        workdir="/testbed",
        ttl_seconds=600.5,
    ),
}
IDS = ["sb-0123456789abcdef", "SB_Upper.Case", "x" * 200, "-leading-and-trailing-", "ünïcödé/ids:1"]


def _validate(obj: dict, versions: list[str]) -> None:
    for version in versions:
        kubernetes_validate.validate(obj, version, strict=True)


def _check_meta(meta: dict) -> None:
    for key, value in meta["labels"].items():
        assert _LABEL_KEY.match(key) and len(key.rpartition("/")[2]) <= 63, key
        assert _LABEL_VALUE.match(value), value


def _resolve(host: str) -> list[str]:
    return {"pypi.org": ["151.101.0.223", "2a04:4e42::223"]}[host]


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("spec_name", SPECS)
def test_every_generated_object_validates_against_the_openapi_schema(config_name, spec_name):
    config, spec = CONFIGS[config_name], SPECS[spec_name]
    for sandbox_id in IDS:
        name = pod_name_for(sandbox_id)
        pod = to_dict(
            build_pod(name, sandbox_id, spec, Resources(cpu=0.5, memory_mb=700), config, secret_name=f"{name}-agent")
        )
        secret = to_dict(
            build_secret(
                f"{name}-agent", sandbox_id, spec, config, agent_secret="s", boot_secret="b", cert_pem="c", key_pem="k"
            )
        )
        policy = to_dict(
            build_network_policy(name, sandbox_id, spec, config, spec.network, allowlist_cidrs(spec.network, _resolve))
        )
        # every API version for one id; the id variants (which only change names and labels) on 1.30
        versions = VERSIONS if sandbox_id == IDS[0] else ["1.30"]
        for obj in (pod, secret, policy):
            _validate(obj, versions)
            _check_meta(obj["metadata"])
        assert _DNS_LABEL.match(pod["metadata"]["name"]) and _DNS_LABEL.match(pod["spec"]["hostname"])
        assert len(f"{name}-agent") <= 253
    shared = to_dict(build_shared_network_policy(config))
    _validate(shared, VERSIONS)
    _check_meta(shared["metadata"])


def test_label_sanitising_is_valid_and_keeps_distinct_inputs_distinct():
    inputs = IDS + ["a/b", "a-b", "a_b", "A", "a", "", "x" * 63, "x" * 64]
    values = [label_value(v) for v in inputs]
    assert all(_LABEL_VALUE.match(v) for v in values)
    assert len(set(values)) == len(set(inputs))
    assert label_value("sb-0123") == "sb-0123"  # valid values pass unchanged
    assert all(_DNS_LABEL.match(dns_label(v)) for v in inputs if v.strip("-"))
    labels = object_labels("sb-1", KubernetesBackendConfig(), {"app.kubernetes.io/managed-by": "me"})
    assert labels["app.kubernetes.io/managed-by"] == "orchard"  # a caller cannot spoof our labels


def test_pod_has_no_credentials_no_restarts_and_the_requested_resources():
    config = CONFIGS["hardened"]
    pod = build_pod(
        "orchard-sb-1-abcde",
        "sb-1",
        SPECS["labelled"],
        Resources(cpu=2, memory_mb=4096, disk_mb=10240),
        config,
        secret_name="orchard-sb-1-abcde-agent",
    )
    spec = pod.spec
    assert spec.automount_service_account_token is False and spec.enable_service_links is False
    assert spec.restart_policy == "Never" and spec.active_deadline_seconds == 600
    assert spec.runtime_class_name == "gvisor" and spec.node_selector == {"pool": "sandbox"}
    assert [t.toleration_seconds for t in spec.tolerations] == [None, 30]
    main = next(c for c in spec.containers if c.name == AGENT_CONTAINER)
    assert main.resources.limits == {"cpu": "2000m", "memory": "4160Mi", "ephemeral-storage": "10496Mi"}
    assert main.resources.requests["cpu"] == "500m"  # cpu_request_ratio 0.25
    assert main.security_context.allow_privilege_escalation is False and main.security_context.privileged is False
    assert "NET_RAW" in main.security_context.capabilities.drop
    assert main.command[:4] == ["/orchard/python/bin/python3", "-I", "-S", "-c"]
    assert main.command[main.command.index("--workspace") + 1] == "/testbed"
    assert {m.mount_path: m.read_only for m in main.volume_mounts} == {"/orchard": True, "/orchard-secret": True}
    injector = spec.init_containers[0]
    assert injector.name == INJECTOR_CONTAINER and injector.security_context.run_as_non_root
    assert injector.resources.requests["cpu"] == "50m"
    # A dense node (cpu_request_ratio 0.02): the injector's request follows, or it would set the pod's.
    dense = build_pod(
        "p",
        "sb-1",
        SPECS["labelled"],
        Resources(cpu=0.2),
        config.model_copy(update={"cpu_request_ratio": 0.02}),
        secret_name="s",
    )
    assert dense.spec.init_containers[0].resources.requests["cpu"] == "4m"
    assert next(c for c in dense.spec.containers if c.name == AGENT_CONTAINER).resources.requests["cpu"] == "4m"
    secret_volume = next(v for v in spec.volumes if v.secret is not None)
    assert secret_volume.secret.secret_name == "orchard-sb-1-abcde-agent"
    with pytest.raises(InvalidRequestError, match="image"):
        build_pod("p", "sb-1", SandboxCreate(), Resources(), config, secret_name="s")


def test_network_policy_modes():
    config = KubernetesBackendConfig()
    shared = to_dict(build_shared_network_policy(config))  # modes none and loopback: only this one applies
    assert shared["spec"]["egress"] == [] and shared["spec"]["policyTypes"] == ["Ingress", "Egress"]
    allow = NetworkPolicy(mode="allowlist", allow_cidrs=["10.1.2.3/8"])
    cidrs = allowlist_cidrs(allow, _resolve)
    assert cidrs == ["10.0.0.0/8"]
    policy = to_dict(build_network_policy("p", "sb", SPECS["plain"], config, allow, cidrs))
    assert len(policy["spec"]["egress"]) == 1  # no host names: no DNS opening
    assert allowlist_cidrs(NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"]), _resolve) == [
        "151.101.0.223/32",
        "2a04:4e42::223/128",
    ]
    assert allowlist_cidrs(NetworkPolicy(mode="none", allow_cidrs=["1.2.3.4/32"]), _resolve) == []

    def unresolvable(host: str) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(InvalidRequestError, match="did not resolve"):
        allowlist_cidrs(NetworkPolicy(mode="allowlist", allow_hosts=["nope.invalid"]), unresolvable)
    with pytest.raises(InvalidRequestError, match="not a CIDR"):
        allowlist_cidrs(NetworkPolicy(mode="allowlist", allow_cidrs=["300.1.1.1/8"]), _resolve)


def test_no_allowlist_opens_the_cloud_metadata_endpoint():
    config = KubernetesBackendConfig()
    wide = NetworkPolicy(mode="allowlist", allow_cidrs=["0.0.0.0/0", "::/0", "169.254.0.0/16", "10.0.0.0/8"])
    policy = to_dict(build_network_policy("p", "sb", SPECS["plain"], config, wide, allowlist_cidrs(wide, _resolve)))
    blocks = {peer["ipBlock"]["cidr"]: peer["ipBlock"].get("except") for peer in policy["spec"]["egress"][0]["to"]}
    # the instance metadata service, GKE Workload Identity (.252), EKS Pod Identity (.170.23, fd00:ec2::23)
    assert blocks == {
        "0.0.0.0/0": ["169.254.169.254/32", "169.254.169.252/32", "169.254.170.23/32"],
        "169.254.0.0/16": ["169.254.169.254/32", "169.254.169.252/32", "169.254.170.23/32"],
        "::/0": ["fd00:ec2::254/128", "fd00:ec2::23/128"],
        "10.0.0.0/8": None,
    }
    for version in VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    for endpoint in ("169.254.169.254/32", "169.254.169.252/32", "169.254.170.23/32", "fd00:ec2::23/128"):
        with pytest.raises(InvalidRequestError, match="metadata endpoint"):
            allowlist_cidrs(NetworkPolicy(mode="allowlist", allow_cidrs=[endpoint]), _resolve)


def test_the_pods_deadline_is_capped_and_scale_down_never_kills_a_running_episode():
    config = KubernetesBackendConfig(max_ttl_seconds=3600)
    pod = build_pod(
        "p", "sb-1", SandboxCreate(image="i:1", ttl_seconds=10 * 86400), Resources(), config, secret_name="s"
    )
    assert pod.spec.active_deadline_seconds == 3600
    annotations = pod.metadata.annotations
    # the default: the cluster autoscaler must not remove a node under a running sandbox
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes" not in annotations
    assert any(v.name == "orchard-agent" and v.empty_dir for v in pod.spec.volumes)
    opted_in = build_pod(
        "p",
        "sb-1",
        SandboxCreate(image="i:1"),
        Resources(),
        KubernetesBackendConfig(safe_to_evict=True),
        secret_name="s",
    ).metadata.annotations
    assert opted_in["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    assert opted_in["cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"] == "orchard-agent"


# -- status mapping on the objects the API returns --------------------------------------------------------------
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def _pod(phase="Pending", age=0.0, statuses=None, init_statuses=None, conditions=None, reason=None, ip=None):
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", creation_timestamp=NOW - timedelta(seconds=age)),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name=AGENT_CONTAINER, image="task:1")],
            init_containers=[k8s.V1Container(name=INJECTOR_CONTAINER, image="injector:1")],
        ),
        status=k8s.V1PodStatus(
            phase=phase,
            container_statuses=statuses,
            init_container_statuses=init_statuses,
            conditions=conditions,
            reason=reason,
            pod_ip=ip,
        ),
    )


def _cs(name=AGENT_CONTAINER, waiting=None, terminated=None, last_terminated=None):
    return k8s.V1ContainerStatus(
        name=name,
        image="x",
        image_id="",
        ready=False,
        restart_count=0,
        state=k8s.V1ContainerState(waiting=waiting, terminated=terminated),
        last_state=k8s.V1ContainerState(terminated=last_terminated),
    )


def _assess(pod, grace=30.0, unschedulable=120.0):
    return assess_pod(pod, NOW, unschedulable_timeout=unschedulable, image_pull_grace=grace)


def test_transient_errors_get_a_grace_period_from_their_first_sighting():
    """A pod that waited 50 s for the scheduler and then hits one CreateContainerError is not failed at
    once; a registry 429 fails the attempt as retryable, a missing image as final."""
    create_error = k8s.V1ContainerStateWaiting(reason="CreateContainerError", message="context deadline exceeded")
    since: dict = {}
    old_pod = _pod(age=500, statuses=[_cs(waiting=create_error)])
    assert (
        assess_pod(old_pod, NOW, unschedulable_timeout=120, image_pull_grace=30, errors_since=since).state == "pending"
    )
    later = assess_pod(
        old_pod, NOW + timedelta(seconds=61), unschedulable_timeout=120, image_pull_grace=30, errors_since=since
    )
    assert later.infra_error is InfraErrorKind.SANDBOX_CRASHED and later.retryable
    throttled = k8s.V1ContainerStateWaiting(reason="ErrImagePull", message="429 Too Many Requests: toomanyrequests")
    seen: dict = {}
    assess_pod(
        _pod(age=500, statuses=[_cs(waiting=throttled)]),
        NOW,
        unschedulable_timeout=120,
        image_pull_grace=30,
        errors_since=seen,
    )
    retry = assess_pod(
        _pod(age=500, statuses=[_cs(waiting=throttled)]),
        NOW + timedelta(seconds=31),
        unschedulable_timeout=120,
        image_pull_grace=30,
        errors_since=seen,
    )
    assert retry.infra_error is InfraErrorKind.IMAGE_PULL_FAILED and retry.retryable
    missing = k8s.V1ContainerStateWaiting(reason="ErrImagePull", message='manifest for "x:1" not found')
    final = _assess(_pod(age=31, statuses=[_cs(waiting=missing)]))
    assert final.infra_error is InfraErrorKind.IMAGE_PULL_FAILED and not final.retryable


def test_status_mapping():
    pull = k8s.V1ContainerStateWaiting(reason="ImagePullBackOff", message="Back-off pulling image")
    assert _assess(_pod(age=5, statuses=[_cs(waiting=pull)])).state == "pending"  # kubelet still retrying
    late = _assess(_pod(age=31, statuses=[_cs(waiting=pull)]))
    assert late.infra_error is InfraErrorKind.IMAGE_PULL_FAILED and "'task:1'" in late.message
    invalid = k8s.V1ContainerStateWaiting(reason="InvalidImageName", message="bad ref")
    assert _assess(_pod(age=0, statuses=[_cs(waiting=invalid)])).infra_error is InfraErrorKind.IMAGE_PULL_FAILED
    injector_pull = _assess(_pod(age=60, init_statuses=[_cs(name=INJECTOR_CONTAINER, waiting=pull)]))
    assert "agent injector image 'injector:1'" in injector_pull.message

    oom = k8s.V1ContainerStateTerminated(reason="OOMKilled", exit_code=137)
    assert (
        _assess(_pod("Running", ip="1.2.3.4", statuses=[_cs(last_terminated=oom)])).infra_error
        is InfraErrorKind.OOM_KILLED
    )
    injector_failed = k8s.V1ContainerStateTerminated(reason="Error", exit_code=1)
    crashed = _assess(_pod(init_statuses=[_cs(name=INJECTOR_CONTAINER, terminated=injector_failed)]))
    assert crashed.infra_error is InfraErrorKind.SANDBOX_CRASHED and "/opt/orchard" in crashed.message
    config_error = k8s.V1ContainerStateWaiting(reason="CreateContainerConfigError", message='secret "s" not found')
    assert _assess(_pod(statuses=[_cs(waiting=config_error)])).state == "pending"  # the runtime retries
    stuck = _assess(_pod(age=61, statuses=[_cs(waiting=config_error)]))
    assert stuck.infra_error is InfraErrorKind.SANDBOX_CRASHED and stuck.retryable
    agent_exit = k8s.V1ContainerStateTerminated(reason="Error", exit_code=127, message="python3: not found")
    exited = _assess(_pod("Failed", statuses=[_cs(terminated=agent_exit)]))
    assert exited.infra_error is InfraErrorKind.SANDBOX_CRASHED and "127" in exited.message

    unschedulable = [
        k8s.V1PodCondition(
            type="PodScheduled", status="False", reason="Unschedulable", message="0/3 nodes: Insufficient cpu"
        )
    ]
    assert _assess(_pod(age=10, conditions=unschedulable)).state == "pending"
    gone = _assess(_pod(age=200, conditions=unschedulable))
    assert gone.infra_error is InfraErrorKind.UNAVAILABLE and gone.retryable
    assert _assess(_pod("Running", ip="10.0.0.1")).pod_ip == "10.0.0.1"
    assert _assess(_pod("Running")).state == "pending"  # running without an IP is not reachable yet


def test_certificates_name_the_agent_server_name_and_chain_to_their_own_ca():
    ca_pem, cert_pem, key_pem = AgentCertificates().issue("orchard-sb-1-abcde")
    ca, cert = x509.load_pem_x509_certificate(ca_pem.encode()), x509.load_pem_x509_certificate(cert_pem.encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert AGENT_TLS_SERVER_NAME in names
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    other_ca = x509.load_pem_x509_certificate(AgentCertificates().issue("other")[0].encode())
    with pytest.raises(Exception):
        cert.verify_directly_issued_by(other_ca)
    assert "PRIVATE KEY" in key_pem


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ORCHARD_K8S_NAMESPACE", "sandboxes")
    monkeypatch.setenv("ORCHARD_K8S_NODE_SELECTOR", '{"pool": "sandbox"}')
    monkeypatch.setenv("ORCHARD_K8S_TOLERATIONS", '[{"key": "sandbox", "operator": "Exists"}]')
    config = KubernetesBackendConfig.from_env()
    assert (config.namespace, config.node_selector) == ("sandboxes", {"pool": "sandbox"})
    assert config.tolerations[0].operator == "Exists"
    with pytest.raises(ValueError):
        KubernetesBackendConfig(instance="Not Valid")


def test_guaranteed_qos_sets_requests_to_limits_in_every_container():
    """Kubernetes gives a pod the Guaranteed class only if every container, init containers included,
    requests exactly its cpu and memory limits."""
    for guaranteed in (False, True):
        config = KubernetesBackendConfig(guaranteed_qos=guaranteed, cpu_request_ratio=0.25)
        pod = build_pod(
            "p", "sb-1", SandboxCreate(image="i:1"), Resources(cpu=2, memory_mb=1024), config, secret_name="s"
        )
        same = all(
            c.resources.requests[r] == c.resources.limits[r]
            for c in pod.spec.init_containers + pod.spec.containers
            for r in ("cpu", "memory")
        )
        assert same is guaranteed


def test_agent_certificates_expire_an_hour_after_the_capped_pod_lifetime(tmp_path):
    from sandbox_service.backends.kubernetes.backend import KubernetesBackend

    backend = KubernetesBackend(
        KubernetesBackendConfig(max_ttl_seconds=7200, snapshot_dir=tmp_path),
        api_client=k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9")),
    )
    ca_pem, cert_pem, _ = backend.certificates.issue("orchard-sb-1-abcde")
    for pem in (ca_pem, cert_pem):
        cert = x509.load_pem_x509_certificate(pem.encode())
        lifetime = cert.not_valid_after_utc - datetime.now(timezone.utc)
        assert timedelta(hours=2, minutes=50) < lifetime <= timedelta(hours=3)
    backend.close()
