"""Pure builders of the Kubernetes objects behind one sandbox: its Pod, Secret and NetworkPolicy.

No API calls here, so every object the backend sends can be validated offline against the
Kubernetes OpenAPI schema (`tests/sandbox_service/test_kubernetes_objects.py`).

The pod runs the task's image unchanged (runtime agent injection): an init container from the
injector image copies a standalone Python and the stdlib-only agent into an `emptyDir`, and the
main container's command starts that agent in TCP+TLS mode. The task image therefore needs no
Python of its own, but it must be able to run the injected interpreter: a glibc-based Linux image
of the node's architecture (a musl image such as Alpine needs the injector's musl build, see
docker/agent-injector/Dockerfile).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import re
import secrets as _secrets
import socket
from collections.abc import Callable, Sequence

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.config import (
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    OWNER_LABEL,
    SANDBOX_ID_ANNOTATION,
    SANDBOX_ID_LABEL,
    USER_LABEL_PREFIX,
    USER_LABELS_ANNOTATION,
    WORKDIR_ANNOTATION,
    KubernetesBackendConfig,
)
from sandbox_service.backends.allowlist import METADATA_CIDRS, checked_cidrs
from sandbox_service.errors import InvalidRequestError
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

AGENT_CONTAINER = "sandbox"
INJECTOR_CONTAINER = "orchard-agent-injector"
INJECTOR_SOURCE = "/opt/orchard"  # where docker/agent-injector/Dockerfile puts Python + agent
SECRET_KEY_AGENT = "agent-secret"  # the live key: read by the service (adoption), never mounted into the pod
SECRET_KEY_BOOT = "agent-boot-secret"  # what the agent starts with; re-keyed away before the sandbox is used
SECRET_KEY_CERT = "tls.crt"
SECRET_KEY_KEY = "tls.key"
# The keys the pod's secret volume holds (the live key is not among them).
POD_SECRET_KEYS = (SECRET_KEY_BOOT, SECRET_KEY_CERT, SECRET_KEY_KEY)

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_DNS_BAD = re.compile(r"[^a-z0-9-]+")


def _short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars, alphanumeric ends) that stays unique: changed values get a hash."""
    clean = _LABEL_VALUE_BAD.sub("-", text).strip("-_.")
    if clean == text and len(clean) <= 63:
        return clean
    return f"{clean[:54].rstrip('-_.')}-{_short_hash(text)}".lstrip("-")


def dns_label(text: str, max_len: int = 63) -> str:
    """A lowercase RFC 1123 label (pod names, hostnames) derived from `text`, unique per input."""
    clean = _DNS_BAD.sub("-", text.lower()).strip("-")
    if clean == text and len(clean) <= max_len:
        return clean
    return f"{clean[: max_len - 9].rstrip('-')}-{_short_hash(text)}".lstrip("-")


def agent_address(ip: str, port: int) -> str:
    """host:port of a pod's agent ([ip]:port for IPv6)."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def pod_name_for(sandbox_id: str) -> str:
    """Pod name for one start attempt: a random suffix, so a retry never collides with a pod still terminating."""
    return f"orchard-{dns_label(sandbox_id, 45)}-{_secrets.token_hex(3)[:5]}"


def secret_name_for(pod_name: str) -> str:
    """Name of the Secret of a pod's agent (`build_secret`), deleted with the pod."""
    return f"{pod_name}-agent"


def owner_labels(config: KubernetesBackendConfig) -> dict[str, str]:
    """The labels of everything this replica of the service instance created."""
    return {MANAGED_BY_LABEL: MANAGED_BY_VALUE, INSTANCE_LABEL: config.instance, OWNER_LABEL: config.replica}


def selector_labels(sandbox_id: str, config: KubernetesBackendConfig) -> dict[str, str]:
    """The labels that find every object of one sandbox."""
    return {**owner_labels(config), SANDBOX_ID_LABEL: label_value(sandbox_id)}


def instance_selector(config: KubernetesBackendConfig) -> str:
    """Label selector of everything this replica created (its pod watch, adoption, orphan reaping): never
    another replica's objects, so two replicas of one instance never reap each other's sandboxes."""
    return ",".join(f"{k}={v}" for k, v in owner_labels(config).items())


def sandbox_selector(sandbox_id: str, config: KubernetesBackendConfig) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(sandbox_id, config).items())


