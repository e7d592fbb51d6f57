"""End to end: the local runner executes the whole DAG with real sandboxes, real training and MLflow."""

from __future__ import annotations

import json
import math
import re

import mlflow
import pytest

from components.core.data.parquet_store import TaskStore, TrajectoryStore
from pipelines.config import PipelineConfig
from pipelines.layout import RunLayout
from pipelines.local import run_local
from pipelines.stages import STAGES


def _check_run(result, config: PipelineConfig) -> None:
    layout_root = result.run_dir
    assert result.stages_ran == [s.name for s in STAGES]
    assert [r.policy for r in result.report.rows] == ["teacher", "untrained", "sft", "rl"]

    # artifacts, in the documented layout
    from pipelines.layout import RunLayout

    layout = RunLayout(layout_root)
    tasks = TaskStore(layout.artifact("provision", "tasks")).read()
    assert {t.split for t in tasks} == {"train", "validation", "heldout"}
    assert sum(t.split == "train" for t in tasks) == config.provision.n_train
    assert sum(t.split == "validation" for t in tasks) == config.provision.n_validation
    trajectories = TrajectoryStore(layout.artifact("distill", "trajectories")).read()
    assert len(trajectories) == config.provision.n_train * config.distill.attempts_per_task
    assert len(TrajectoryStore(layout.artifact("credit", "credited")).read()) == len(trajectories)
    for model_dir in (
        layout.artifact("init-policy", "model"),
        layout.artifact("sft", "model"),
        layout.artifact("rl", "model"),
    ):
        assert (model_dir / "config.json").exists() and any(model_dir.glob("*.safetensors"))
    for arm in ("untrained", "sft", "rl"):
        assert layout.result_path(f"evaluate-{arm}").exists()
    assert "| untrained |" in layout.report.read_text() and "| rl |" in layout.report.read_text()

    # sane values
    for row in result.report.rows:
        assert row.resolved_rate is not None and 0.0 <= row.resolved_rate <= 1.0, row
    distilled = json.loads(layout.result_path("distill").read_text())
    credit = json.loads(layout.result_path("credit").read_text())
    assert credit["unresolved"] == distilled["counts"]["unresolved"]
    if distilled["counts"]["unresolved"]:
        assert credit["labelled"] + credit["failed"] >= 1, "credit labelling ran on an unresolved trajectory"
    sft = json.loads(layout.result_path("sft").read_text())
    assert math.isfinite(sft["final_loss"]) and sft["final_loss"] > 0
    assert result.report.trajectories["total"] == len(trajectories)
    assert result.report.exec_latency["n"] > 0 and 0 < result.report.exec_latency["p50"] < 30

    # MLflow: one finished parent, one child per stage, the table and the registered model
    client = mlflow.MlflowClient(result.tracking_uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    # what a researcher compares runs by: a training experiment, a description, the commit, the task sets
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith(f"orchard **{config.preset}** run, recipe `swe`, seed {config.seed}")
    assert (
        "- model: the tiny model" in note
        and f"{config.provision.n_train} train, {config.provision.n_heldout} held out" in note
        and f"git commit `{parent.data.tags['mlflow.source.git.commit']}`" in note
    )
    # the held-out rate as one curve over training: untrained at 0, sft at its steps, rl after its updates
    curve = client.get_metric_history(result.parent_run_id, "heldout.resolved_rate")
    sft_steps = json.loads(layout.result_path("sft").read_text())["steps"]
    rl_steps = json.loads(layout.result_path("rl").read_text())["steps_done"]
    rate = {r.policy: r.resolved_rate for r in result.report.rows}
    assert sorted((m.step, m.value) for m in curve) == sorted(
        [(0, rate["untrained"]), (sft_steps, rate["sft"]), (sft_steps + rl_steps, rate["rl"])]
    )
    datasets = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    assert set(datasets) == {"swe-train", "swe-validation", "swe-heldout"}
    assert {t.value for t in datasets["swe-heldout"].tags} == {"heldout"}
    assert parent.data.tags["orchard.stage"] == "pipeline"
    assert parent.data.params["provision.n_train"] == str(config.provision.n_train)
    assert 0.0 <= parent.data.metrics["heldout_resolved_rate.rl"] <= 1.0
    # n and the independent units beside it (generated held-out tasks: one repository each)
    assert (
        parent.data.metrics["heldout_tasks.rl"] == parent.data.metrics["heldout_units.rl"] == config.provision.n_heldout
    )
    assert all(r.units == r.tasks == config.provision.n_heldout for r in result.report.rows)
    assert "RL vs SFT (what RL added):" in result.markdown
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}'"
    )
    names = sorted(c.info.run_name for c in children)
    assert names == sorted(
        [
            "provision",
            "init-policy",
            "distill",
            "credit",
            "accumulate",
            "sft",
            "rl",
            "evaluate-teacher",
            "evaluate-untrained",
            "evaluate-sft",
            "evaluate-rl",
            "promote",
        ]
    ), names
    assert all(c.info.status == "FINISHED" for c in children)
    sft_run = next(c for c in children if c.info.run_name == "sft")
    assert sft_run.data.params["mode"] == config.sft.mode
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id)}
    assert {"report.md", "results_table.json", "stores"} <= artifacts
    shards = {a.path for a in client.list_artifacts(result.parent_run_id, "stores/trajectories")}
    assert any(p.endswith(".parquet") for p in shards), shards
    plots = {a.path for a in client.list_artifacts(result.parent_run_id, "plots")}
    assert "plots/resolved_rates.png" in plots
    # The gate: a fresh store has no champion, so the final trained model is judged against the model
    # training started from (evaluate-untrained); it is registered only if the gate promotes it.
    gate = json.loads(layout.result_path("promote").read_text())
    assert gate["reference"] == "start" and "its start" in gate["reason"], gate
    versions = client.search_model_versions(f"name = '{config.register_model_name}'")
    assert len(versions) == int(gate["promoted"])
    assert parent.data.tags["orchard.promotion"] == ("promoted" if gate["promoted"] else "rejected")
    if gate["promoted"]:
        rl = json.loads(layout.result_path("rl").read_text())
        registered_from = client.get_run(versions[0].run_id).data.tags.get("orchard.registered_from")
        assert registered_from == ("rl" if rl["steps_done"] > 0 else "sft")  # never an untrained model
        champion = client.get_model_version_by_alias(config.register_model_name, "champion")
        assert str(champion.version) == str(versions[0].version)
        assert champion.tags["orchard.pipeline_run_id"] == result.parent_run_id
        assert champion.tags["orchard.parent_model"] == "base (init-policy)"
        assert (
            "promoted sft model as version 1" in result.markdown or "promoted rl model as version 1" in result.markdown
        )


