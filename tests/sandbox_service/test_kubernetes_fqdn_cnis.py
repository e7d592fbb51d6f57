"""`host_policy="antrea-fqdn"` and `"calico-dns"`: allowlists as a per-sandbox Antrea or Calico policy with
the host names kept as names (the Cilium one: test_kubernetes_cilium.py).

Against the fake API server only (sandbox_service/backends/kubernetes/testing/fake.py), which serves
`crd.antrea.io/v1beta1` and `projectcalico.org/v3` networkpolicies as a cluster with Antrea's CRD or
Calico Enterprise's API server would, and checks every body against a subset of their schemas
(kubernetes/testing/crds.py). No Antrea agent or Calico Felix enforced these policies here: that they
follow the names' DNS answers is the CNIs' documented behaviour, not tested.
"""

from __future__ import annotations

from typing import get_args

import pytest
from kubernetes import client as k8s
from test_kubernetes_contract import (
    NODE_CIDRS,
    NODES_IN_ALLOWLIST,
    SPEC,
    fake,  # noqa: F401 - a fixture, named as a parameter
    make_backend,
    sandbox_objects,
)

from sandbox_service.backends.kubernetes.config import SANDBOX_ID_LABEL, KubernetesBackendConfig
from sandbox_service.backends.kubernetes.testing.fake import running_after
from sandbox_service.backends.kubernetes.testing.crds import CUSTOM_RESOURCES
from sandbox_service.backends.kubernetes.network.host_policy import FQDN_POLICY_TYPES
from sandbox_service.errors import InvalidRequestError, SandboxServiceError
from sandbox_service.models import NetworkPolicy, Resources

ALLOW = NetworkPolicy(
    mode="allowlist",
    allow_hosts=["pypi.org", "*.pythonhosted.org"],
    allow_cidrs=["0.0.0.0/0", "10.20.0.0/16", "2001:db8::/32"],
)
API = {"antrea-fqdn": ("crd.antrea.io", "v1beta1"), "calico-dns": ("projectcalico.org", "v3")}
KIND_KEY = {"antrea-fqdn": "networkpolicies.crd.antrea.io", "calico-dns": "networkpolicies.projectcalico.org"}


def no_resolution(host: str) -> list[str]:
    raise AssertionError(f"{host} was resolved: an FQDN policy must hand names to the CNI as they are")


def fqdn_backend(fake, tmp_path, host_policy: str, **overrides):
    return make_backend(fake, tmp_path, resolver=no_resolution, host_policy=host_policy, **overrides)


def policies(fake, host_policy: str, sandbox_id: str) -> list[dict]:
    """What a client listing the CNI's resource by the sandbox's label gets."""
    custom = k8s.CustomObjectsApi(k8s.ApiClient(k8s.Configuration(host=fake.url)))
    return custom.list_namespaced_custom_object(
        *API[host_policy], "orchard", "networkpolicies", label_selector=f"{SANDBOX_ID_LABEL}={sandbox_id}"
    )["items"]


def start_allowlisted(fake, tmp_path, host_policy: str, sandbox_id: str, network=ALLOW):
    fake.kubelet = running_after(0)
    backend = fqdn_backend(fake, tmp_path, host_policy)
    backend.start(sandbox_id, SPEC.model_copy(update={"network": network}), Resources(), "s")
    return backend


