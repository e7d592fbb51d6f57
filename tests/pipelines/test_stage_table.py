"""One stage table: the local runner, the KFP pipeline and the Argo WorkflowTemplate have the same tasks."""

from __future__ import annotations

import inspect

import pytest
import yaml

from pipelines import stages

from pipelines.kfp import components as kfp_components
from pipelines.argo.workflow import build_workflow_template
from pipelines.config import PipelineConfig
from pipelines.kfp.pipeline import build_pipeline

INFRA_TASKS = {"run-store", "deletepvc"}  # the run store's PVC steps: cluster plumbing, not stages


@pytest.fixture(scope="module")
def kfp_spec(tmp_path_factory):
    from kfp import compiler

    path = tmp_path_factory.mktemp("kfp") / "p.yaml"
    compiler.Compiler().compile(build_pipeline(), package_path=str(path))
    return next(yaml.safe_load_all(path.read_text()))


def _kfp_dag(spec) -> dict:
    return spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]


def test_the_three_runners_have_the_same_tasks_and_dependencies(kfp_spec):
    kfp = {
        n: set(t.get("dependentTasks", [])) - INFRA_TASKS for n, t in _kfp_dag(kfp_spec).items() if n not in INFRA_TASKS
    }
    argo_doc = yaml.safe_load(build_workflow_template().to_yaml())
    argo_templates = {t["name"]: t for t in argo_doc["spec"]["templates"]}
    argo = {
        t["name"]: set((t.get("depends") or "").split(" && ")) - {""}
        for t in argo_templates["pipeline"]["dag"]["tasks"]
    }
    expected = {stages.START: set()}
    for stage in stages.STAGES:
        expected[stage.name] = set(stage.depends) or {stages.START}
    expected[stages.REPORT] = {s.name for s in stages.STAGES}
    assert set(stages.task_names()) == set(expected)
    # KFP adds the start task as a dependency wherever its outputs are used; the stage edges must match.
    assert {n: d - {stages.START} for n, d in kfp.items()} == {n: d - {stages.START} for n, d in expected.items()}
    assert argo == expected
    # the local runner runs the rows in table order, and every dependency comes first
    order = [s.name for s in stages.STAGES]
    for stage in stages.STAGES:
        assert all(order.index(d) < order.index(stage.name) for d in stage.depends)
    # the exit handler has the same name on both cluster runners
    assert argo_doc["spec"]["onExit"] == stages.CLOSE
    assert stages.CLOSE in kfp_spec["root"]["dag"]["tasks"]


def test_kfp_component_signatures_are_the_rows(kfp_spec):
    from kfp.dsl import Input, Output

    jobs = [(stages.BY_NAME[n], c) for n, c in kfp_components.launcher_components().items()]  # PyTorchJob launchers
    assert {s.name for s, _ in jobs} == {s.name for s in stages.STAGES if s.distributed}
    components = kfp_components.stage_components()
    assert list(components) == [s.name for s in stages.STAGES]
    for stage, component in [(s, components[s.name]) for s in stages.STAGES] + jobs:
        func = component.python_func
        params = inspect.signature(func).parameters
        ins = {
            n
            for n, p in params.items()
            if getattr(p.annotation, "__origin__", None) is not None and "Input" in repr(p.annotation)
        }
        outs = {n for n, p in params.items() if "Output" in repr(p.annotation) and n != "metrics"}
        assert ins == set(stage.inputs), f"{stage.name}: component inputs {ins} != row inputs {set(stage.inputs)}"
        assert outs == set(stage.outputs), f"{stage.name}: component outputs {outs} != row outputs"
        kinds = {n: "model" if "Model" in repr(params[n].annotation) else "dataset" for n in outs}
        assert kinds == stage.outputs
    assert Input and Output
    report = inspect.signature(kfp_components.report_component().python_func).parameters
    assert {s.name.replace("-", "_") for s in stages.STAGES} <= set(report), "the report reads every stage's result"


def test_rows_decide_placement_retries_and_timeouts_in_both_cluster_yamls(kfp_spec):
    argo = {t["name"]: t for t in yaml.safe_load(build_workflow_template().to_yaml())["spec"]["templates"]}
    executors = kfp_spec["deploymentSpec"]["executors"]
    for stage in stages.STAGES:
        gpu_kfp = "accelerator" in executors[f"exec-{stage.name}"]["container"].get("resources", {})
        gpu_argo = "nvidia.com/gpu" in argo[stage.name]["container"]["resources"].get("limits", {})
        assert gpu_kfp == gpu_argo == stage.wants_gpu(PipelineConfig.preset_config("demo")), stage.name
        kfp_task = _kfp_dag(kfp_spec)[stage.name]
        assert kfp_task.get("cachingOptions", {}).get("enableCache", False) == stage.cache, stage.name
        if not stage.retries:  # the gate: a retry after registering could register twice
            assert "retryStrategy" not in argo[stage.name] and "retryPolicy" not in kfp_task, stage.name
            continue
        assert (
            argo[stage.name]["retryStrategy"]["limit"] == str(stage.retries)
            or argo[stage.name]["retryStrategy"]["limit"] == stage.retries
        )
        assert kfp_task["retryPolicy"]["maxRetryCount"] == stage.retries


def test_a_table_with_a_dangling_input_is_refused(monkeypatch):
    bad = stages.Stage("judge", stages.evaluate, "evaluate", {"tasks": "nowhere.tasks"})
    monkeypatch.setattr(stages, "STAGES", [*stages.STAGES, bad])
    with pytest.raises(ValueError, match="nowhere.tasks"):
        stages._check_table()


def test_the_docs_stage_table_lists_every_stage_and_no_other():
    """docs/concepts/stages.md's first table names each stage of `STAGES` once (a row may name several, comma
    separated): a stage added to the table and not to the docs, or a renamed one, fails here."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "stages.md").read_text()
    table = next(block for block in page.split("\n\n") if block.startswith("| stage |"))
    rows = [line.split("|")[1] for line in table.splitlines()[2:]]
    named = [name.strip() for row in rows for name in row.split(",")]
    assert sorted(named) == sorted(s.name for s in stages.STAGES)