def object_labels(sandbox_id: str, config: KubernetesBackendConfig, user_labels: dict[str, str]) -> dict[str, str]:
    """Labels on every object: ours plus the caller's, made valid (the originals stay in an annotation)."""
    labels = {f"{USER_LABEL_PREFIX}{label_value(k)}": label_value(v) for k, v in user_labels.items() if k}
    labels.update({"app.kubernetes.io/name": "orchard-sandbox", "app.kubernetes.io/component": "sandbox"})
    labels.update(selector_labels(sandbox_id, config))
    return labels


def object_meta(
    name: str,
    sandbox_id: str,
    config: KubernetesBackendConfig,
    spec: SandboxCreate,
    owner: k8s.V1OwnerReference | None = None,
    extra_annotations: dict[str, str] | None = None,
) -> k8s.V1ObjectMeta:
    annotations = {SANDBOX_ID_ANNOTATION: sandbox_id, USER_LABELS_ANNOTATION: json.dumps(spec.labels, sort_keys=True)}
    annotations.update(extra_annotations or {})
    return k8s.V1ObjectMeta(
        name=name,
        namespace=config.namespace,
        labels=object_labels(sandbox_id, config, spec.labels),
        annotations=annotations,
        owner_references=[owner] if owner else None,
    )


def owner_reference(pod: k8s.V1Pod) -> k8s.V1OwnerReference:
    """Make an object a dependent of the sandbox pod: deleting the pod garbage-collects it."""
    # No blockOwnerDeletion: setting it needs finalizer rights on pods, which the service does not have.
    return k8s.V1OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid)


def _quantity_mi(mb: int) -> str:
    return f"{int(mb)}Mi"


def _millicores(cpu: float) -> str:
    return f"{max(1, round(cpu * 1000))}m"


