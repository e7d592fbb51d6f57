"""Phase 3: the compiled Argo WorkflowTemplate runs the whole pipeline (preset tiny) on the cluster, its
MLflow holds the run, and a run started from the CronWorkflow trains on the data store the first run grew.

What a real cluster decides here: the run volume binds and is writable by the stage user, every stage
pod schedules on a CPU-only node, Argo's executor passes outputs between steps under the pipeline's
ServiceAccount, stages reach the sandbox service and MLflow by their Service names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from pipelines.cli import compile_all
from tests.cluster.conftest import kubectl, kubectl_json, service_url, wait_until

pytestmark = pytest.mark.cluster
STORE = "/orchard-store/data-store"
EXPERIMENT = "orchard-cluster-test"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_all(tmp_path_factory.mktemp("pipelines"), preset="tiny")


def submit(spec: dict, name_prefix: str) -> str:
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": {"generateName": name_prefix, "namespace": "orchard"}, "spec": spec}
    out = kubectl("create", "-f", "-", "-o", "name", input=json.dumps(workflow))
    return out.strip().split("/", 1)[1]


def wait_workflow(name: str, timeout: float) -> dict:
    start = time.monotonic()

    def finished():
        wf = kubectl_json("-n", "orchard", "get", "workflow", name)
        return wf if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error") else None

    wf = wait_until(f"workflow {name} finished", finished, timeout=timeout, interval=5)
    nodes = wf["status"].get("nodes", {}).values()
    steps = sorted((n["startedAt"], n["displayName"], n["phase"]) for n in nodes if n.get("type") == "Pod")
    print(f"\n[figure] workflow {name}: {wf['status']['phase']} in {time.monotonic() - start:.0f} s; "
          + ", ".join(f"{s[1]} {s[2]}" for s in steps))
    failed = [n for n in nodes if n.get("phase") in ("Failed", "Error")]
    assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), [
        (n["displayName"], n.get("message")) for n in failed])
    return wf


def parameters(**values) -> dict:
    return {"parameters": [{"name": k, "value": str(v)} for k, v in values.items()]}


@pytest.fixture(scope="module")
def first_run(compiled):
    kubectl("-n", "orchard", "apply", "--server-side", "--force-conflicts", "-f", str(compiled["argo_template"]))
    name = submit({"workflowTemplateRef": {"name": "orchard-training"},
                   "arguments": parameters(preset="tiny", data_store=STORE, experiment=EXPERIMENT)},
                  "orchard-training-")
    return wait_workflow(name, timeout=3600)


def mlflow_client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=service_url("orchard", "orchard-mlflow"))


def parent_run(client, workflow: dict):
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"no MLflow experiment {EXPERIMENT}"
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    wf_params = {p["name"]: p.get("value") for p in workflow["status"].get("outputs", {}).get("parameters", [])}
    parent_id = wf_params.get("parent_run_id")
    if parent_id is None:  # global outputs live on the workflow's status
        parent_id = next(p.get("value") for n in workflow["status"]["nodes"].values()
                         for p in n.get("outputs", {}).get("parameters", []) if p["name"] == "parent_run_id")
    assert any(r.info.run_id == parent_id for r in runs), "the workflow's parent run is not in MLflow"
    return client.get_run(parent_id)


def test_the_pipeline_runs_on_the_cluster_and_mlflow_holds_the_run(first_run, tmp_path):
    client = mlflow_client()
    parent = parent_run(client, first_run)
    assert parent.info.status == "FINISHED", parent.info
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    stages = {c.data.tags.get("orchard.stage") or c.info.run_name for c in children}
    pods = {n["templateName"] for n in first_run["status"]["nodes"].values() if n.get("type") == "Pod"}
    print(f"\n[check] parent run {parent.info.run_id}: {len(children)} child runs: {sorted(stages)}")
    assert len(children) >= 6, stages
    assert all(c.info.status == "FINISHED" for c in children), [(c.info.run_name, c.info.status) for c in children]
    # The gate's decision is on the parent run and the registry agrees with it (preset tiny evaluates
    # fewer tasks than the gate's min_tasks, so it normally keeps the champion and registers nothing).
    decision = parent.data.tags.get("orchard.promotion")
    assert decision in ("promoted", "rejected"), (decision, sorted(pods))
    versions = client.search_model_versions("name = 'orchard-policy'")
    assert len(versions) == (decision == "promoted"), (decision, [v.version for v in versions])
    # The decision travelled through MLflow's artifact store (the gate pod uploads, we download).
    promote = next(c for c in children if (c.data.tags.get("orchard.stage") or c.info.run_name) == "promote")
    logged = client.download_artifacts(promote.info.run_id, "promotion/decision.json", dst_path=str(tmp_path))
    assert json.loads(Path(logged).read_text())["promoted"] == (decision == "promoted")


def test_a_run_from_the_cron_workflow_trains_on_the_store_the_first_run_grew(compiled, first_run):
    cron = yaml.safe_load(compiled["argo_cron"].read_text())
    kubectl("-n", "orchard", "apply", "--server-side", "--force-conflicts", "-f", str(compiled["argo_cron"]))
    spec = cron["spec"]["workflowSpec"]
    args = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert args["data_store"] == STORE
    # As `argo submit --from cronwf/orchard-retrain -p preset=tiny` does: the cron's spec, one parameter more.
    args.update(preset="tiny", experiment=EXPERIMENT)
    spec["arguments"] = parameters(**args)
    second = wait_workflow(submit(spec, "orchard-retrain-"), timeout=3600)
    client = mlflow_client()
    first_shards = set(parent_run(client, first_run).data.tags["orchard.trained_shards"].split(","))
    second_shards = set(parent_run(client, second).data.tags["orchard.trained_shards"].split(","))
    assert first_shards and first_shards < second_shards, (first_shards, second_shards)