# -- Antrea ------------------------------------------------------------------------------------------------
def test_antrea_gets_one_policy_with_fqdn_peers_metadata_dropped_first_dns_and_a_final_drop(fake, tmp_path):
    fake.gc_enabled = False  # so the policy's deletion by name is what removes it
    backend = start_allowlisted(fake, tmp_path, "antrea-fqdn", "sb-antrea")
    (policy,) = policies(fake, "antrea-fqdn", "sb-antrea")
    assert [p["metadata"]["name"] for p in fake.of_kind("networkpolicies")] == ["orchard-sandboxes-default"]
    spec = policy["spec"]
    assert spec["appliedTo"] == [
        {
            "podSelector": {
                "matchLabels": {"orchard.dev/sandbox-id": "sb-antrea", "orchard.dev/service-instance": "default"}
            }
        }
    ]
    assert 1 <= spec["priority"] <= 10000
    rules = {rule["name"]: rule for rule in spec["egress"]}
    assert list(rules) == ["drop-metadata", "allow-cidrs", "allow-hosts", "allow-dns", "drop-rest"]  # in order
    assert rules["drop-metadata"] == {
        "name": "drop-metadata",
        "action": "Drop",
        "to": [
            {"ipBlock": {"cidr": c}}
            for c in (
                "169.254.169.254/32",
                "169.254.169.252/32",
                "169.254.170.23/32",
                "fd00:ec2::254/128",
                "fd00:ec2::23/128",
            )
        ],
    }
    assert rules["allow-cidrs"]["to"] == [
        {"ipBlock": {"cidr": c}} for c in ("0.0.0.0/0", "10.20.0.0/16", "2001:db8::/32")
    ]
    assert rules["allow-hosts"] == {
        "name": "allow-hosts",
        "action": "Allow",
        "to": [{"fqdn": "pypi.org"}, {"fqdn": "*.pythonhosted.org"}],
    }
    assert rules["allow-dns"]["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        },
        {"ipBlock": {"cidr": "169.254.20.10/32"}},
    ]  # NodeLocal DNSCache
    assert rules["allow-dns"]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert rules["drop-rest"] == {"name": "drop-rest", "action": "Drop"}  # no `to`: everything else
    (pod,) = fake.of_kind("pods")
    assert policy["metadata"]["name"] == pod["metadata"]["name"]
    assert policy["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    ]
    assert policy["metadata"]["labels"]["orchard.dev/owner"] == "0"  # the replica's, like every object

    backend.stop("sb-antrea")
    assert policies(fake, "antrea-fqdn", "sb-antrea") == [] and sandbox_objects(fake) == {}
    assert [r["name"] for r in fake.sent("DELETE", KIND_KEY["antrea-fqdn"])] == [pod["metadata"]["name"]]


def test_antrea_refuses_an_underscore_before_any_object_exists(fake, tmp_path):
    backend = fqdn_backend(fake, tmp_path, "antrea-fqdn")
    with pytest.raises(InvalidRequestError, match="Antrea refuses"):
        backend.start(
            "sb-under",
            SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["_dmarc.example.com"])}),
            Resources(),
            "s",
        )
    assert fake.requests == []


# -- Calico ------------------------------------------------------------------------------------------------
def test_calico_gets_one_policy_with_domains_metadata_denied_first_dns_and_a_final_deny(fake, tmp_path):
    fake.gc_enabled = False
    backend = start_allowlisted(fake, tmp_path, "calico-dns", "sb-calico")
    (policy,) = policies(fake, "calico-dns", "sb-calico")
    assert [p["metadata"]["name"] for p in fake.of_kind("networkpolicies")] == ["orchard-sandboxes-default"]
    spec = policy["spec"]
    assert spec["selector"] == "orchard.dev/sandbox-id == 'sb-calico' && orchard.dev/service-instance == 'default'"
    assert spec["types"] == ["Egress"] and "tier" not in spec  # the default tier: the Role's tier.networkpolicies
    assert spec["egress"] == [
        {
            "action": "Deny",
            "destination": {"nets": ["169.254.169.254/32", "169.254.169.252/32", "169.254.170.23/32"]},
        },  # first: even an allowed name's answer
        {"action": "Deny", "destination": {"nets": ["fd00:ec2::254/128", "fd00:ec2::23/128"]}},
        {"action": "Allow", "destination": {"nets": ["0.0.0.0/0", "10.20.0.0/16"]}},  # one IP family per rule
        {"action": "Allow", "destination": {"nets": ["2001:db8::/32"]}},
        {"action": "Allow", "destination": {"domains": ["pypi.org", "*.pythonhosted.org"]}},
        {
            "action": "Allow",
            "protocol": "UDP",
            "destination": {
                "namespaceSelector": "projectcalico.org/name == 'kube-system'",
                "selector": "k8s-app == 'kube-dns'",
                "ports": [53],
            },
        },
        {"action": "Allow", "protocol": "UDP", "destination": {"nets": ["169.254.20.10/32"], "ports": [53]}},
        {
            "action": "Allow",
            "protocol": "TCP",
            "destination": {
                "namespaceSelector": "projectcalico.org/name == 'kube-system'",
                "selector": "k8s-app == 'kube-dns'",
                "ports": [53],
            },
        },
        {"action": "Allow", "protocol": "TCP", "destination": {"nets": ["169.254.20.10/32"], "ports": [53]}},
        {"action": "Deny"},
    ]
    (pod,) = fake.of_kind("pods")
    assert policy["metadata"]["name"] == pod["metadata"]["name"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]

    backend.stop("sb-calico")
    assert policies(fake, "calico-dns", "sb-calico") == [] and sandbox_objects(fake) == {}
    assert [r["name"] for r in fake.sent("DELETE", KIND_KEY["calico-dns"])] == [pod["metadata"]["name"]]


