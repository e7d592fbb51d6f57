"""JSON schemas of the custom resources the fake API server serves, as a cluster with the CRD installed
would check them (a CRD's `openAPIV3Schema`; kubernetes-validate knows built-in kinds only).

Each is a subset of the real schema covering exactly the fields the builders write, with the CRD's
patterns, enums and bounds. Stricter than the CRDs on purpose: `additionalProperties: false` on the parts
used, so a misspelt field (which the real API server would prune silently, leaving a policy that allows
less or more) fails here. Sources:
- CiliumNetworkPolicy (cilium.io/v2): Cilium's `pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnetworkpolicies.yaml`
  (Cilium 1.15/1.16), for `kubernetes_cilium.build_cilium_policy`.
- Antrea NetworkPolicy (crd.antrea.io/v1beta1): Antrea's `build/charts/antrea/crds/networkpolicy.yaml`
  (main, 2026-08, v2.8.0-dev), plus its admission webhook's fqdn character check
  (`pkg/controller/networkpolicy/validate.go`), for `kubernetes_antrea.build_antrea_policy`.
- Calico NetworkPolicy (projectcalico.org/v3): Calico's `api/config/crd/projectcalico.org_networkpolicies.yaml`
  (main, 2026-08), plus `destination.domains`, which only Calico Enterprise/Cloud has (their EntityRule
  reference: egress Allow rules only, with `nets` and `selector` empty), for `kubernetes_calico.build_calico_policy`.
"""

from __future__ import annotations

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array", "items": {"type": "object"}}},
}
_CIDR_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["cidr"],
    "properties": {
        "cidr": {"type": "string", "format": "cidr"},
        "except": {"type": "array", "items": {"type": "string", "format": "cidr"}},
    },
}
_FQDN = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "matchName": {"type": "string", "maxLength": 255, "pattern": r"^([-a-zA-Z0-9_]+[.]?)+$"},
        "matchPattern": {"type": "string", "maxLength": 255, "pattern": r"^([-a-zA-Z0-9_*]+[.]?)+$"},
    },
}
_PORT_RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["port"],
                "properties": {
                    "port": {
                        "type": "string",
                        "pattern": r"^(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|"
                        r"6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})|"
                        r"([a-zA-Z0-9]-?)*[a-zA-Z](-?[a-zA-Z0-9])*$",
                    },
                    "protocol": {"enum": ["TCP", "UDP", "SCTP", "ICMP", "ICMPV6", "ANY"]},
                },
            },
        },
        "rules": {"type": "object", "properties": {"dns": {"type": "array", "items": _FQDN}}},
    },
}
_EGRESS = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "toCIDRSet": {"type": "array", "items": _CIDR_RULE},
        "toFQDNs": {"type": "array", "items": _FQDN},
        "toEndpoints": {"type": "array", "items": _SELECTOR},
        "toPorts": {"type": "array", "items": _PORT_RULE},
    },
}


