"""Two scheduled-retraining runs against one data store: the second trains on both runs' shards."""

from __future__ import annotations

import json

import mlflow
import pytest

from components.core.data.retrain_store import DataStore
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from pipelines.layout import RunLayout
from pipelines.local import run_local


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_local_runs_grow_one_data_store(tmp_path, external_service, micro_config):
    store = tmp_path / "store"
    config = micro_config.updated(sandbox_url=external_service.url, retrain={"data_store": str(store)})
    first = run_local(config, tmp_path / "runs")
    second = run_local(config, tmp_path / "runs")
    one, two = RunLayout(first.run_dir), RunLayout(second.run_dir)

    manifest = DataStore(store).read()
    run1, run2 = manifest.run(first.parent_run_id), manifest.run(second.parent_run_id)
    assert run1 is not None and run2 is not None, "each run is recorded under its pipeline run id"
    # new task seeds each run, task ids never reused, held-out tasks never trained on
    assert run1.train_seed != run2.train_seed and not set(run1.task_ids) & set(run2.task_ids)
    assert one.read_result("provision")["train_seed"] == run1.train_seed
    for layout, run in ((one, run1), (two, run2)):
        assert sorted(t.id for t in TaskStore(layout.artifact("provision", "tasks")).read("train")) == sorted(
            run.task_ids
        )
        heldout = {t.id for t in TaskStore(layout.artifact("provision", "tasks")).read("heldout")}
        assert heldout and not heldout & (set(run1.task_ids) | set(run2.task_ids))
    assert {t.id for t in DataStore(store).tasks.read()} == set(run1.task_ids) | set(run2.task_ids)

    # the second run's SFT read the first run's shards plus its own new ones
    assert run1.trained_on == run1.trajectory_shards and len(run1.trajectory_shards) == 1
    assert run2.trained_on == run1.trajectory_shards + run2.trajectory_shards
    credited1 = TrajectoryStore(one.artifact("credit", "credited")).read()
    credited2 = TrajectoryStore(two.artifact("credit", "credited")).read()
    training = TrajectoryStore(two.artifact("accumulate", "training")).read()
    assert sorted(t.id for t in training) == sorted(t.id for t in credited1 + credited2)
    assert two.read_result("sft")["data"]["trajectories_in"] == len(credited1) + len(credited2)
    assert one.read_result("sft")["data"]["trajectories_in"] == len(credited1)
    assert f"trained on 2 trajectory shard(s) of data store {store}" in second.markdown

    # the shard lists are in MLflow for both runs, the rejected one included
    client = mlflow.MlflowClient(second.tracking_uri)
    gates = [one.read_result("promote"), two.read_result("promote")]
    # one held-out task is below min_tasks: neither run can show it beats its start
    assert not gates[0]["promoted"] and not gates[1]["promoted"], gates
    for result, run in ((first, run1), (second, run2)):
        parent = client.get_run(result.parent_run_id)
        assert parent.data.tags["orchard.trained_shards"] == ",".join(run.trained_on)
        assert parent.data.tags["orchard.data_store"] == str(store)
        child = client.search_runs(
            [parent.info.experiment_id],
            filter_string=(
                f"tags.mlflow.parentRunId = '{result.parent_run_id}' and tags.`orchard.stage` = 'accumulate'"
            ),
        )[0]
        inputs = child.inputs.dataset_inputs
        assert [i.dataset.name for i in inputs] == ["training-shards"] and str(store) in inputs[0].dataset.source
        assert json.loads(inputs[0].dataset.profile)["num_rows"] == len(run.trained_on)
    assert client.get_run(second.parent_run_id).data.tags["orchard.promotion"] == "rejected"
    # nothing was promoted, so nothing is registered (a promoted version's lineage tags: tests/pipelines/test_gate.py)
    assert client.search_model_versions(f"name = '{config.register_model_name}'") == []
