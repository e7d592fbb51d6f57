"""The backend's fast decoder (kubernetes_decode) returns exactly the models the `kubernetes` client's
own deserializer returns, without a `Configuration()` per model (what made decoding a pod cost ~2 ms)."""

from __future__ import annotations

import json

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes import decode as kubernetes_decode
from sandbox_service.backends.kubernetes.decode import FastApiClient, decode
from sandbox_service.backends.kubernetes.testing.fake import running_status

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "sb-1-a",
        "namespace": "orchard",
        "uid": "u-1",
        "resourceVersion": "7",
        "creationTimestamp": "2026-12-03T14:00:00Z",
        "deletionTimestamp": "2026-12-03T14:05:00.123456Z",
        "labels": {"orchard.dev/sandbox-id": "sb-1"},
        "annotations": {"orchard.dev/spec": "{}"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "o", "uid": "u-0"}],
    },
    "spec": {
        "containers": [
            {
                "name": "sandbox",
                "image": "python:3.12",
                "command": ["/agent"],
                "ports": [{"name": "agent", "containerPort": 7000}],
                "resources": {"limits": {"cpu": "1", "memory": "2Gi"}},
                "volumeMounts": [{"name": "agent", "mountPath": "/opt/agent"}],
            }
        ],
        "volumes": [{"name": "secret", "secret": {"secretName": "sb-1-a-agent"}}],
        "activeDeadlineSeconds": 600,
    },
}
POD["status"] = running_status(POD, "10.0.0.7") | {"startTime": "2026-12-03T14:00:02Z"}


class _Response:
    def __init__(self, data: dict):
        self.data = json.dumps(data)


def test_decode_returns_the_models_the_client_returns():
    for data, type_name in [
        (POD, "V1Pod"),
        ({"metadata": {"resourceVersion": "9"}, "items": [POD, POD]}, "V1PodList"),
        ({"metadata": {"name": "s"}, "data": {"k": "dg=="}, "immutable": True}, "V1Secret"),
    ]:
        ours, theirs = decode(data, type_name), k8s.ApiClient().deserialize(_Response(data), type_name)
        assert type(ours) is type(theirs)
        assert ours == theirs  # the models compare by to_dict(): every field, nested, equal
    pod = decode(POD, "V1Pod")
    assert pod.metadata.creation_timestamp.utcoffset().total_seconds() == 0  # timezone-aware, as dateutil's
    assert pod.metadata.deletion_timestamp.microsecond == 123456
    assert pod.status.container_statuses[0].state.running is not None and pod.spec.active_deadline_seconds == 600


def test_decode_makes_no_configuration_per_model(monkeypatch):
    made = []
    original = k8s.Configuration.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(k8s.Configuration, "__init__", counting)
    decode({"items": [POD] * 20, "metadata": {}}, "V1PodList")
    assert made == []  # the client's deserializer makes one per model: ~600 here
    k8s.ApiClient().deserialize(_Response(POD), "V1Pod")
    assert len(made) > 10  # (the check above can fail: the client's way does make them)
    assert kubernetes_decode._SHARED.client_side_validation  # models validate as they would with their own


def test_the_fast_client_decodes_responses_with_decode(monkeypatch):
    calls = []
    monkeypatch.setattr(kubernetes_decode, "decode", lambda data, type_name: calls.append(type_name) or data)
    assert FastApiClient().deserialize(_Response(POD), "V1Pod") == POD
    assert calls == ["V1Pod"]