def _custom_object(api_version: str, kind: str, spec: dict) -> dict:
    """The schema of a whole custom object: its apiVersion and kind, any metadata (the fake's name/label
    rules check it), and `spec`."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }


CILIUM_NETWORK_POLICY = _custom_object(
    "cilium.io/v2",
    "CiliumNetworkPolicy",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["endpointSelector"],
        "anyOf": [{"required": ["egress"]}, {"required": ["ingress"]}],
        "properties": {
            "endpointSelector": _SELECTOR,
            "egress": {"type": "array", "items": _EGRESS},
            "egressDeny": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "properties": {"toCIDRSet": {"type": "array", "items": _CIDR_RULE}},
                },
            },
            "ingress": {"type": "array", "items": {"type": "object"}},
            "description": {"type": "string"},
        },
    },
)

_LABEL_VALUE = {"type": "string", "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
_ANTREA_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": _LABEL_VALUE},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_ANTREA_PEER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "podSelector": _ANTREA_SELECTOR,
        "namespaceSelector": _ANTREA_SELECTOR,
        "ipBlock": {
            "type": "object",
            "additionalProperties": False,
            "required": ["cidr"],
            "properties": {
                "cidr": {"type": "string", "format": "cidr"},
                "except": {"type": "array", "items": {"type": "string", "format": "cidr"}},
            },
        },
        "fqdn": {"type": "string", "pattern": r"^[-0-9a-zA-Z.*]+$"},  # the webhook's allowedFQDNChars
        "group": {"type": "string"},
    },
}
_ANTREA_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action"],
    "properties": {
        "name": {"type": "string"},
        "action": {"enum": ["Allow", "Drop", "Reject", "Pass"]},
        "to": {"type": "array", "items": _ANTREA_PEER},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                    "port": {"type": ["integer", "string"]},
                    "endPort": {"type": "integer"},
                },
            },
        },
        "enableLogging": {"type": "boolean"},
    },
}
ANTREA_NETWORK_POLICY = _custom_object(
    "crd.antrea.io/v1beta1",
    "NetworkPolicy",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["priority"],
        "properties": {
            "tier": {"type": "string"},
            "priority": {"type": "number", "minimum": 1, "maximum": 10000},
            "appliedTo": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"podSelector": _ANTREA_SELECTOR, "group": {"type": "string"}},
                },
            },
            "egress": {"type": "array", "items": _ANTREA_RULE},
            "ingress": {"type": "array", "items": {"type": "object"}},
        },
    },
)

_PORTS = {"type": "array", "maxItems": 50, "items": {"type": ["integer", "string"]}}
_NETS = {"type": "array", "maxItems": 256, "items": {"type": "string", "format": "cidr"}}
_ENTITY_RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "nets": _NETS,
        "notNets": _NETS,
        "selector": {"type": "string", "maxLength": 1024},
        "namespaceSelector": {"type": "string", "maxLength": 1024},
        "ports": _PORTS,
        "domains": {"type": "array", "items": {"type": "string"}},
    },
}  # Calico Enterprise/Cloud only
_CALICO_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action"],
    "properties": {
        "action": {"enum": ["Allow", "Deny", "Log", "Pass"]},
        "protocol": {
            "anyOf": [
                {"enum": ["TCP", "UDP", "ICMP", "ICMPv6", "SCTP", "UDPLite"]},
                {"type": "integer", "minimum": 1, "maximum": 255},
            ]
        },
        "ipVersion": {"enum": [4, 6]},
        "destination": _ENTITY_RULE,
        "source": _ENTITY_RULE,
    },
    "allOf": [
        # ports only with a protocol that has them (Calico's validation)
        {
            "if": {"required": ["destination"], "properties": {"destination": {"required": ["ports"]}}},
            "then": {"required": ["protocol"], "properties": {"protocol": {"enum": ["TCP", "UDP", "SCTP"]}}},
        },
        # domains: egress Allow rules only, with nets and selector empty (Calico Enterprise's EntityRule)
        {
            "if": {"required": ["destination"], "properties": {"destination": {"required": ["domains"]}}},
            "then": {
                "properties": {
                    "action": {"const": "Allow"},
                    "destination": {"not": {"anyOf": [{"required": ["nets"]}, {"required": ["selector"]}]}},
                }
            },
        },
    ],
}
CALICO_NETWORK_POLICY = _custom_object(
    "projectcalico.org/v3",
    "NetworkPolicy",
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "tier": {"type": "string"},
            "order": {"type": "number"},
            "selector": {"type": "string", "maxLength": 1024},
            "types": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "uniqueItems": True,
                "items": {"enum": ["Ingress", "Egress"]},
            },
            "egress": {"type": "array", "items": _CALICO_RULE},
            "ingress": {"type": "array", "items": _CALICO_RULE},
        },
    },
)

# The fake's kind key -> (kind, apiVersion). The key is the plural, or kubectl's `plural.group` where a
# built-in resource has the same plural (networkpolicies of networking.k8s.io).
CUSTOM_RESOURCES = {
    "ciliumnetworkpolicies": ("CiliumNetworkPolicy", "cilium.io/v2"),
    "networkpolicies.crd.antrea.io": ("NetworkPolicy", "crd.antrea.io/v1beta1"),
    "networkpolicies.projectcalico.org": ("NetworkPolicy", "projectcalico.org/v3"),
}
SCHEMAS = {
    "ciliumnetworkpolicies": CILIUM_NETWORK_POLICY,
    "networkpolicies.crd.antrea.io": ANTREA_NETWORK_POLICY,
    "networkpolicies.projectcalico.org": CALICO_NETWORK_POLICY,
}
