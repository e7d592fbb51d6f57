"""`host_policy="cilium-fqdn"`: allowlists with host names as a per-sandbox CiliumNetworkPolicy (toFQDNs).

Against the fake API server only (sandbox_service/backends/kubernetes/testing/fake.py), which serves
`cilium.io/v2` `ciliumnetworkpolicies` as a cluster with Cilium's CRD would and checks every body against
a subset of that CRD's schema (kubernetes/testing/crds.py, taken from Cilium's
pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnetworkpolicies.yaml). No Cilium agent enforced these
policies here: that its DNS proxy follows CDN-hosted names is Cilium's documented behaviour, not tested.
"""

from __future__ import annotations

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

from sandbox_service.backends.kubernetes.config import SANDBOX_ID_LABEL
from sandbox_service.backends.kubernetes.testing.fake import running_after
from sandbox_service.errors import InvalidRequestError
from sandbox_service.models import NetworkPolicy, Resources

ALLOW = NetworkPolicy(
    mode="allowlist", allow_hosts=["pypi.org", "*.pythonhosted.org"], allow_cidrs=["0.0.0.0/0", "10.20.0.0/16"]
)


def no_resolution(host: str) -> list[str]:
    raise AssertionError(f"{host} was resolved: cilium-fqdn must hand names to Cilium as they are")


def cilium_backend(fake, tmp_path, **overrides):
    return make_backend(fake, tmp_path, resolver=no_resolution, host_policy="cilium-fqdn", **overrides)


def cilium_policies(fake, sandbox_id: str) -> list[dict]:
    """What a client listing by the sandbox's label gets (the fake's LIST with a label selector)."""
    custom = k8s.CustomObjectsApi(k8s.ApiClient(k8s.Configuration(host=fake.url)))
    return custom.list_namespaced_custom_object(
        "cilium.io", "v2", "orchard", "ciliumnetworkpolicies", label_selector=f"{SANDBOX_ID_LABEL}={sandbox_id}"
    )["items"]


def test_an_allowlist_gets_one_cilium_policy_with_the_hosts_as_fqdns_and_nothing_resolved(fake, tmp_path):
    fake.kubelet = running_after(0)
    fake.gc_enabled = False  # so the policy's deletion by name is what removes it
    backend = cilium_backend(fake, tmp_path)
    backend.start("sb-fqdn", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")

    (policy,) = cilium_policies(fake, "sb-fqdn")
    assert [p["metadata"]["name"] for p in fake.of_kind("networkpolicies")] == ["orchard-sandboxes-default"]
    spec = policy["spec"]
    assert spec["endpointSelector"] == {
        "matchLabels": {"orchard.dev/sandbox-id": "sb-fqdn", "orchard.dev/service-instance": "default"}
    }
    cidrs, fqdns, dns = spec["egress"]
    assert cidrs == {
        "toCIDRSet": [
            {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32", "169.254.169.252/32", "169.254.170.23/32"]},
            {"cidr": "10.20.0.0/16"},
        ]
    }
    assert fqdns == {"toFQDNs": [{"matchName": "pypi.org"}, {"matchPattern": "*.pythonhosted.org"}]}
    assert dns["toEndpoints"] == [
        {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}
    ]
    assert dns["toPorts"] == [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": [{"matchPattern": "*"}]}}]
    # denied outright too: a deny beats the toFQDNs allow of a name whose answer is the metadata endpoint
    assert spec["egressDeny"] == [
        {
            "toCIDRSet": [
                {"cidr": c}
                for c in (
                    "169.254.169.254/32",
                    "169.254.169.252/32",
                    "169.254.170.23/32",
                    "fd00:ec2::254/128",
                    "fd00:ec2::23/128",
                )
            ]
        }
    ]
    (pod,) = fake.of_kind("pods")
    assert policy["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    ]
    assert policy["metadata"]["name"] == pod["metadata"]["name"]

    backend.stop("sb-fqdn")
    assert cilium_policies(fake, "sb-fqdn") == [] and sandbox_objects(fake) == {}
    assert [r["name"] for r in fake.sent("DELETE", "ciliumnetworkpolicies")] == [pod["metadata"]["name"]]


def test_a_cidr_only_allowlist_opens_no_dns_and_none_mode_creates_no_policy(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = cilium_backend(fake, tmp_path)
    backend.start(
        "sb-cidr",
        SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/8"])}),
        Resources(),
        "s",
    )
    (policy,) = cilium_policies(fake, "sb-cidr")
    assert policy["spec"]["egress"] == [{"toCIDRSet": [{"cidr": "10.0.0.0/8"}]}]
    backend.start("sb-none", SPEC, Resources(), "s")
    assert cilium_policies(fake, "sb-none") == [] and len(fake.sent("POST", "ciliumnetworkpolicies")) == 1


def test_apply_replaces_the_cilium_policy_and_a_bad_host_changes_nothing(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = cilium_backend(fake, tmp_path)
    backend.start("sb-apply", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")
    backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_hosts=["github.com"]))
    (policy,) = cilium_policies(fake, "sb-apply")
    assert policy["spec"]["egress"][0] == {"toFQDNs": [{"matchName": "github.com"}]}
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    with pytest.raises(InvalidRequestError, match="not a host name"):
        backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_hosts=["git hub.com"]))
    with pytest.raises(InvalidRequestError, match="metadata endpoint"):
        backend.apply_network_policy("sb-apply", NetworkPolicy(mode="allowlist", allow_cidrs=["169.254.169.254/32"]))
    (kept,) = cilium_policies(fake, "sb-apply")
    assert kept["spec"] == policy["spec"]
    backend.apply_network_policy("sb-apply", NetworkPolicy(mode="none"))
    assert cilium_policies(fake, "sb-apply") == []


def test_a_bad_host_fails_start_before_any_object_exists(fake, tmp_path):
    backend = cilium_backend(fake, tmp_path)
    with pytest.raises(InvalidRequestError, match="wildcard only as a leading"):
        backend.start(
            "sb-bad",
            SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["pypi.*.org"])}),
            Resources(),
            "s",
        )
    assert fake.requests == []


