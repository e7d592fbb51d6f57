"""The manifests against what a real cluster does with them.

Rendered with the real kustomize (`kubectl kustomize`); each test names the cluster behaviour it guards
against. What only a running cluster shows (NetworkPolicy enforcement, PVC binding, admission of the
PriorityClass) is `make test-cluster`'s.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from pipelines.cli import compile_all
from pipelines.cluster import PIPELINE_POD_LABELS, ClusterConfig, overlay_images
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.objects import object_labels
from tests.manifests.test_manifests import MANIFESTS, by_kind, render

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
KFP_NAMESPACE = "kubeflow"


def _env(docs: list[dict], name: str) -> str:
    (service,) = by_kind(docs, "Deployment", "orchard-sandbox-service")
    return {e["name"]: e.get("value") for e in service["spec"]["template"]["spec"]["containers"][0]["env"]}[name]


# --- C4, C5: what KFP's pods need in KFP's namespace ------------------------------------------------
def test_the_kfp_overlay_gives_kfp_pods_their_identity_rights_and_data_store():
    docs = render("overlays/kfp")
    cluster = ClusterConfig()
    assert {d["metadata"].get("namespace") for d in docs} == {KFP_NAMESPACE}
    (claim,) = by_kind(docs, "PersistentVolumeClaim", cluster.data_store_claim)  # C5: mounted by provision/accumulate
    assert by_kind(docs, "ServiceAccount", cluster.service_account)
    (binding,) = by_kind(docs, "RoleBinding", cluster.service_account)
    assert binding["subjects"][0]["name"] == cluster.service_account
    (role,) = by_kind(docs, "Role", binding["roleRef"]["name"])
    verbs = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # C4: kfp-launcher ConfigMap and the artifact store Secret, read by KFP's driver and launcher as the run's SA
    assert {("configmaps", "get"), ("secrets", "get")} <= verbs
    assert {("persistentvolumeclaims", "create"), ("persistentvolumeclaims", "delete")} <= verbs  # the run store
    assert claim["spec"]["accessModes"] == [cluster.data_store_access_mode]


# --- C6: priority --------------------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_no_system_priority_class_outside_kube_system(overlay):
    docs = render(overlay)
    classes = {d["metadata"]["name"]: d for d in by_kind(docs, "PriorityClass")}
    for doc in docs:
        template = doc.get("spec", {}).get("template", {}) if doc["kind"] == "Deployment" else {}
        name = template.get("spec", {}).get("priorityClassName")
        if name:
            assert not name.startswith("system-"), f"{overlay}: {name} is refused outside kube-system without a quota"
            assert name in classes, f"{overlay}: PriorityClass {name} is not shipped"
            assert 0 < classes[name]["value"] < 1_000_000_000, "user classes stay below the system ones"
    if overlay == "overlays/prod":
        assert classes, "prod gives the sandbox service a priority of its own"


# --- C7: the RWX data store ----------------------------------------------------------------------------
def test_the_prod_data_store_names_an_rwx_class_documented_per_platform():
    (claim,) = by_kind(render("overlays/prod"), "PersistentVolumeClaim", ClusterConfig().data_store_claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"].get("storageClassName"), "the default classes of GKE/EKS/AKS cannot do RWX: Pending"
    notes = (MANIFESTS / "overlays" / "prod" / "patch-data-store.yaml").read_text()
    assert all(platform in notes for platform in ("GKE", "EKS", "AKS"))


# --- Images: `kustomize edit set image` and one registry -------------------------------------------------
def test_setting_the_injector_image_in_an_overlay_rewrites_the_services_env(tmp_path):
    """What `kustomize edit set image orchard/agent-injector=...` writes: an `images:` entry; the service's
    ORCHARD_K8S_INJECTOR_IMAGE must follow, or every sandbox pod fails with IMAGE_PULL_FAILED."""
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    kustomization = copy / "overlays" / "dev" / "kustomization.yaml"
    data = yaml.safe_load(kustomization.read_text())
    data.setdefault("images", []).append(
        {"name": "orchard/agent-injector", "newName": "registry.example/team/agent-injector", "newTag": "7"}
    )
    kustomization.write_text(yaml.safe_dump(data))
    out = subprocess.run(
        ["kubectl", "kustomize", str(copy / "overlays" / "dev")], capture_output=True, text=True, timeout=60, check=True
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert _env(docs, "ORCHARD_K8S_INJECTOR_IMAGE") == "registry.example/team/agent-injector:7"
    assert _env(docs, "ORCHARD_K8S_NAMESPACE") == ClusterConfig().sandbox_namespace  # other values untouched


def test_prod_and_its_compiled_pipelines_pull_from_one_registry(tmp_path):
    overlay = MANIFESTS / "overlays" / "prod"
    registry, tag = overlay_images(overlay)
    docs = render("overlays/prod")
    images = {
        c["image"] for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
    }
    images.add(_env(docs, "ORCHARD_K8S_INJECTOR_IMAGE"))
    assert {i.rsplit("/", 1)[0] for i in images} == {registry}
    from pipelines.cli import main

    assert main(["compile", "--out", str(tmp_path), "--overlay", str(overlay)]) == 0
    template = yaml.safe_load((tmp_path / "orchard-training.workflowtemplate.yaml").read_text())
    args = {p["name"]: p["value"] for p in template["spec"]["arguments"]["parameters"]}
    assert args["image"] == f"{registry}/stage-runtime:{tag}" and args["gpu_image"].startswith(registry + "/")


# --- The sandbox service's snapshots ---------------------------------------------------------------
@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_snapshots_live_on_a_persistent_volume(overlay):
    """Adoption keeps sandboxes across service restarts; their snapshots must outlive the pod too."""
    docs = render(overlay)
    (service,) = by_kind(docs, "Deployment", "orchard-sandbox-service")
    spec = service["spec"]["template"]["spec"]
    state_dir = _env(docs, "ORCHARD_STATE_DIR")
    assert KubernetesBackendConfig().snapshot_dir.is_relative_to(state_dir)
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == state_dir]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert by_kind(docs, "PersistentVolumeClaim", claim)
    assert service["spec"]["strategy"]["type"] == "Recreate"  # one RWO writer at a time


# --- NetworkPolicy of namespace orchard ----------------------------------------------------------------
def _admitted(policy: dict) -> list[dict]:
    return [peer for rule in policy["spec"].get("ingress", []) for peer in rule.get("from", [])]


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_mlflow_and_the_sandbox_api_admit_pipeline_pods_only_never_sandboxes(overlay):
    docs, cluster = render(overlay), ClusterConfig()
    policies = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["namespace"] == cluster.namespace]
    for app, port in (("orchard-mlflow", cluster.mlflow_port), ("orchard-sandbox-service", cluster.sandbox_port)):
        (deployment,) = by_kind(docs, "Deployment", app)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        guarding = [
            p
            for p in policies
            if "Ingress" in p["spec"]["policyTypes"]
            and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert guarding, f"{overlay}: nothing restricts who connects to {app}"
        for policy in guarding:
            assert [r["ports"] for r in policy["spec"]["ingress"]] == [[{"protocol": "TCP", "port": port}]]
            for peer in _admitted(policy):
                assert peer["podSelector"] == {"matchLabels": PIPELINE_POD_LABELS}, peer
                assert peer["namespaceSelector"]["matchExpressions"] == [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [cluster.sandbox_namespace]}
                ]
    # sandbox pods never carry the pipeline label (the service sets their labels, not the workload)
    assert not PIPELINE_POD_LABELS.items() <= object_labels("sb-1", KubernetesBackendConfig(), {}).items()


def test_every_pipeline_pod_carries_the_label_the_policies_admit(tmp_path):
    paths = compile_all(tmp_path, sets=["sft.launch.nproc_per_node=2"])
    template = yaml.safe_load(paths["argo_template"].read_text())
    assert PIPELINE_POD_LABELS.items() <= template["spec"]["podMetadata"]["labels"].items()  # every Argo pod
    job_manifest = [t for t in template["spec"]["templates"] if t["name"] == "sft"][0]["resource"]["manifest"]
    assert "orchard.dev/pipeline-pod: 'true'" in job_manifest  # the PyTorchJob's replicas
    spec, platform = [d for d in yaml.safe_load_all(paths["kfp"].read_text()) if d]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    pods = set(spec["deploymentSpec"]["executors"]) - {"exec-deletepvc"}  # DeletePVC runs in KFP's driver
    for name in pods:
        assert (
            PIPELINE_POD_LABELS.items() <= executors.get(name, {}).get("podMetadata", {}).get("labels", {}).items()
        ), name


def test_the_policies_use_the_names_of_cluster_config():
    text = (MANIFESTS / "base" / "service-network.yaml").read_text()
    cluster = ClusterConfig()
    for key, value in PIPELINE_POD_LABELS.items():
        assert f'{key}: "{value}"' in text
    assert f'values: ["{cluster.sandbox_namespace}"]' in text
