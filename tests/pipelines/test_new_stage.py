"""A new stage is one row: a toy stage added to the stage table (nothing else edited) is a task of the KFP
pipeline and the Argo WorkflowTemplate, with its inputs wired and its result in the report step, and the local
runner runs it between the stages it depends on and those after it."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from components.core.data.parquet_store import TaskStore
from pipelines import stages
from pipelines.kfp import components as kfp_components
from pipelines.argo.workflow import build_workflow_template
from pipelines.kfp.pipeline import compile_pipeline
from pipelines.layout import RunLayout
from pipelines.local import run_local


class TallyConfig(BaseModel):
    """The toy stage's own config (built from the run's config, like the gate's)."""

    model_config = ConfigDict(extra="forbid")
    splits: list[str]


def tally(call: stages.StageCall) -> dict:
    """Count the provisioned tasks of each split (a toy stage: reads one artifact, writes one)."""
    tasks = TaskStore(call.inputs["tasks"]).read()
    counts = {split: sum(t.split == split for t in tasks) for split in call.config.splits}
    call.outputs["counts"].mkdir(parents=True, exist_ok=True)
    (call.outputs["counts"] / "counts.json").write_text(json.dumps(counts))
    return {"counts": counts, "metrics": {f"tasks_{s}": float(n) for s, n in counts.items()}}


TALLY = stages.Stage(
    "tally",
    tally,
    "provision",
    {"tasks": "provision.tasks"},
    {"counts": "dataset"},
    build_config=lambda config: TallyConfig(splits=["train", "heldout"]),
)


@pytest.fixture
def with_tally(monkeypatch):
    """The stage table with the toy row added before the gate (the only edit a new stage needs)."""
    table = [*stages.STAGES[:-1], TALLY, stages.STAGES[-1]]
    monkeypatch.setattr(stages, "STAGES", table)
    monkeypatch.setattr(stages, "BY_NAME", {s.name: s for s in table})
    stages._check_table()
    return table


def test_a_new_row_is_a_task_of_both_cluster_pipelines_and_feeds_the_report(with_tally, tmp_path):
    kfp = next(yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text()))
    dag = kfp["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(dag["tally"]["dependentTasks"]) == {"provision", "start"}
    assert dag["tally"]["inputs"]["artifacts"]["tasks"]["taskOutputArtifact"] == {
        "outputArtifactKey": "tasks",
        "producerTask": "provision",
    }
    component = kfp["components"]["comp-tally"]
    assert set(component["outputDefinitions"]["artifacts"]) == {"counts", "metrics"}
    assert "return kfp_entry('tally'" in "".join(
        kfp["deploymentSpec"]["executors"]["exec-tally"]["container"]["command"]
    )
    report = dag["report"]["inputs"]["parameters"]["tally"]["taskOutputParameter"]
    assert report == {"outputParameterKey": "Output", "producerTask": "tally"}
    assert "tally" in kfp_components.report_source(with_tally)

    argo = yaml.safe_load(build_workflow_template().to_yaml())["spec"]
    tasks = (
        {t["name"]: t for t in argo["templates"][0]["dag"]["tasks"]}
        if argo["templates"][0].get("dag")
        else {t["name"]: t for tpl in argo["templates"] if tpl.get("dag") for t in tpl["dag"]["tasks"]}
    )
    assert tasks["tally"]["depends"] == "provision"
    assert "tally" in tasks["report"]["depends"].split(" && ")
    assert any(t["name"] == "tally" for t in argo["templates"]), "the row has its own step template"


@pytest.mark.timeout(900)
def test_the_local_runner_runs_a_new_row(with_tally, tmp_path, external_service, micro_config):
    config = micro_config.updated(sandbox_url=external_service.url)
    result = run_local(config, tmp_path / "runs")
    assert result.stages_ran == [s.name for s in with_tally]
    layout = RunLayout(result.run_dir)
    counts = json.loads((layout.artifact("tally", "counts") / "counts.json").read_text())
    assert counts == {"train": config.provision.n_train, "heldout": config.provision.n_heldout}
    assert json.loads(layout.result_path("tally").read_text())["counts"] == counts