# -- both ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host_policy", ["antrea-fqdn", "calico-dns"])
def test_a_cidr_only_allowlist_opens_no_dns_and_none_mode_creates_no_policy(fake, tmp_path, host_policy):
    backend = start_allowlisted(
        fake, tmp_path, host_policy, "sb-cidr", NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/8"])
    )
    (policy,) = policies(fake, host_policy, "sb-cidr")
    text = str(policy["spec"])
    assert "10.0.0.0/8" in text and "169.254.169.254/32" in text
    assert "53" not in text and "fqdn" not in text and "domains" not in text
    backend.start("sb-none", SPEC, Resources(), "s")
    assert policies(fake, host_policy, "sb-none") == [] and len(fake.sent("POST", KIND_KEY[host_policy])) == 1
    assert not fake.sent("POST", "networkpolicies")[1:]  # only the shared deny-all: no resolved policy either


@pytest.mark.parametrize("host_policy", ["antrea-fqdn", "calico-dns"])
def test_apply_replaces_the_policy_and_a_bad_allowlist_changes_nothing(fake, tmp_path, host_policy):
    backend = start_allowlisted(fake, tmp_path, host_policy, "sb-apply")
    backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_hosts=["github.com"]))
    (policy,) = policies(fake, host_policy, "sb-apply")
    assert "github.com" in str(policy["spec"]) and "pypi.org" not in str(policy["spec"])
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    with pytest.raises(InvalidRequestError, match="not a host name"):
        backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_hosts=["git hub.com"]))
    with pytest.raises(InvalidRequestError, match="metadata endpoint"):
        backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_cidrs=["169.254.169.254/32"]))
    (kept,) = policies(fake, host_policy, "sb-apply")
    assert kept["spec"] == policy["spec"]
    backend.apply_network_policy("sb-apply", NetworkPolicy(mode="none"))
    assert policies(fake, host_policy, "sb-apply") == []


@pytest.mark.parametrize("host_policy", ["antrea-fqdn", "calico-dns"])
def test_an_adopted_allowlist_sandbox_deletes_its_policy_by_name(fake, tmp_path, host_policy):
    fake.gc_enabled = False  # the delete by name, not the garbage collector, removes it
    start_allowlisted(fake, tmp_path, host_policy, "sb-adopt")
    restarted = fqdn_backend(fake, tmp_path, host_policy)
    (adopted,) = restarted.adopt()
    assert adopted.sandbox_id == "sb-adopt" and len(policies(fake, host_policy, "sb-adopt")) == 1
    restarted.stop("sb-adopt")
    assert policies(fake, host_policy, "sb-adopt") == [] and sandbox_objects(fake) == {}