def build_secret(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    *,
    agent_secret: str,
    boot_secret: str,
    cert_pem: str,
    key_pem: str,
    immutable: bool = True,
    extra: dict[str, str] | None = None,
) -> k8s.V1Secret:
    """The per-sandbox Secret: the agent's live key (for adoption; not mounted), the boot key the pod's agent
    starts with, its TLS certificate and key (and `extra` entries: what a restarted service needs to adopt
    the sandbox, `kubernetes_adopt.secret_entries`).
    Mutable only for a warm pod, whose key changes once, when it is claimed (and the Secret made immutable)."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    entries = {
        **(extra or {}),
        SECRET_KEY_AGENT: agent_secret,
        SECRET_KEY_BOOT: boot_secret,
        SECRET_KEY_CERT: cert_pem,
        SECRET_KEY_KEY: key_pem,
    }
    return k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        type="Opaque",
        immutable=immutable,  # kubelet stops watching it
        metadata=object_meta(name, sandbox_id, config, spec),
        data={key: b64(value) for key, value in entries.items()},
    )


AGENT_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from sandbox_service.agent.__main__ import main; sys.exit(main())"
)


def agent_command(spec: SandboxCreate, config: KubernetesBackendConfig) -> list[str]:
    """The main container's command: the injected interpreter running the injected agent.

    `-I -S` (isolated, no site): the image's PYTHON* variables and site-packages cannot break the agent,
    and the agent's path does not leak into the commands it runs. `--inherit-env`: the runtime starts
    this command with the image's ENV (PATH, HOME, JAVA_HOME, conda's variables) plus the pod's env, and
    the agent hands exactly that to every command; the pod spec itself cannot know the image's ENV.
    """
    mount, sec = config.agent_mount_path, config.secret_mount_path
    return [
        f"{mount}/python/bin/python3",
        "-I",
        "-S",
        "-c",
        AGENT_BOOTSTRAP,
        f"{mount}/agent",
        "--tcp",
        f"[::]:{config.agent_port}",  # dual stack; IPv4 alone where the node has no IPv6
        "--tls-cert",
        f"{sec}/{SECRET_KEY_CERT}",
        "--tls-key",
        f"{sec}/{SECRET_KEY_KEY}",
        "--secret-file",
        f"{sec}/{SECRET_KEY_BOOT}",
        "--workspace",
        spec.workdir,
        "--isolation",
        "kubernetes-pod",
        "--inherit-env",
    ]


def build_resources(resources: Resources, config: KubernetesBackendConfig) -> k8s.V1ResourceRequirements:
    """Limits from `Resources`; the agent's overhead on top of memory; disk as ephemeral storage.

    `Resources.pids` has no per-pod field in Kubernetes: the node's `podPidsLimit` (kubelet) applies.
    """
    memory = _quantity_mi(resources.memory_mb + config.agent_memory_overhead_mb)
    disk = _quantity_mi(resources.disk_mb + config.agent_volume_size_mb)
    limits = {"cpu": _millicores(resources.cpu), "memory": memory, "ephemeral-storage": disk}
    ratio = 1.0 if config.guaranteed_qos else config.cpu_request_ratio
    requests = {"cpu": _millicores(resources.cpu * ratio), "memory": memory, "ephemeral-storage": disk}
    return k8s.V1ResourceRequirements(limits=limits, requests=requests)


def pod_deadline_seconds(spec: SandboxCreate, config: KubernetesBackendConfig, *, warm: bool = False) -> int:
    """A sandbox pod's activeDeadlineSeconds: its TTL, capped as the service caps it, so the hard TTL holds
    even if the service dies. A warm pod's is the cap plus the longest it waits unclaimed
    (`warm_pool_max_age_seconds`, then it is replaced): a claim at any age can still lower it to age + the
    full TTL (the API server lowers a deadline, never raises it)."""
    ttl = max(1, int(min(spec.ttl_seconds, config.max_ttl_seconds)))
    return ttl + math.ceil(config.warm_pool_max_age_seconds) if warm else ttl


def build_pod(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    resources: Resources,
    config: KubernetesBackendConfig,
    *,
    secret_name: str,
    annotations: dict[str, str] | None = None,
    warm: bool = False,
) -> k8s.V1Pod:
    """The sandbox pod: the task image, the injected agent, no API credentials, no restarts.
    `annotations`: what a restarted service needs to adopt it (`kubernetes_adopt.pod_annotations`)."""
    if not spec.image:
        raise InvalidRequestError(
            "The Kubernetes backend needs SandboxCreate.image (a container image "
            "reference such as 'python:3.12-slim'); it was empty and the service has no "
            "default (ORCHARD_K8S_DEFAULT_IMAGE)."
        )
    agent_volume, secret_volume = "orchard-agent", "orchard-secret"
    injector = k8s.V1Container(
        name=INJECTOR_CONTAINER,
        image=config.injector_image,
        image_pull_policy="IfNotPresent",
        command=["cp", "-a", f"{INJECTOR_SOURCE}/.", f"{config.agent_mount_path}/"],
        volume_mounts=[k8s.V1VolumeMount(name=agent_volume, mount_path=config.agent_mount_path)],
        resources=k8s.V1ResourceRequirements(
            limits={"cpu": "200m", "memory": "64Mi"},
            requests={"cpu": "200m", "memory": "64Mi"}
            if config.guaranteed_qos
            else {
                # The pod's CPU request is the larger of this and the agent container's: with a low
                # cpu_request_ratio (dense dev nodes) a fixed 50m would decide it, 100 pods = 5 cores.
                "cpu": _millicores(min(0.05, 0.2 * config.cpu_request_ratio)),
                "memory": "32Mi",
            },
        ),
        security_context=k8s.V1SecurityContext(
            run_as_user=65532,
            run_as_non_root=True,
            read_only_root_filesystem=True,
            allow_privilege_escalation=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )
    main = k8s.V1Container(
        name=AGENT_CONTAINER,
        image=spec.image,
        image_pull_policy=config.image_pull_policy,
        command=agent_command(spec, config),
        ports=[k8s.V1ContainerPort(name="agent", container_port=config.agent_port, protocol="TCP")],
        resources=build_resources(resources, config),
        volume_mounts=[
            k8s.V1VolumeMount(name=agent_volume, mount_path=config.agent_mount_path, read_only=True),
            k8s.V1VolumeMount(name=secret_volume, mount_path=config.secret_mount_path, read_only=True),
        ],
        # The task image's own user is kept (SWE images expect root); what it may not do is gain
        # privileges or open raw sockets (ARP/ICMP spoofing past the NetworkPolicy).
        security_context=k8s.V1SecurityContext(
            privileged=False, allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["NET_RAW"])
        ),
    )
    pod_spec = k8s.V1PodSpec(
        init_containers=[injector],
        containers=[main],
        restart_policy="Never",  # a crashed sandbox is reported, never silently restarted without its state
        automount_service_account_token=False,
        service_account_name=config.service_account_name,
        enable_service_links=False,
        hostname=dns_label(sandbox_id),
        active_deadline_seconds=pod_deadline_seconds(spec, config, warm=warm),
        termination_grace_period_seconds=config.delete_grace_seconds,
        security_context=k8s.V1PodSecurityContext(seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
        volumes=[
            k8s.V1Volume(
                name=agent_volume,
                empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=_quantity_mi(config.agent_volume_size_mb)),
            ),
            # The boot key, certificate and key only: the live key never enters the pod, and the boot key
            # is refused once the service re-keyed the agent (runtime.take_over), so a workload that reads
            # it learns nothing. 0444, not 0400: the kubelet makes the files root's, and the agent runs as
            # whatever user the image picks (0400 would lock a non-root agent out of its own files).
            k8s.V1Volume(
                name=secret_volume,
                secret=k8s.V1SecretVolumeSource(
                    secret_name=secret_name,
                    default_mode=0o444,
                    items=[k8s.V1KeyToPath(key=k, path=k) for k in POD_SECRET_KEYS],
                ),
            ),
        ],
        image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in config.image_pull_secrets] or None,
        node_selector=dict(config.node_selector) or None,
        tolerations=[
            k8s.V1Toleration(
                key=t.key, operator=t.operator, value=t.value, effect=t.effect, toleration_seconds=t.toleration_seconds
            )
            for t in config.tolerations
        ]
        or None,
        runtime_class_name=config.runtime_class_name,
        priority_class_name=config.priority_class_name,
    )
    annotations = {**(annotations or {}), WORKDIR_ANNOTATION: spec.workdir}
    # Said either way: scale-down must not kill a running episode unless the operator chose so (safe_to_evict).
    annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "true" if config.safe_to_evict else "false"
    if config.safe_to_evict:
        annotations["cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"] = "orchard-agent"
    meta = object_meta(name, sandbox_id, config, spec, extra_annotations={**annotations, **config.pod_annotations})
    return k8s.V1Pod(api_version="v1", kind="Pod", metadata=meta, spec=pod_spec)


Resolver = Callable[[str], list[str]]


def _default_resolver(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def allowlist_cidrs(policy: NetworkPolicy, resolver: Resolver = _default_resolver) -> list[str]:
    """The CIDRs an allowlist policy opens. Host names are resolved now, at apply time: a NetworkPolicy
    holds addresses only, so a host whose addresses later change needs the policy applied again
    (an FQDN `host_policy` avoids this on Cilium, Antrea or Calico Enterprise, see kubernetes_host_policy)."""
    if policy.mode != "allowlist":
        return []
    cidrs = checked_cidrs(policy.allow_cidrs)
    for host in policy.allow_hosts:
        if host.startswith("*."):
            raise InvalidRequestError(
                f"allow_hosts entry {host!r} is a wildcard, which does not resolve to "
                "addresses; name the hosts, or let the CNI follow names: "
                "ORCHARD_K8S_HOST_POLICY=cilium-fqdn, antrea-fqdn or calico-dns."
            )
        try:
            addresses = resolver(host)
        except OSError as err:
            raise InvalidRequestError(
                f"allow_hosts entry {host!r} did not resolve ({err}); "
                "give a resolvable name or its CIDR in allow_cidrs."
            )
        for address in addresses:
            cidrs.append(str(ipaddress.ip_network(address)))  # a bare address is a /32 or /128
    return sorted(set(cidrs))


def _inside(cidr: str, others: Sequence[str]) -> list[str]:
    """The CIDRs of `others` strictly inside `cidr` (same family)."""
    network = ipaddress.ip_network(cidr)
    return [
        o
        for o in others
        if (net := ipaddress.ip_network(o)).version == network.version and net != network and net.subnet_of(network)
    ]


def _inside_any(cidr: str, others: Sequence[str]) -> bool:
    """Whether `cidr` lies inside one of `others` (same family)."""
    network = ipaddress.ip_network(cidr)
    return any(network.version == (o := ipaddress.ip_network(c)).version and network.subnet_of(o) for c in others)


def reserved_excepts(cidr: str, node_cidrs: Sequence[str] = ()) -> list[str]:
    """What an allowed CIDR never opens, to be excepted from it: the cloud metadata endpoints inside it
    (0.0.0.0/0 holds one), and the nodes' own addresses (`KubernetesBackendConfig.node_cidrs`) inside it,
    reachable only when named one by one."""
    return _inside(cidr, METADATA_CIDRS) + _inside(cidr, node_cidrs)


def opened_cidrs(cidrs: Sequence[str], node_cidrs: Sequence[str] = ()) -> list[str]:
    """The allowed CIDRs that open anything: not one wider than an address that lies among the nodes' own."""
    return [c for c in cidrs if ipaddress.ip_network(c).num_addresses == 1 or not _inside_any(c, node_cidrs)]