@pytest.mark.timeout(900)
def test_local_pipeline_micro(tmp_path, external_service, micro_config):
    """Against the session's service through `sandbox_url` (no service of its own is started)."""
    import io

    from pipelines.run_console import make_console

    config = micro_config.updated(sandbox_url=external_service.url)
    printed = io.StringIO()
    result = run_local(config, tmp_path / "runs", console=make_console(file=printed))
    _check_run(result, config)
    # the console: the estimate before the first stage, then one line per stage with what it did and the time left
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("estimate: ~") and "costs measured on an idle 2-core machine" in lines[0], lines[0]
    done = [line for line in lines if line.startswith("  done ")]
    assert [line.split()[1] for line in done] == [s.name for s in STAGES]
    assert all(" left" in line for line in done[:-1]), done  # the last stage leaves only the report
    assert re.search(r"resolved [01]/1 ", next(line for line in done if "evaluate-teacher" in line))
    assert "2 steps, loss " in next(line for line in done if line.split()[1] == "sft")
    assert json.loads((tmp_path / "runs" / "estimates.json").read_text())["sft|tiny"]["runs"] == 1  # learned
    rl = json.loads(RunLayout(result.run_dir).result_path("rl").read_text())
    assert rl["steps_done"] == 0
    assert "rl made 0 optimizer updates: its model is untrained and is not registered" in result.markdown
    # One held-out task is below the gate's min_tasks: nothing is registered, and a second run against the
    # same MLflow store (no champion still) is judged against its start again.
    gate = json.loads(RunLayout(result.run_dir).result_path("promote").read_text())
    assert not gate["promoted"] and "min_tasks" in gate["reason"], gate
    again = run_local(config, tmp_path / "runs")
    gate = json.loads(RunLayout(again.run_dir).result_path("promote").read_text())
    assert not gate["promoted"] and gate["reference"] == "start", gate
    client = mlflow.MlflowClient(again.tracking_uri)
    assert client.search_model_versions(f"name = '{config.register_model_name}'") == []
    assert client.get_run(again.parent_run_id).data.tags["orchard.promotion"] == "rejected"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_local_pipeline_tiny_preset(tmp_path, external_service):
    config = PipelineConfig.preset_config(
        "tiny", register_model_name="orchard-test-policy", sandbox_url=external_service.url
    )
    result = run_local(config, tmp_path / "runs")
    _check_run(result, config)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # every component is a fresh interpreter: minutes of imports alone
