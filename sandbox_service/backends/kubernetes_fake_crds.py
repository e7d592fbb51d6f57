"""JSON schemas of the custom resources the fake API server serves, as a cluster with the CRD installed
would check them (a CRD's `openAPIV3Schema`; kubernetes-validate knows built-in kinds only).

CiliumNetworkPolicy (cilium.io/v2): a subset of the CRD's schema in Cilium's repository,
`pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnetworkpolicies.yaml` (Cilium 1.15/1.16), covering exactly
the fields `kubernetes_cilium.build_cilium_policy` writes, with the CRD's patterns, enums and maxLength.
Stricter than the CRD on purpose: `additionalProperties: false` on the parts used, so a misspelt field
(which the real API server would prune silently, leaving a policy that allows less or more) fails here.
"""

from __future__ import annotations

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR = {"type": "object", "additionalProperties": False,
             "properties": {"matchLabels": _LABELS,
                            "matchExpressions": {"type": "array", "items": {"type": "object"}}}}
_CIDR_RULE = {"type": "object", "additionalProperties": False, "required": ["cidr"],
              "properties": {"cidr": {"type": "string", "format": "cidr"},
                             "except": {"type": "array", "items": {"type": "string", "format": "cidr"}}}}
_FQDN = {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
         "properties": {"matchName": {"type": "string", "maxLength": 255, "pattern": r"^([-a-zA-Z0-9_]+[.]?)+$"},
                        "matchPattern": {"type": "string", "maxLength": 255,
                                         "pattern": r"^([-a-zA-Z0-9_*]+[.]?)+$"}}}
_PORT_RULE = {"type": "object", "additionalProperties": False, "properties": {
    "ports": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["port"],
        "properties": {"port": {"type": "string", "pattern": r"^(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|"
                                                             r"6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})|"
                                                             r"([a-zA-Z0-9]-?)*[a-zA-Z](-?[a-zA-Z0-9])*$"},
                       "protocol": {"enum": ["TCP", "UDP", "SCTP", "ICMP", "ICMPV6", "ANY"]}}}},
    "rules": {"type": "object", "properties": {"dns": {"type": "array", "items": _FQDN}}}}}
_EGRESS = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
    "toCIDRSet": {"type": "array", "items": _CIDR_RULE},
    "toFQDNs": {"type": "array", "items": _FQDN},
    "toEndpoints": {"type": "array", "items": _SELECTOR},
    "toPorts": {"type": "array", "items": _PORT_RULE}}}

CILIUM_NETWORK_POLICY = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cilium.io/v2"},
        "kind": {"const": "CiliumNetworkPolicy"},
        "metadata": {"type": "object"},  # checked by the fake's name/label rules
        "spec": {"type": "object", "additionalProperties": False, "required": ["endpointSelector"],
                 "anyOf": [{"required": ["egress"]}, {"required": ["ingress"]}],
                 "properties": {"endpointSelector": _SELECTOR, "egress": {"type": "array", "items": _EGRESS},
                                "ingress": {"type": "array", "items": {"type": "object"}},
                                "description": {"type": "string"}}},
    },
}

SCHEMAS = {"ciliumnetworkpolicies": CILIUM_NETWORK_POLICY}
