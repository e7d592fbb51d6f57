"""The kustomize manifests, rendered and validated offline (there is no cluster here).

Rendering uses the real kustomize: the one built into kubectl (`kubectl kustomize`, kustomize v5),
which runs without a cluster. No maintained Python implementation of kustomize exists (the PyPI
packages named after it wrap the Go binary or do something else), and a hand-written renderer would
test our idea of kustomize rather than kustomize. kubectl ships with this machine's image; where it
is missing these tests skip and say so.

Checked: every rendered object against the Kubernetes OpenAPI schema (kubernetes-validate, strict:
unknown fields fail); the PyTorchJob against a JSON schema written from the Training Operator's
published kubeflow.org/v1 CRD fields (top level, runPolicy, replica specs) with its pod templates
validated as real PodSpecs (`pipelines/jobs/pytorchjob.py`, shared with the pipelines' jobs). Not covered: the CRD's
full generated schema (elasticPolicy details,
schedulingPolicy), admission on a real cluster, and whether the images exist in a registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pipelines.jobs.pytorchjob import validate_pytorchjob
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.objects import INJECTOR_SOURCE, object_labels
from pipelines.cluster import ClusterConfig
from sandbox_service.config import ServiceConfig

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
VERSIONS = ["1.30", kubernetes_validate.latest_version()]
TARGETS = ["base", "overlays/dev", "overlays/prod", "overlays/kfp", "components/pytorchjob", "components/calico-dns"]
# What lives in the sandbox namespace, apart from the sandboxes themselves.
SANDBOX_NAMESPACE_OBJECTS = {
    ("Role", "orchard-sandbox-service"),
    ("RoleBinding", "orchard-sandbox-service"),
    ("NetworkPolicy", "orchard-sandboxes-baseline"),
    ("ServiceAccount", "orchard-sandbox"),
}
# Secrets and volumes the operator creates (documented in the kustomizations), never committed.
EXTERNAL = {"secret": {"orchard-api-token", "orchard-mlflow-store"}, "pvc": {"orchard-training-data"}}

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) is not installed"
)


def render(target: str) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS / target)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": "/dev/null"},
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {target: render(target) for target in TARGETS}


def by_kind(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def pod_templates(doc: dict) -> list[dict]:
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return [doc["spec"]["template"]]
    if doc["kind"] == "PyTorchJob":
        return [r["template"] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    return []


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_validates(rendered, target):
    docs = rendered[target]
    assert docs
    for doc in docs:
        if doc["kind"] == "PyTorchJob":
            validate_pytorchjob(doc)
            continue
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_pytorchjob_schema_can_fail(rendered):
    (job,) = by_kind(rendered["components/pytorchjob"], "PyTorchJob")
    broken = json.loads(json.dumps(job))
    broken["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        validate_pytorchjob(broken)
    broken = json.loads(json.dumps(job))
    worker = broken["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["imagePullPolcy"] = "Always"  # a typo'd field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pytorchjob(broken)


def test_overlays_set_namespaces_and_pinned_images(rendered):
    cluster = ClusterConfig()
    for target, namespace, tag in [("overlays/dev", "orchard", "0.1.0"), ("overlays/prod", "orchard", "0.1.0")]:
        docs = rendered[target]
        assert namespace == cluster.namespace
        assert {d["metadata"]["name"] for d in by_kind(docs, "Namespace")} == {namespace, cluster.sandbox_namespace}
        in_sandbox_ns = {
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if d["metadata"].get("namespace") == cluster.sandbox_namespace
        }
        assert in_sandbox_ns == SANDBOX_NAMESPACE_OBJECTS
        assert all(
            d["metadata"].get("namespace") == namespace
            for d in docs
            if d["kind"] not in ("Namespace", "PriorityClass")  # cluster-scoped
            and (d["kind"], d["metadata"]["name"]) not in in_sandbox_ns
        )
        images = [c["image"] for d in docs for t in pod_templates(d) for c in t["spec"]["containers"]]
        assert images and all(image.endswith(f":{tag}") for image in images), images
        (service,) = by_kind(docs, "Deployment", "orchard-sandbox-service")
        env = {e["name"]: e.get("value") for e in service["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["ORCHARD_K8S_INJECTOR_IMAGE"].endswith(f":{tag}")  # injector released with the service
    prod = rendered["overlays/prod"]
    (mlflow,) = by_kind(prod, "Deployment", "orchard-mlflow")
    assert mlflow["spec"]["replicas"] == 2 and mlflow["spec"]["strategy"]["type"] == "RollingUpdate"
    (pdb,) = by_kind(prod, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= mlflow["spec"]["template"]["metadata"]["labels"].items()
    # prod artifacts live in object storage: its volumes are the data store and the service's snapshots
    assert {d["metadata"]["name"] for d in by_kind(prod, "PersistentVolumeClaim")} == {
        ClusterConfig().data_store_claim,
        "orchard-sandbox-state",
    }
    dev_mlflow = by_kind(rendered["overlays/dev"], "Deployment", "orchard-mlflow")[0]
    dev_env = {e["name"]: e.get("value") for e in dev_mlflow["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert dev_env["MLFLOW_BACKEND_STORE_URI"].startswith("sqlite:")
    prod_env = {e["name"]: e for e in mlflow["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "value" not in prod_env["MLFLOW_BACKEND_STORE_URI"]
    assert prod_env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"] == "orchard-mlflow-store"


def test_no_plaintext_secret_outside_dev(rendered):
    for target in ("base", "overlays/prod", "components/pytorchjob"):
        assert not by_kind(rendered[target], "Secret"), f"{target} must not carry a Secret"
    (token,) = by_kind(rendered["overlays/dev"], "Secret")
    assert token["metadata"]["name"] == "orchard-api-token"  # the plain name the pipelines reference


def test_every_reference_resolves(rendered):
    for target, docs in rendered.items():
        names = {
            kind: {d["metadata"]["name"] for d in docs if d["kind"] == kind}
            for kind in ("Secret", "ConfigMap", "PersistentVolumeClaim", "ServiceAccount")
        }
        for doc in docs:
            for template in pod_templates(doc):
                spec = template["spec"]
                if spec.get("serviceAccountName"):
                    assert spec["serviceAccountName"] in names["ServiceAccount"], (target, spec["serviceAccountName"])
                for volume in spec.get("volumes", []):
                    if "persistentVolumeClaim" in volume:
                        claim = volume["persistentVolumeClaim"]["claimName"]
                        assert claim in names["PersistentVolumeClaim"] | EXTERNAL["pvc"], (target, claim)
                    if "configMap" in volume:
                        assert volume["configMap"]["name"] in names["ConfigMap"], (target, volume)
                for container in spec["containers"]:
                    for env in container.get("env", []):
                        ref = env.get("valueFrom", {}).get("secretKeyRef")
                        if ref and not ref.get("optional"):
                            assert ref["name"] in names["Secret"] | EXTERNAL["secret"], (target, ref)
        for binding in by_kind(docs, "RoleBinding"):
            roles = {d["metadata"]["name"] for d in by_kind(docs, "Role")}
            assert binding["roleRef"]["name"] in roles
            assert all(s["name"] in names["ServiceAccount"] for s in binding["subjects"])


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_the_sandbox_creating_identity_has_rights_in_the_sandbox_namespace_only(rendered, overlay):
    docs, cluster = rendered[overlay], ClusterConfig()
    (role,) = by_kind(docs, "Role", "orchard-sandbox-service")
    (binding,) = by_kind(docs, "RoleBinding", "orchard-sandbox-service")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == cluster.sandbox_namespace
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orchard-sandbox-service", "namespace": cluster.namespace}
    ]
    assert {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("", "pods"),
        ("", "secrets"),
        ("", "events"),
        ("networking.k8s.io", "networkpolicies"),
        ("cilium.io", "ciliumnetworkpolicies"),
        ("crd.antrea.io", "networkpolicies"),  # FQDN host policies
        ("projectcalico.org", "networkpolicies"),
        ("projectcalico.org", "tier.networkpolicies"),
    }
    # in its own namespace (the API token, pipeline credentials) it is bound to nothing
    assert not [
        b
        for b in by_kind(docs, "RoleBinding")
        if b["metadata"]["namespace"] == cluster.namespace
        and any(s["name"] == "orchard-sandbox-service" for s in b["subjects"])
    ]
    (deployment,) = by_kind(docs, "Deployment", "orchard-sandbox-service")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ORCHARD_K8S_NAMESPACE"]["value"] == cluster.sandbox_namespace
    assert env["ORCHARD_K8S_SERVICE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_the_calico_dns_component_grants_reading_the_default_tier_only_to_the_sandbox_service(rendered):
    docs, cluster = rendered["components/calico-dns"], ClusterConfig()
    (role,), (binding,) = by_kind(docs, "ClusterRole"), by_kind(docs, "ClusterRoleBinding")
    assert role["rules"] == [
        {"apiGroups": ["projectcalico.org"], "resources": ["tiers"], "resourceNames": ["default"], "verbs": ["get"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orchard-sandbox-service", "namespace": cluster.namespace}
    ]
    (service_role,) = by_kind(rendered["overlays/prod"], "Role", "orchard-sandbox-service")
    (tiered,) = [r for r in service_role["rules"] if r["resources"] == ["tier.networkpolicies"]]
    assert tiered["resourceNames"] == ["default.*"]  # the tier kubernetes_calico's policies land in


def test_rbac_is_namespaced_and_least_privilege(rendered):
    docs = rendered["overlays/prod"]
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    for role in by_kind(docs, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert not {"pods/exec", "pods/attach", "pods/portforward", "nodes"} & set(rule["resources"])
            if "secrets" in rule["resources"]:
                assert role["metadata"]["name"] == "orchard-sandbox-service"  # only it makes agent secrets
    sandbox_sa = by_kind(docs, "ServiceAccount", "orchard-sandbox")[0]
    assert sandbox_sa["automountServiceAccountToken"] is False
    assert not any(s["name"] == "orchard-sandbox" for b in by_kind(docs, "RoleBinding") for s in b["subjects"])


def test_service_settings_are_real_config_fields_and_agree_with_the_backend(rendered):
    (deployment,) = by_kind(rendered["overlays/prod"], "Deployment", "orchard-sandbox-service")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    # env names of ServiceConfig: ORCHARD_<FIELD>, or a field's own alias (ORCHARD_SANDBOX_TOKEN for token)
    aliases = {
        choice: name
        for name, f in ServiceConfig.model_fields.items()
        if f.validation_alias is not None
        for choice in getattr(f.validation_alias, "choices", [f.validation_alias])
        if isinstance(choice, str)
    }
    service_env = {
        aliases.get(e["name"], e["name"][len("ORCHARD_") :].lower()): e.get("value")
        for e in container["env"]
        if e["name"].startswith("ORCHARD_") and not e["name"].startswith("ORCHARD_K8S_")
    }
    backend_env = {
        e["name"][len("ORCHARD_K8S_") :].lower(): e.get("value")
        for e in container["env"]
        if e["name"].startswith("ORCHARD_K8S_")
    }
    assert set(service_env) <= set(ServiceConfig.model_fields), set(service_env) - set(ServiceConfig.model_fields)
    assert set(backend_env) <= set(KubernetesBackendConfig.model_fields)
    literal = {k: v for k, v in backend_env.items() if v is not None}
    literal["service_selector"] = json.loads(literal["service_selector"])
    backend = KubernetesBackendConfig(**literal)  # the values validate, too
    service = ServiceConfig(**{k: v for k, v in service_env.items() if v is not None})
    assert service.backend == "kubernetes" and container["ports"][0]["containerPort"] == service.port

    # the service pods carry the labels sandbox policies admit; sandbox pods carry the baseline's selector
    assert backend.service_selector.items() <= pod["metadata"]["labels"].items()
    (baseline,) = by_kind(rendered["overlays/prod"], "NetworkPolicy", "orchard-sandboxes-baseline")
    sandbox_labels = object_labels("sb-1", backend, {})
    assert baseline["spec"]["podSelector"]["matchLabels"].items() <= sandbox_labels.items()
    (peer,) = baseline["spec"]["ingress"][0]["from"]
    assert peer["podSelector"]["matchLabels"] == backend.service_selector
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": deployment["metadata"]["namespace"]
    }
    assert baseline["metadata"]["namespace"] == backend.namespace
    assert baseline["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": backend.agent_port}]
    assert baseline["spec"]["egress"] == []
    assert backend.service_account_name in {
        d["metadata"]["name"]
        for d in by_kind(rendered["overlays/prod"], "ServiceAccount")
        if d["metadata"]["namespace"] == backend.namespace
    }


def test_dockerfiles_match_what_the_pod_and_the_deployment_expect():
    injector = (REPO / "docker" / "agent-injector" / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(\S+) (\S+)$", injector, re.M)
    assert ("sandbox_service/agent", f"{INJECTOR_SOURCE}/agent/sandbox_service/agent") in copies
    assert ("sandbox_service/__init__.py", f"{INJECTOR_SOURCE}/agent/sandbox_service/__init__.py") in copies
    assert f"mv /opt/pbs/cpython-* {INJECTOR_SOURCE}/python" in injector
    service = (REPO / "docker" / "sandbox-service" / "Dockerfile").read_text()
    assert 'CMD ["orchard-sandbox", "serve"]' in service
    assert 'orchard-sandbox = "sandbox_service.__main__:main"' in (REPO / "pyproject.toml").read_text()
    runtime = (REPO / "docker" / "stage-runtime" / "Dockerfile").read_text()
    assert "ARG TORCH_SPEC=torch==2.13.0+cpu" in runtime  # never an unpinned torch


def test_the_service_image_installs_every_package_the_service_imports():
    import ast
    import sys

    dockerfile = (REPO / "docker" / "sandbox-service" / "Dockerfile").read_text()
    assert re.search(r"pip install [^\n]*-c /tmp/constraints.txt -r requirements.txt", dockerfile)
    requirements = (REPO / "docker" / "sandbox-service" / "requirements.txt").read_text().splitlines()
    installed = {line.split("#")[0].strip() for line in requirements} - {""}
    dist = {
        "prometheus_client": "prometheus-client",
        "pydantic_settings": "pydantic-settings",
        "yaml": "pyyaml",
        "starlette": "fastapi",
        "urllib3": "kubernetes",
        "kubernetes_validate": None,
    }
    needed = set()
    for path in (REPO / "sandbox_service").rglob("*.py"):
        # developer tools (sandbox_service/tools, the embedded service) and the API server double (tests only)
        if {"tools", "testing"} & set(path.relative_to(REPO).parts) or path.name == "embedded.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "sandbox_service":
                    needed.add(dist.get(top, top))
    needed.discard(None)
    assert needed <= installed, f"add to docker/sandbox-service/requirements.txt: {sorted(needed - installed)}"


def test_training_entry_accepts_its_stage_file_and_refuses_an_invalid_config(tmp_path, capsys):
    import importlib.util

    from components.sft.stage import SFTConfig

    directory = MANIFESTS / "components" / "pytorchjob"
    stage = json.loads((directory / "stage.json").read_text())
    SFTConfig(**stage["config"])  # the template's config is a valid SFTConfig
    spec = importlib.util.spec_from_file_location("train_entry", directory / "train_entry.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    rl = tmp_path / "rl.json"
    rl.write_text(
        json.dumps(
            {"stage": "rl", "config": {"engine": "builtin"}, "tasks_dir": "t", "model_dir": "m", "out_model_dir": "o"}
        )
    )
    assert entry.main(["train_entry.py", str(rl)]) == 2
    assert "the builtin RL engine (our own clipped update) was removed" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stage": "dpo"}))
    assert entry.main(["train_entry.py", str(bad)]) == 2