def test_the_fake_refuses_a_cilium_policy_the_crd_would_not_take(fake):
    """The CRD schema check can say no: a misspelt rule and a malformed name give 422."""
    custom = k8s.CustomObjectsApi(k8s.ApiClient(k8s.Configuration(host=fake.url)))
    base = {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {"endpointSelector": {"matchLabels": {"a": "b"}}},
    }
    for egress in (
        [{"toFQDN": [{"matchName": "pypi.org"}]}],
        [{"toFQDNs": [{"matchName": "pypi org"}]}],
        [{"toCIDRSet": [{"cidr": "10.0.0.0/33"}]}],
    ):
        body = {**base, "spec": {**base["spec"], "egress": egress}}
        with pytest.raises(k8s.exceptions.ApiException) as caught:
            custom.create_namespaced_custom_object("cilium.io", "v2", "orchard", "ciliumnetworkpolicies", body)
        assert caught.value.status == 422 and "schema" in caught.value.body
    assert fake.objects == {}


def test_resolve_is_unchanged_no_cilium_call_and_wildcards_are_refused_with_the_option_named(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = make_backend(fake, tmp_path)  # host_policy defaults to resolve
    backend.start(
        "sb-res",
        SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["pypi.org"])}),
        Resources(),
        "s",
    )
    (policy,) = [p for p in fake.of_kind("networkpolicies") if "ownerReferences" in p["metadata"]]
    assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "93.184.216.34/32"}}]
    backend.stop("sb-res")
    assert not [r for r in fake.requests if r["kind"] == "ciliumnetworkpolicies"]
    with pytest.raises(InvalidRequestError, match="cilium-fqdn"):
        backend.start(
            "sb-wild",
            SPEC.model_copy(update={"network": NetworkPolicy(mode="allowlist", allow_hosts=["*.pythonhosted.org"])}),
            Resources(),
            "s",
        )


def test_an_adopted_allowlist_sandbox_deletes_its_cilium_policy_by_name(fake, tmp_path):
    fake.kubelet = running_after(0)
    fake.gc_enabled = False  # the delete by name, not the garbage collector, removes it
    cilium_backend(fake, tmp_path).start("sb-adopt", SPEC.model_copy(update={"network": ALLOW}), Resources(), "s")
    restarted = cilium_backend(fake, tmp_path)
    (adopted,) = restarted.adopt()
    assert adopted.sandbox_id == "sb-adopt" and len(cilium_policies(fake, "sb-adopt")) == 1
    restarted.stop("sb-adopt")
    assert cilium_policies(fake, "sb-adopt") == [] and sandbox_objects(fake) == {}


def test_the_nodes_own_addresses_open_only_when_named_one_by_one(fake, tmp_path):
    fake.kubelet = running_after(0)
    backend = cilium_backend(fake, tmp_path, node_cidrs=NODE_CIDRS)
    backend.start("sb-nodes", SPEC.model_copy(update={"network": NODES_IN_ALLOWLIST}), Resources(), "s")
    (policy,) = cilium_policies(fake, "sb-nodes")
    assert policy["spec"]["egress"] == [
        {
            "toCIDRSet": [
                {"cidr": "10.0.0.0/8", "except": ["10.30.0.0/24"]},
                {"cidr": "10.30.0.7/32"},
                {"cidr": "::/0", "except": ["fd00:ec2::254/128", "fd00:ec2::23/128", "fd00:30::/64"]},
            ]
        }
    ]