def named_node_addresses(cidrs: Sequence[str], node_cidrs: Sequence[str]) -> list[str]:
    """The single addresses an allowlist names among the nodes' own (for CNIs whose rules go in order)."""
    return [c for c in cidrs if ipaddress.ip_network(c).num_addresses == 1 and _inside_any(c, node_cidrs)]


def _ip_block_peer(cidr: str, node_cidrs: Sequence[str]) -> k8s.V1NetworkPolicyPeer:
    """An allowed CIDR that never opens the cloud metadata endpoint (node credentials), even 0.0.0.0/0, nor
    the nodes' own addresses unless it names one of them."""
    excepts = reserved_excepts(cidr, node_cidrs)
    return k8s.V1NetworkPolicyPeer(ip_block=k8s.V1IPBlock(cidr=cidr, _except=excepts or None))


def shared_policy_name(config: KubernetesBackendConfig) -> str:
    return f"orchard-sandboxes-{config.instance}"


def build_shared_network_policy(config: KubernetesBackendConfig) -> k8s.V1NetworkPolicy:
    """One policy for every sandbox pod of this service instance: ingress only from the service pods to
    the agent port, no egress at all. It exists before any pod, so no pod ever runs unprotected, and
    mode `none` (and `loopback`: a pod's loopback cannot be denied) costs no per-sandbox object; on
    Cilium, pods sharing one policy share one identity."""
    service_peer = k8s.V1NetworkPolicyPeer(pod_selector=k8s.V1LabelSelector(match_labels=dict(config.service_selector)))
    if config.service_namespace:
        service_peer.namespace_selector = k8s.V1LabelSelector(
            match_labels={"kubernetes.io/metadata.name": config.service_namespace}
        )
    ingress = [
        k8s.V1NetworkPolicyIngressRule(
            _from=[service_peer], ports=[k8s.V1NetworkPolicyPort(protocol="TCP", port=config.agent_port)]
        )
    ]
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        INSTANCE_LABEL: config.instance,
        "app.kubernetes.io/name": "orchard-sandbox",
        "app.kubernetes.io/component": "sandbox-network",
    }
    return k8s.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=k8s.V1ObjectMeta(name=shared_policy_name(config), namespace=config.namespace, labels=labels),
        spec=k8s.V1NetworkPolicySpec(
            pod_selector=k8s.V1LabelSelector(
                match_labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE, INSTANCE_LABEL: config.instance}
            ),
            policy_types=["Ingress", "Egress"],
            ingress=ingress,
            egress=[],
        ),
    )


