"""What the compiled pipelines ask a real cluster for.

Each test states the cluster behaviour it guards against: a claim with `storageClassName: ""` is never
provisioned; a pod requesting a GPU never schedules on a CPU cluster; a root-owned fresh volume is not
writable by uid 10001 without fsGroup; two nodes cannot attach one ReadWriteOnce volume at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipelines import stages
from pipelines.cli import compile_all
from pipelines.cluster import ClusterConfig
from pipelines.config import PipelineConfig
from pipelines.jobs.pytorchjob import job_command, pytorchjob_manifest, secret_env
from pipelines.kfp.run_store import claim_manifest, create_run_store


def _compiled(
    tmp_path: Path, preset: str = "demo", sets: list[str] | None = None, cluster: ClusterConfig | None = None
) -> dict:
    paths = compile_all(tmp_path, preset, sets=sets, cluster=cluster)
    kfp_spec, kfp_platform = [d for d in yaml.safe_load_all(paths["kfp"].read_text()) if d]
    return {
        "kfp": kfp_spec,
        "kfp_k8s": kfp_platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"],
        "argo": yaml.safe_load(paths["argo_template"].read_text()),
    }


def _argo_templates(doc: dict) -> dict:
    return {t["name"]: t for t in doc["argo"]["spec"]["templates"]}


def _kfp_tasks(doc: dict) -> dict:
    return doc["kfp"]["components"]["comp-exit-handler-1"]["dag"]["tasks"]


# --- C1: storage class ----------------------------------------------------------------------------
def test_no_storage_class_means_the_cluster_default_never_an_empty_class(tmp_path):
    doc = _compiled(tmp_path)
    (claim,) = doc["argo"]["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in claim["spec"], "'' would mean no class: the claim would stay Pending"
    # KFP: the run store comes from our step (kfp-kubernetes' CreatePVC always writes a class)
    assert "createpvc" not in _kfp_tasks(doc)
    params = _kfp_tasks(doc)["run-store"]["inputs"]["parameters"]
    assert params["storage_class"]["runtimeValue"]["constant"] == ""
    assert (
        "storageClassName"
        not in claim_manifest("r-run-store", size="1Gi", access_mode="ReadWriteOnce", storage_class=None)["spec"]
    )
    assert (
        "storageClassName"
        not in claim_manifest("r-run-store", size="1Gi", access_mode="ReadWriteOnce", storage_class="")["spec"]
    )


def test_an_explicit_storage_class_is_kept(tmp_path):
    doc = _compiled(tmp_path, cluster=ClusterConfig(storage_class="premium-rwo"))
    (claim,) = doc["argo"]["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "premium-rwo"
    assert (
        _kfp_tasks(doc)["run-store"]["inputs"]["parameters"]["storage_class"]["runtimeValue"]["constant"]
        == "premium-rwo"
    )
    assert (
        claim_manifest("x", size="1Gi", access_mode="ReadWriteMany", storage_class="premium-rwo")["spec"][
            "storageClassName"
        ]
        == "premium-rwo"
    )


def test_the_run_store_step_creates_the_claim_once():
    from kubernetes.client.exceptions import ApiException

    class Api:
        def __init__(self):
            self.created: list = []

        def create_namespaced_persistent_volume_claim(self, namespace, body, _request_timeout=None):
            if any(b["metadata"]["name"] == body["metadata"]["name"] for _, b in self.created):
                raise ApiException(status=409, reason="AlreadyExists")  # a retried step
            self.created.append((namespace, body))

    api = Api()
    for _ in range(2):
        assert (
            create_run_store(
                "run-1", size="5Gi", access_mode="ReadWriteOnce", storage_class=None, api=api, namespace="kubeflow"
            )
            == "run-1-run-store"
        )
    ((namespace, body),) = api.created
    assert namespace == "kubeflow" and "storageClassName" not in body["spec"]


# --- C2 and per-preset requests -------------------------------------------------------------------
def _gpu_anywhere(doc: dict) -> list[str]:
    """Every place a compiled pipeline asks for a GPU, a GPU node or the GPU image."""
    found = []
    for name, t in _argo_templates(doc).items():
        text = yaml.safe_dump(t)
        if "nvidia.com/gpu" in text or "gpu_node_selector" in text or "gpu_image" in text:
            found.append(f"argo:{name}")
    for name, e in doc["kfp"]["deploymentSpec"]["executors"].items():
        if "accelerator" in e["container"].get("resources", {}) or "gpu_image" in e["container"]["image"]:
            found.append(f"kfp:{name}")
    for name, cfg in doc["kfp_k8s"].items():
        if "nodeSelector" in cfg or "tolerations" in cfg:
            found.append(f"kfp-k8s:{name}")
    return found


@pytest.mark.parametrize("preset", ["tiny", "demo"])
def test_the_cpu_presets_ask_for_no_gpu_anywhere(tmp_path, preset):
    assert _gpu_anywhere(_compiled(tmp_path, preset)) == []


def test_a_config_asking_for_a_gpu_gets_it_on_the_gpu_stages_only(tmp_path):
    config = PipelineConfig.preset_config("demo", resources={"gpu": True})
    assert {s.name for s in stages.STAGES if s.wants_gpu(config)} == {"sft", "rl"}
    found = _gpu_anywhere(_compiled(tmp_path, sets=["resources.gpu=true"]))
    assert sorted(found) == [
        "argo:rl",
        "argo:sft",
        "kfp-k8s:exec-rl",
        "kfp-k8s:exec-sft",
        "kfp:exec-rl",
        "kfp:exec-sft",
    ]


def test_a_cpu_pytorchjob_requests_no_gpu():
    config = PipelineConfig.preset_config("tiny", sft={"launch": {"nproc_per_node": 2}})
    stage = stages.BY_NAME["sft"]
    launch = stage.launch(config)
    job = pytorchjob_manifest(
        stage,
        launch,
        gpu=stage.wants_gpu(config),
        requests=stage.requests(config),
        name="j",
        image="i",
        command=job_command("sft", launch, "/d", "r"),
        claim_name="c",
        mount_path="/d",
        secret_env=secret_env("a", "b", "c", "d"),
        node_selector={"orchard.dev/pool": "gpu"},
        tolerations=[],
    )
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"] and "nodeSelector" not in pod
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_tiny_fits_a_small_node_and_every_step_requests_something(tmp_path):
    """tiny runs on a 2-4 core node (kind, CI): no request above 1 CPU, and start/report/close-run request too
    (a pod without requests is BestEffort: first to be evicted, and unaccounted for by the scheduler)."""
    doc = _compiled(tmp_path, "tiny")
    templates = {n: t for n, t in _argo_templates(doc).items() if "container" in t}
    assert {stages.START, stages.REPORT, stages.CLOSE} <= set(templates)
    for name, t in templates.items():
        requests = t["container"].get("resources", {}).get("requests", {})
        assert requests.get("cpu") and requests.get("memory"), name
        assert _cpu(requests["cpu"]) <= 1, (name, requests)
    for name, e in doc["kfp"]["deploymentSpec"]["executors"].items():
        if name in ("exec-deletepvc",):  # KFP's driver runs it, no pod of ours
            continue
        resources = e["container"].get("resources", {})
        assert resources.get("resourceCpuRequest") and resources.get("resourceMemoryRequest"), name
        assert _cpu(resources["resourceCpuRequest"]) <= 1, name
    # the default (non-preset) config keeps the GPU-sized requests
    assert stages.BY_NAME["sft"].requests(PipelineConfig()) == ("4", "16Gi")


# --- C3: writable volumes --------------------------------------------------------------------------
def test_stage_pods_run_with_an_fsgroup_of_their_uid(tmp_path):
    cluster = ClusterConfig()
    doc = _compiled(tmp_path, sets=["sft.launch.nproc_per_node=2"])
    context = doc["argo"]["spec"]["securityContext"]
    assert context["fsGroup"] == context["runAsUser"] == cluster.stage_uid == 10001
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"
    manifest = _argo_templates(doc)["sft"]["resource"]["manifest"]
    job = yaml.safe_load(re.sub(r"'?\{\{[^}]*\}\}'?", "x", manifest))  # placeholders -> plain scalars
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["spec"]["securityContext"]["fsGroup"] == cluster.stage_uid
    assert (
        _kfp_tasks(doc)["sft"]["inputs"]["parameters"]["pod_security_context"]["runtimeValue"]["constant"]["fsGroup"]
        == cluster.stage_uid
    )


def test_start_opens_no_parent_run_when_the_run_dir_is_not_writable(tmp_path):
    """A volume the step cannot write fails `start` before MLflow has a RUNNING parent run."""
    import mlflow

    from pipelines.steps import main

    blocker = tmp_path / "volume"
    blocker.write_text("not a directory")  # mkdir under it fails, as on a root-owned volume (also as root)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = main(
        [
            "start",
            "--run-dir",
            str(blocker / "wf-1"),
            "--outputs-dir",
            str(tmp_path / "out"),
            "--param",
            "preset=tiny",
            "--param",
            "recipe=swe",
            "--param",
            "seed=0",
            "--param",
            "sandbox_url=",
            "--param",
            f"mlflow_uri={uri}",
            "--param",
            "experiment=orchard",
        ]
    )
    assert code == 1
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("orchard")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == []


# --- The run volume and parallel branches ----------------------------------------------------------
def test_a_readwriteonce_run_volume_is_never_mounted_by_two_steps_at_once(tmp_path):
    rwo = _compiled(tmp_path / "rwo")
    dag = _argo_templates(rwo)[rwo["argo"]["spec"]["entrypoint"]]
    assert dag["parallelism"] == 1, "parallel branches on two nodes: Multi-Attach error on PD/EBS"
    rwx = _compiled(tmp_path / "rwx", cluster=ClusterConfig(access_mode="ReadWriteMany"))
    assert "parallelism" not in _argo_templates(rwx)[rwx["argo"]["spec"]["entrypoint"]]
    # KFP: the stages that mount the run store form one chain (each depends on the one before)
    tasks = _kfp_tasks(rwo)
    mounting = [s.name for s in stages.STAGES if s.resumable or s.distributed]

    def upstream(name: str) -> set[str]:
        seen, todo = set(), list(tasks[name].get("dependentTasks", []))
        while todo:
            t = todo.pop()
            if t not in seen:
                seen.add(t)
                todo += tasks[t].get("dependentTasks", [])
        return seen

    for earlier, later in zip(mounting, mounting[1:]):
        assert earlier in upstream(later), (earlier, later)