@pytest.mark.parametrize("host_policy", ["antrea-fqdn", "calico-dns"])
def test_a_reaped_orphan_takes_its_policy_along_through_its_pod(fake, tmp_path, host_policy):
    """Policies are never listed (no `list` right): an orphan's goes with its pod, by the ownerReference."""
    start_allowlisted(fake, tmp_path, host_policy, "sb-orphan")
    restarted = fqdn_backend(fake, tmp_path, host_policy, adopt_on_restart=False)
    assert restarted.adopt() == [] and restarted.list_orphans() == ["sb-orphan"]
    restarted.stop("sb-orphan")
    assert policies(fake, host_policy, "sb-orphan") == [] and sandbox_objects(fake) == {}
    assert not fake.sent("DELETE", KIND_KEY[host_policy])  # the garbage collector's doing, not a delete


@pytest.mark.parametrize("host_policy", ["antrea-fqdn", "calico-dns"])
def test_a_failed_start_leaves_no_policy_behind(fake, tmp_path, host_policy):
    fake.gc_enabled = False  # the cleanup's delete by name, not the garbage collector
    fake.fail("POST", KIND_KEY[host_policy], 422, "Invalid", after=True)  # created, then the answer says no
    backend = fqdn_backend(fake, tmp_path, host_policy)
    fake.kubelet = running_after(0)
    with pytest.raises(InvalidRequestError, match="rejected the object"):
        backend.start("sb-fail", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")
    assert policies(fake, host_policy, "sb-fail") == [] and sandbox_objects(fake) == {}


def prune_hosts(body: dict) -> None:
    """What an API server that does not know the host-name field stores (Calico Open Source prunes `domains`)."""
    for rule in body["spec"]["egress"]:
        rule.get("destination", {}).pop("domains", None)
        for peer in rule.get("to", []):
            peer.pop("fqdn", None)


@pytest.mark.parametrize(
    "host_policy, needs", [("antrea-fqdn", "Antrea >= 1.13"), ("calico-dns", "Calico Enterprise or Calico Cloud")]
)
def test_a_server_that_drops_the_host_names_gets_no_policy_and_a_clear_error(fake, tmp_path, host_policy, needs):
    """Pruned, the hosts' Allow rule would have no destination left: open to everything. Never kept."""
    fake.kubelet = running_after(0)
    backend = fqdn_backend(fake, tmp_path, host_policy)
    create = backend.network.fqdn.create
    backend.network.fqdn.create = lambda ns, body, **kw: prune_hosts(body) or create(ns, body, **kw)
    with pytest.raises(SandboxServiceError, match=f"stored it without the allowed hosts.*needs {needs}"):
        backend.start("sb-pruned", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")
    assert policies(fake, host_policy, "sb-pruned") == [] and sandbox_objects(fake) == {}
    backend.network.fqdn.create = create  # a server that keeps them: then apply meets the pruning one
    backend.start("sb-kept", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")
    backend.network.fqdn.create = lambda ns, body, **kw: prune_hosts(body) or create(ns, body, **kw)
    with pytest.raises(SandboxServiceError, match="stored it without the allowed hosts"):
        backend.apply_network_policy("sb-kept", NetworkPolicy(mode="allowlist", allow_hosts=["github.com"]))
    assert policies(fake, host_policy, "sb-kept") == []  # the shared deny-all is what is left: the safe side


def test_the_fake_refuses_policies_the_crds_would_not_take(fake):
    """The schema checks can say no: each body below is one mistake away from a valid one."""
    custom = k8s.CustomObjectsApi(k8s.ApiClient(k8s.Configuration(host=fake.url)))
    antrea = {
        "apiVersion": "crd.antrea.io/v1beta1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {"priority": 5, "appliedTo": [{"podSelector": {"matchLabels": {"a": "b"}}}]},
    }
    calico = {
        "apiVersion": "projectcalico.org/v3",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {"selector": "a == 'b'", "types": ["Egress"]},
    }
    bad = [
        ("antrea-fqdn", antrea, {"egress": [{"action": "Allow", "to": [{"fqdn": "pypi org"}]}]}),
        ("antrea-fqdn", antrea, {"egress": [{"to": [{"fqdn": "pypi.org"}]}]}),  # no action
        ("antrea-fqdn", antrea, {"priority": 0}),
        ("antrea-fqdn", antrea, {"egress": [{"action": "Allow", "to": [{"fdqn": "pypi.org"}]}]}),
        ("calico-dns", calico, {"egress": [{"action": "Deny", "destination": {"domains": ["pypi.org"]}}]}),
        (
            "calico-dns",
            calico,
            {"egress": [{"action": "Allow", "destination": {"domains": ["pypi.org"], "nets": ["10.0.0.0/8"]}}]},
        ),
        ("calico-dns", calico, {"egress": [{"action": "Allow", "destination": {"ports": [53]}}]}),  # no protocol
        ("calico-dns", calico, {"egress": [{"action": "Allow", "destination": {"nets": ["10.0.0.0/33"]}}]}),
        ("calico-dns", calico, {"egress": [{"action": "Allow", "destinaton": {"nets": ["10.0.0.0/8"]}}]}),
    ]
    for host_policy, base, change in bad:
        body = {**base, "spec": {**base["spec"], **change}}
        with pytest.raises(k8s.exceptions.ApiException) as caught:
            custom.create_namespaced_custom_object(*API[host_policy], "orchard", "networkpolicies", body)
        assert caught.value.status == 422 and "schema" in caught.value.body, change
    for host_policy, base in (("antrea-fqdn", antrea), ("calico-dns", calico)):  # and yes to the valid ones
        custom.create_namespaced_custom_object(*API[host_policy], "orchard", "networkpolicies", base)
    assert len(fake.objects) == 2


def test_every_host_policy_value_but_resolve_has_one_fqdn_policy_the_fake_serves():
    values = set(get_args(KubernetesBackendConfig.model_fields["host_policy"].annotation))
    assert set(FQDN_POLICY_TYPES) == values - {"resolve"}
    assert len({t.kind for t in FQDN_POLICY_TYPES.values()}) == len(FQDN_POLICY_TYPES)
    served = {(api_version, key.split(".")[0]) for key, (_, api_version) in CUSTOM_RESOURCES.items()}
    assert {(f"{t.group}/{t.version}", t.plural) for t in FQDN_POLICY_TYPES.values()} == served


def test_the_nodes_own_addresses_open_only_when_named_one_by_one(fake, tmp_path):
    """Rules in order: the named node address is allowed before the nodes are dropped, and wider CIDRs come after."""
    for host_policy in ("antrea-fqdn", "calico-dns"):
        fake.kubelet = running_after(0)
        backend = fqdn_backend(fake, tmp_path, host_policy, node_cidrs=NODE_CIDRS)
        sandbox_id = f"sb-{host_policy[:6]}"
        backend.start(sandbox_id, SPEC.model_copy(update={"network": NODES_IN_ALLOWLIST}), Resources(), "s")
        (policy,) = policies(fake, host_policy, sandbox_id)
        egress = policy["spec"]["egress"]
        if host_policy == "antrea-fqdn":
            rules = [(r["name"], [peer["ipBlock"]["cidr"] for peer in r.get("to", [])]) for r in egress]
            assert rules[1:] == [
                ("allow-named-nodes", ["10.30.0.7/32"]),
                ("drop-nodes", NODE_CIDRS),
                ("allow-cidrs", ["10.0.0.0/8", "10.30.0.7/32", "::/0"]),
                ("drop-rest", []),
            ]
        else:
            rules = [(r["action"], r.get("destination", {}).get("nets")) for r in egress]
            assert rules[2:] == [
                ("Allow", ["10.30.0.7/32"]),
                ("Deny", ["10.30.0.0/24"]),
                ("Deny", ["fd00:30::/64"]),
                ("Allow", ["10.0.0.0/8", "10.30.0.7/32"]),
                ("Allow", ["::/0"]),
                ("Deny", None),
            ]
