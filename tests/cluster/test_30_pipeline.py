"""Phase 3: the compiled Argo WorkflowTemplate runs the whole pipeline (preset tiny) on the cluster, its
MLflow holds the run, and a run started from the CronWorkflow trains on the data store the first run grew.

What a real cluster decides here: the run volume binds and is writable by the stage user, every stage
pod schedules on a CPU-only node, Argo's executor passes outputs between steps under the pipeline's
ServiceAccount, stages reach the sandbox service and MLflow by their Service names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines.cli import compile_all
from tests.cluster.conftest import (
    child_runs,
    kubectl,
    mlflow_client,
    parameters,
    parent_run,
    stage_of,
    submit,
    wait_workflow,
)

pytestmark = pytest.mark.cluster
STORE = "/orchard-store/data-store"
EXPERIMENT = "orchard-cluster-test"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_all(tmp_path_factory.mktemp("pipelines"), preset="tiny")


@pytest.fixture(scope="module")
def first_run(compiled):
    kubectl("-n", "orchard", "apply", "--server-side", "--force-conflicts", "-f", str(compiled["argo_template"]))
    name = submit(
        {
            "workflowTemplateRef": {"name": "orchard-training"},
            "arguments": parameters(preset="tiny", data_store=STORE, experiment=EXPERIMENT),
        },
        "orchard-training-",
    )
    return wait_workflow(name, timeout=3600)


def test_the_pipeline_runs_on_the_cluster_and_mlflow_holds_the_run(first_run, tmp_path):
    client = mlflow_client()
    parent = parent_run(client, first_run, EXPERIMENT)
    assert parent.info.status == "FINISHED", parent.info
    children = child_runs(client, parent)
    stages = {stage_of(c) for c in children}
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
    promote = next(c for c in children if stage_of(c) == "promote")
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
    first_shards = set(parent_run(client, first_run, EXPERIMENT).data.tags["orchard.trained_shards"].split(","))
    second_shards = set(parent_run(client, second, EXPERIMENT).data.tags["orchard.trained_shards"].split(","))
    assert first_shards and first_shards < second_shards, (first_shards, second_shards)