def test_kfp_local_subprocess_runner(tmp_path, external_service, micro_config):
    """The same DAG through kfp.local: every component in its own subprocess via KFP's executor."""
    from pipelines.local import run_kfp_local

    config = micro_config.updated(sandbox_url=external_service.url)
    out = run_kfp_local(config, tmp_path / "runs")
    client = mlflow.MlflowClient(out["tracking_uri"])
    parent = client.get_run(out["parent_run_id"])
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'"
    )
    assert sorted(c.info.run_name for c in children) == sorted(s.name for s in STAGES)
    assert "| untrained |" in out["markdown"] and "| rl |" in out["markdown"]
    assert 0.0 <= parent.data.metrics["heldout_resolved_rate.rl"] <= 1.0
    # n and the independent units beside it (generated held-out tasks: one repository each)
    assert (
        parent.data.metrics["heldout_tasks.rl"] == parent.data.metrics["heldout_units.rl"] == config.provision.n_heldout
    )
    assert "RL vs SFT (what RL added):" in out["markdown"]


def _recipe_config(recipe: str, max_len: int, max_steps: int) -> PipelineConfig:
    """The tiny preset on another recipe: longer samples and step limits (GUI/Claw episodes are longer)."""
    steps = {"harness": {"max_steps": max_steps}}
    return PipelineConfig.preset_config(
        "tiny",
        recipe=recipe,
        register_model_name=f"orchard-{recipe}-policy",
        distill=steps,
        rl=steps,
        evaluate=steps,
        evaluate_teacher=steps,
        credit={"monte_carlo": {"max_steps": max_steps}},
        sft={"max_len": max_len},
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("recipe", "max_len", "max_steps"), [("claw", 3072, 12), ("gui", 4096, 20)])
def test_the_same_pipeline_runs_the_other_recipes(tmp_path, external_service, recipe, max_len, max_steps):
    """Only tasks, tools and verifiers change: GUI and Claw through the identical DAG and stages."""
    config = _recipe_config(recipe, max_len, max_steps).updated(sandbox_url=external_service.url)
    result = run_local(config, tmp_path / "runs")
    _check_run(result, config)
    from pipelines.layout import RunLayout

    tasks = TaskStore(RunLayout(result.run_dir).artifact("provision", "tasks")).read()
    assert {t.recipe for t in tasks} == {recipe}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_local_pipeline_runs_on_a_user_checkpoint_through_model_path(tmp_path, external_service, micro_config):
    """`--set model.path=<dir>`: a checkpoint like an outside user's (Qwen's real vocabulary, our ChatML template
    with tools, random-init Qwen3) goes through init-policy, distill, credit, SFT, RL and evaluation."""
    from components.core.policy.modeling import load_tokenizer
    from components.core.rendering.tokens import chat_format, render_trajectory
    from components.core.data.schema import Outcome, TokenRole
    from components.core.data.parquet_store import TrajectoryStore
    from components.checkpoints import save_checkpoint

    user = save_checkpoint(tmp_path / "user-model", "chatml")
    config = micro_config.updated(sandbox_url=external_service.url, model={"path": str(user), "device": "cpu"})
    result = run_local(config, tmp_path / "runs")
    layout = RunLayout(result.run_dir)
    base = layout.artifact("init-policy", "model")
    tok = load_tokenizer(base)
    assert len(tok) > 150_000 and tok.chat_template == load_tokenizer(user).chat_template  # the user's, untouched
    sft = layout.artifact("sft", "model")
    assert load_tokenizer(sft).chat_template == tok.chat_template
    fmt = chat_format(tok)
    teacher = [
        t for t in TrajectoryStore(layout.artifact("credit", "credited")).read() if t.outcome is Outcome.resolved
    ]
    assert teacher, "the scripted teacher resolved nothing: nothing to check the masks on"
    for traj in teacher:  # no tool / system / user token carries loss; every trained turn ends at the stop token
        sample = render_trajectory(traj, tok, loss_on="assistant")
        assert not any(m for m, r in zip(sample.loss_mask, sample.roles) if r != TokenRole.assistant)
        ends = [t for t, m, nxt in zip(sample.input_ids, sample.loss_mask, sample.loss_mask[1:] + [0]) if m and not nxt]
        assert ends and all(t in fmt.stop_ids for t in ends)
    assert json.loads(layout.result_path("evaluate-sft").read_text())["valid_attempts"] > 0
