"""Phase 1: `kubectl apply -k manifests/overlays/dev` on the real cluster; everything it creates comes up.

Real-cluster behaviour checked here that no schema or fake can show: claims bind through the default
StorageClass (`storageClassName: ""` would leave them Pending), pods schedule on a CPU-only node, the
sandbox service answers /healthz through its Service.
"""

from __future__ import annotations

import httpx
import pytest

from tests.cluster.conftest import REPO, kubectl, kubectl_json, service_url, wait_until

pytestmark = pytest.mark.cluster


def test_the_dev_overlay_deploys_and_every_claim_binds():
    kubectl("apply", "-k", str(REPO / "manifests/overlays/dev"), "--server-side", "--force-conflicts")
    for deploy in ("orchard-sandbox-service", "orchard-mlflow"):
        kubectl("-n", "orchard", "rollout", "status", f"deploy/{deploy}", "--timeout", "300s", timeout=320)
    # A claim binds once a pod uses it (WaitForFirstConsumer, as on kind, GKE and EKS); one with
    # `storageClassName: ""` never does: no class, no provisioning.
    claims = wait_until(
        "every PVC of namespace orchard Bound or waiting for its first pod",
        lambda: (
            items
            if (items := kubectl_json("-n", "orchard", "get", "pvc")["items"]) and all(_provisionable(c) for c in items)
            else None
        ),
        timeout=120,
    )
    assert {c["metadata"]["name"] for c in claims} >= {"orchard-mlflow", "orchard-data-store"}
    assert all(c["spec"].get("storageClassName") for c in claims), claims


def _provisionable(claim: dict) -> bool:
    if claim["status"].get("phase") == "Bound":
        return True
    events = kubectl_json(
        "-n", "orchard", "get", "events", "--field-selector", f"involvedObject.name={claim['metadata']['name']}"
    )["items"]
    return any(e["reason"] == "WaitForFirstConsumer" for e in events)


def test_the_sandbox_service_and_mlflow_answer_through_their_services():
    health = httpx.get(service_url("orchard", "orchard-sandbox-service") + "/healthz", timeout=10)
    assert health.status_code == 200, health.text
    mlflow = httpx.get(service_url("orchard", "orchard-mlflow") + "/health", timeout=10)
    assert mlflow.status_code == 200, mlflow.text
