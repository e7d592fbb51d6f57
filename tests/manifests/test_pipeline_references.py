"""The compiled pipelines run against our own manifests: every name they reference exists there.

Renders `kubectl kustomize manifests/overlays/{dev,prod}` and compiles the KFP and Argo YAML, then
checks each Secret (and key), Service (and port), ServiceAccount, PVC (the data store's) and image the pipelines
reference: created by the overlay, or by a `kubectl create secret` command of the cluster quickstart
(docs/pipelines/cluster-quickstart.md). Names come from `pipelines/cluster.py`; this test is what keeps the manifests
equal to it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from pipelines.cli import compile_all
from pipelines.cluster import ClusterConfig, overlay_images
from tests.manifests.test_manifests import by_kind, pod_templates, render

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    paths = compile_all(tmp_path_factory.mktemp("compiled"))
    return {kind: [d for d in yaml.safe_load_all(p.read_text()) if d] for kind, p in paths.items()}


def readme_secrets() -> set[tuple[str, str]]:
    """(namespace, Secret) pairs the cluster quickstart creates with `kubectl create secret generic`."""
    text = (REPO / "docs" / "pipelines" / "cluster-quickstart.md").read_text()
    return {(m.group(1), m.group(2)) for m in re.finditer(r"kubectl -n (\S+) create secret generic (\S+)", text)}


def references(compiled: dict[str, list[dict]]) -> dict[str, set]:
    """Secret names (with keys), service URLs, service accounts and images of the compiled YAML."""
    refs: dict[str, set] = {"secrets": set(), "urls": set(), "service_accounts": set(), "images": set(), "pvcs": set()}
    kfp_spec, kfp_platform = compiled["kfp"]
    defaults = {n: p.get("defaultValue") for n, p in kfp_spec["root"]["inputDefinitions"]["parameters"].items()}
    for executor in kfp_platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
        for secret in executor.get("secretAsEnv", []):
            param = secret["secretNameParameter"]["componentInputParameter"].removeprefix("pipelinechannel--")
            for key in secret["keyToEnv"]:
                refs["secrets"].add((defaults[param], key["secretKey"], bool(secret.get("optional"))))
        for mount in executor.get("pvcMount", []):  # existing claims; a run's own (CreatePVC) is a task output
            param = mount["pvcNameParameter"].get("componentInputParameter")
            if param:
                refs["pvcs"].add(defaults[param.removeprefix("pipelinechannel--")])
    refs["urls"] |= {defaults["sandbox_url"], defaults["mlflow_uri"]}
    refs["images"] |= {defaults["image"], defaults["gpu_image"]}
    refs["service_accounts"].add(ClusterConfig().service_account)  # KFP: a run setting (orchard schedule)

    (template,) = compiled["argo_template"]
    args = {p["name"]: p["value"] for p in template["spec"]["arguments"]["parameters"]}

    def resolve(value: str) -> str:
        return re.sub(r"\{\{workflow\.parameters\.(\w+)\}\}", lambda m: args[m.group(1)], value)

    for t in template["spec"]["templates"]:
        for env in t.get("container", {}).get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs["secrets"].add((resolve(ref["name"]), ref["key"], bool(ref.get("optional"))))
    refs["urls"] |= {args["sandbox_url"], args["mlflow_uri"]}
    refs["images"] |= {args["image"], args["gpu_image"]}
    refs["pvcs"] |= {
        resolve(v["persistentVolumeClaim"]["claimName"])
        for v in template["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    refs["service_accounts"].add(template["spec"]["serviceAccountName"])
    (cron,) = compiled["argo_cron"]
    refs["service_accounts"].add(cron["spec"]["workflowSpec"]["serviceAccountName"])
    return refs


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_every_name_the_pipelines_reference_exists_in_the_overlay(compiled, overlay):
    docs = render(overlay)
    refs = references(compiled)
    # the pipelines' namespace: every Namespace the overlay makes but the sandboxes' own
    (namespace,) = {d["metadata"]["name"] for d in by_kind(docs, "Namespace")} - {ClusterConfig().sandbox_namespace}
    created = {d["metadata"]["name"]: d for d in by_kind(docs, "Secret")}
    documented = {name for ns, name in readme_secrets() if ns == namespace}
    for name, key, optional in sorted(refs["secrets"]):
        if name in created:
            assert key in created[name].get("data", {}) | created[name].get("stringData", {}), (overlay, name, key)
        else:
            assert name in documented, (
                f"{overlay}: Secret {name} (key {key}) is referenced by the pipelines but "
                "neither the overlay nor a cluster-quickstart `kubectl -n NS create secret generic` "
                "command creates it"
            )
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    for url in sorted(refs["urls"]):
        host = urlparse(url)
        service, ns = host.hostname.split(".")[:2]
        assert ns == namespace, f"{url} points at namespace {ns}, the overlay deploys to {namespace}"
        assert service in services, f"{url}: no Service {service} in {overlay}"
        assert host.port in {p["port"] for p in services[service]["spec"]["ports"]}, url
    accounts = {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
    assert refs["service_accounts"] <= accounts, refs["service_accounts"] - accounts
    # existing PVCs the pipelines mount (the persistent data store) live in the pipelines' namespace
    claims = {
        d["metadata"]["name"]: d
        for d in by_kind(docs, "PersistentVolumeClaim")
        if d["metadata"].get("namespace") == namespace
    }
    for name in sorted(refs["pvcs"]):
        assert name in claims, f"{overlay}: PVC {name} is mounted by the pipelines but the overlay does not create it"
    # the pipeline identity may create and delete the run volume (KFP CreatePVC/DeletePVC runs as it)
    sa = ClusterConfig().service_account
    roles = {b["roleRef"]["name"] for b in by_kind(docs, "RoleBinding") if any(s["name"] == sa for s in b["subjects"])}
    verbs = {
        v
        for r in by_kind(docs, "Role")
        if r["metadata"]["name"] in roles
        for rule in r["rules"]
        if "persistentvolumeclaims" in rule["resources"]
        for v in rule["verbs"]
    }
    assert {"create", "delete"} <= verbs


def test_the_data_store_claim_is_shared_by_every_run(compiled):
    """Both runners mount ClusterConfig's store claim; it is ReadWriteMany in prod (any node), ReadWriteOnce in
    dev (kind's local-path provisioner), in the cluster config's storage class, and not a per-run claim."""
    cluster = ClusterConfig()
    assert references(compiled)["pvcs"] == {cluster.data_store_claim}
    for overlay, mode in (("overlays/prod", cluster.data_store_access_mode), ("overlays/dev", "ReadWriteOnce")):
        (claim,) = by_kind(render(overlay), "PersistentVolumeClaim", cluster.data_store_claim)
        assert claim["spec"]["accessModes"] == [mode], overlay
        # dev: the default class (local-path, RWO); prod: an RWX class named in its overlay, never ""
        assert claim["spec"].get("storageClassName") == (None if overlay == "overlays/dev" else "standard-rwx")
    assert cluster.data_store_access_mode == "ReadWriteMany"


def test_images_follow_one_scheme_in_overlays_and_pipelines(compiled):
    cluster = ClusterConfig()
    refs = references(compiled)
    assert refs["images"] == {cluster.image("stage-runtime"), cluster.image("stage-runtime-gpu")}
    dev = render("overlays/dev")
    images = {c["image"] for d in dev for t in pod_templates(d) for c in t["spec"]["containers"]}
    (service,) = by_kind(dev, "Deployment", "orchard-sandbox-service")
    env = {e["name"]: e.get("value") for e in service["spec"]["template"]["spec"]["containers"][0]["env"]}
    images.add(env["ORCHARD_K8S_INJECTOR_IMAGE"])
    assert images == {cluster.image(n) for n in ("sandbox-service", "mlflow", "agent-injector")}, images
    prod = render("overlays/prod")
    prod_images = {c["image"] for d in prod for t in pod_templates(d) for c in t["spec"]["containers"]}
    (service,) = by_kind(prod, "Deployment", "orchard-sandbox-service")
    prod_images |= {
        e["value"]
        for e in service["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "ORCHARD_K8S_INJECTOR_IMAGE"
    }
    registry, tag = overlay_images(REPO / "manifests" / "overlays" / "prod")
    assert prod_images == {
        ClusterConfig(image_registry=registry, image_tag=tag).image(n)
        for n in ("sandbox-service", "mlflow", "agent-injector")
    }


def test_a_renamed_data_store_claim_is_caught(compiled):
    broken = {k: [yaml.safe_load(yaml.safe_dump(d)) for d in v] for k, v in compiled.items()}
    (template,) = broken["argo_template"]
    for arg in template["spec"]["arguments"]["parameters"]:
        if arg["name"] == "data_store_claim":
            arg["value"] = "orchard-store-typo"
    with pytest.raises(AssertionError, match="orchard-store-typo"):
        test_every_name_the_pipelines_reference_exists_in_the_overlay(broken, "overlays/dev")


def test_a_renamed_secret_is_caught(compiled):
    """The cross-check fails when the pipelines reference a Secret nobody creates."""
    docs = render("overlays/prod")
    broken = {k: [yaml.safe_load(yaml.safe_dump(d)) for d in v] for k, v in compiled.items()}
    params = broken["kfp"][0]["root"]["inputDefinitions"]["parameters"]
    params["sandbox_token_secret"]["defaultValue"] = "orchard-sandbox"
    with pytest.raises(AssertionError, match="orchard-sandbox"):
        test_every_name_the_pipelines_reference_exists_in_the_overlay(broken, "overlays/prod")
    assert docs