def build_network_policy(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    policy: NetworkPolicy,
    cidrs: list[str],
    owner: k8s.V1OwnerReference | None = None,
) -> k8s.V1NetworkPolicy:
    """Per-sandbox policy, for allowlists only: the egress it opens. Policies add up, so ingress and
    the default deny come from the shared policy (`build_shared_network_policy`).

    DNS for host names: the cluster DNS pods, and `dns_cidrs` (NodeLocal DNSCache answers on a
    link-local address from a host-network pod, which no pod selector matches)."""
    egress: list[k8s.V1NetworkPolicyEgressRule] = []
    if opened := opened_cidrs(cidrs, config.node_cidrs):
        egress.append(k8s.V1NetworkPolicyEgressRule(to=[_ip_block_peer(c, config.node_cidrs) for c in opened]))
    if policy.mode == "allowlist" and policy.allow_hosts and config.allow_dns_for_hosts:
        egress.append(
            k8s.V1NetworkPolicyEgressRule(
                to=[
                    k8s.V1NetworkPolicyPeer(
                        namespace_selector=k8s.V1LabelSelector(
                            match_labels={"kubernetes.io/metadata.name": config.dns_namespace}
                        ),
                        pod_selector=k8s.V1LabelSelector(match_labels=dict(config.dns_selector)),
                    )
                ]
                + [k8s.V1NetworkPolicyPeer(ip_block=k8s.V1IPBlock(cidr=c)) for c in config.dns_cidrs],
                ports=[
                    k8s.V1NetworkPolicyPort(protocol="UDP", port=53),
                    k8s.V1NetworkPolicyPort(protocol="TCP", port=53),
                ],
            )
        )
    return k8s.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=object_meta(name, sandbox_id, config, spec, owner=owner),
        spec=k8s.V1NetworkPolicySpec(
            pod_selector=k8s.V1LabelSelector(
                match_labels={SANDBOX_ID_LABEL: label_value(sandbox_id), INSTANCE_LABEL: config.instance}
            ),
            policy_types=["Egress"],
            egress=egress,
        ),
    )


def to_dict(obj: object) -> dict:
    """The JSON body the client sends for a model object (camelCase, Nones dropped)."""
    return k8s.ApiClient().sanitize_for_serialization(obj)
