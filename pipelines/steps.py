"""What every runner does around a stage (config in, tracking, result out, fail-loud checks), once.

The local runner, the KFP components and the Argo containers (`python -m pipelines.steps run
<stage> --run-dir D ...`) all call `run_stage`, so the three paths run the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sandbox_service.connection import SandboxConnection
from components.core.distributed import is_main_process, world_size
from components.core.tracking import TrackingConfig, close_pipeline_run, open_pipeline_run
from pipelines import stages
from pipelines.config import PipelineConfig, resolve
from pipelines.preflight import check_model, preflight

if TYPE_CHECKING:
    from pipelines.layout import RunLayout


def tracking_uri_for(config: PipelineConfig, run_dir: Path | None = None) -> str:
    """The run's MLflow URI: the configured one, else a sqlite file beside the run directories."""
    if config.tracking_uri:
        return config.tracking_uri
    base = (run_dir.parent if run_dir is not None else Path("runs")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{base / 'mlflow.db'}"


class StepContext:
    """The run's config plus how this step reaches the sandbox service and MLflow."""

    def __init__(self, config: PipelineConfig, parent_run_id: str | None, sandbox: SandboxConnection | None = None):
        self.config = config
        self.parent_run_id = parent_run_id or None
        # The token comes from the environment (a Secret on the cluster), never from the config.
        self.sandbox = sandbox or (
            SandboxConnection(url=config.sandbox_url) if config.sandbox_url else SandboxConnection()
        )

    @classmethod
    def from_json(cls, config_json: str, parent_run_id: str | None) -> StepContext:
        return cls(PipelineConfig.model_validate_json(config_json), parent_run_id)

    @property
    def tracking_config(self) -> TrackingConfig:
        return TrackingConfig(
            tracking_uri=tracking_uri_for(self.config),
            experiment=self.config.experiment,
            parent_run_id=self.parent_run_id,
        )

    def tracking(self, stage: str) -> TrackingConfig | None:
        if self.parent_run_id is None:
            return None
        return self.tracking_config.model_copy(update={"run_name": stage})

    def stage_config(self, stage: str) -> BaseModel:
        """The stage's own config section, with this step's sandbox connection (token included)."""
        row = stages.BY_NAME[stage]
        section = row.build_config(self.config) if row.build_config else getattr(self.config, row.config)
        if "sandbox" in type(section).model_fields:
            section = section.model_copy(update={"sandbox": self.sandbox})
        return section


# ---------------------------------------------------------------------------------------------
# One stage, whatever the runner
# ---------------------------------------------------------------------------------------------
def run_stage(name: str, ctx: StepContext, inputs: Mapping[str, Path | str], outputs: Mapping[str, Path | str]) -> dict:
    """Run one row of the stage table; returns its result as JSON-ready data (raises StageFailed)."""
    stage = stages.BY_NAME[name]
    check_world_size(stage, ctx.config)
    call = stages.StageCall(
        config=ctx.stage_config(name),
        inputs={k: Path(v) for k, v in inputs.items()},
        outputs={k: Path(v) for k, v in outputs.items()},
        tracking=ctx.tracking(name),
    )
    result = stage.run(call)
    record = result.model_dump(mode="json") if isinstance(result, BaseModel) else dict(result)
    check_infra_errors(name, record, ctx.config)
    return record


def check_world_size(stage: stages.Stage, config: PipelineConfig) -> None:
    """A stage runs in as many processes as its config's `launch` says (a mismatch trains the wrong thing)."""
    wanted = getattr(getattr(config, stage.config, None), "launch", None) if stage.distributed else None
    processes = wanted.processes if wanted is not None else 1
    if world_size() != processes:
        raise stages.StageFailed(
            f"stage {stage.name}: its config asks for {processes} process(es) ({stage.config}.launch) but it runs in "
            f"{world_size()}; compile the pipeline with this config (the stage becomes a PyTorchJob) or start it as "
            f"`torchrun --nproc-per-node=... -m pipelines.steps run {stage.name} ...` with that many processes"
        )


def infra_counts(record: dict) -> tuple[int, int] | None:
    """(infrastructure errors, episodes) of a stage result, when it runs episodes."""
    if isinstance(record.get("counts"), dict) and "infra_error" in record["counts"]:  # distill
        return int(record["counts"]["infra_error"]), int(sum(record["counts"].values()))
    if "infra_errors" in record:
        total = record.get("attempts", record.get("trajectories"))  # evaluate | rl
        if isinstance(total, int):
            return int(record["infra_errors"]), total
    return None


def _infra_reasons(record: dict, limit: int) -> list[str]:
    from components.core.data.parquet_store import TrajectoryStore

    path = record.get("trajectories_dir")
    if not path or not Path(path).is_dir():
        return []
    reasons: list[str] = []
    for t in TrajectoryStore(path).read():
        reason = getattr(t, "outcome_reason", None)
        if str(getattr(t.outcome, "value", t.outcome)) == "infra_error" and reason and reason not in reasons:
            reasons.append(reason)
            if len(reasons) >= limit:
                break
    return reasons


def check_infra_errors(name: str, record: dict, config: PipelineConfig) -> None:
    """Fail the stage when its infrastructure-error share reaches the configured limit."""
    counts = infra_counts(record)
    if counts is None:
        return
    errors, total = counts
    limit = config.failure.limit(name)
    if total > 0 and errors / total >= limit:
        reasons = _infra_reasons(record, config.failure.reasons_shown) or ["(no reason recorded)"]
        raise stages.StageFailed(
            f"stage {name}: {errors} of {total} episodes were infrastructure errors (limit {limit:.0%}); "
            f"first reasons: {' | '.join(reasons)}"
        )


def model_trained(stage: str, record: dict | None) -> tuple[bool, str]:
    """Whether a model-producing stage changed its model (an untrained model is never registered)."""
    if record is None:
        return False, f"{stage} did not run"
    updates = record.get("steps_done", record.get("steps"))
    if not updates:
        return False, f"{stage} made 0 optimizer updates: its model is untrained and is not registered"
    return True, f"{stage}: {updates} optimizer updates"


# ---------------------------------------------------------------------------------------------
# Start and report: the same two steps around the stages in every runner
# ---------------------------------------------------------------------------------------------
def start_pipeline(
    *,
    preset: str,
    recipe: str,
    seed: int,
    sandbox_url: str,
    mlflow_uri: str,
    experiment: str,
    overrides_json: str = "{}",
    run_name: str | None = None,
    start_from: str | None = None,
    promotion_margin: float | str | None = None,
    train_tasks: int | str | None = None,
    data_store: str | None = None,
    window_runs: int | str | None = None,
    tags: dict[str, str] | None = None,
) -> tuple[PipelineConfig, str]:
    """Build and validate the run's config from pipeline parameters; open the MLflow parent run.

    The retraining parameters (None: the preset's value) are strings when Argo passes them."""
    retrain: dict[str, Any] = {}
    if start_from:
        retrain["retrain.start_from"] = start_from
    if promotion_margin not in (None, ""):  # unset: the config's promote.margin (a negative one is refused)
        retrain["promote.margin"] = float(promotion_margin)
    if train_tasks not in (None, "") and int(train_tasks) > 0:
        retrain["provision.n_train"] = int(train_tasks)
    if data_store:
        retrain["retrain.data_store"] = data_store
    if window_runs not in (None, "") and int(window_runs) > 0:
        retrain["retrain.window_runs"] = int(window_runs)
    config = resolve(
        preset,
        overrides={  # overrides_json (the whole config, from kfp.local) has the last word
            **retrain,
            **json.loads(overrides_json or "{}"),
            "recipe": recipe,
            "seed": seed,
            "sandbox_url": sandbox_url or None,
            "tracking_uri": mlflow_uri or None,
            "experiment": experiment,
        },
    )
    # before the parent run: a config that cannot work leaves nothing RUNNING (the network only: this step's pod
    # does not mount the checkpoints and task files the stage pods read; local runs check those first)
    preflight(config, files=False)
    ctx = StepContext(config, None)
    run_id = open_pipeline_run(
        ctx.tracking_config,
        run_name or f"pipeline-{config.recipe}",
        config,
        tags=parent_run_tags(config, **(tags or {})),
    )
    return config, run_id


def parent_run_tags(config: PipelineConfig, **extra: str) -> dict[str, str]:
    """The parent run's tags: preset, recipe, the code's git commit and a description (the run page's
    Description: preset, model, data, teacher, commit), plus `extra`."""
    from components.promote import git_commit

    commit = git_commit(Path(__file__).resolve().parents[1])
    source = config.provision.source
    model = f"`{config.model.path}`" if config.model.path else "the tiny model (`model.tiny`)"
    if config.retrain.start_from == "champion":
        model += f", or the champion of `{config.register_model_name}` when there is one"
    data = (
        f"`{source.kind}` tasks from `{source.path}`"
        if source.kind != "generator"
        else f"`{config.recipe}` tasks generated from seed {config.provision.seed}"
    )
    data += f": {config.provision.n_train} train, {config.provision.n_heldout} held out"
    if config.retrain.data_store:
        data += f"; training data accumulates in `{config.retrain.data_store}`"
    teacher = (
        config.distill.openai.model
        if config.distill.teacher == "openai" and config.distill.openai
        else f"scripted (error rate {config.distill.error_rate:g})"
    )
    note = "\n".join(
        [
            f"orchard **{config.preset}** run, recipe `{config.recipe}`, seed {config.seed}",
            "",
            f"- model: {model}",
            f"- data: {data}",
            f"- teacher: {teacher}",
            f"- stages: sft {config.sft.steps} steps ({config.sft.mode}), rl {config.rl.steps} steps "
            f"({config.rl.rollout.sampler}), evaluation k={config.evaluate.k}",
            f"- code: git commit `{commit}`",
        ]
    )
    return {
        "orchard.preset": config.preset,
        "orchard.recipe": config.recipe,
        "mlflow.source.git.commit": commit,
        "mlflow.note.content": note,
        **extra,
    }


def per_task_pass_at_1(evals: dict[str, dict]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Each arm's pass@1 by task id, and each task's unit (repository), read from the arms' per_task.parquet
    (arms whose file is not readable here, e.g. a cluster artifact the report step cannot see, are left out
    of the paired comparisons)."""
    import pandas as pd

    out: dict[str, dict[str, float]] = {}
    units: dict[str, str] = {}
    for arm, result in evals.items():
        path = result.get("per_task_path")
        if path and Path(path).is_file():
            frame = pd.read_parquet(path)
            out[arm] = dict(zip(frame["task_id"], frame["pass_at_1"].astype(float)))
            if "unit" in frame:
                units.update(zip(frame["task_id"], frame["unit"]))
    return out, units


def rl_movement(rl: dict | None, evals: dict[str, dict]) -> str | None:
    """How far RL moved the policy from the SFT model, in one line: the weights' relative change, and on how many
    held-out tasks the two models' greedy episodes differ (their assistant turns as sampled). None without RL."""
    from components.core.data.parquet_store import TrajectoryStore

    if not rl:
        return None
    parts = []
    if rl.get("weight_change") is not None:
        parts.append(f"weights {100 * rl['weight_change']:.2f} % from SFT's (relative L2)")
    greedy = {}
    for arm in ("sft", "rl"):
        store = Path((evals.get(arm) or {}).get("trajectories_dir") or "").with_name("trajectories_greedy")
        if store.is_dir():
            greedy[arm] = {
                t.task_id: [s.content for s in t.steps if s.role == "assistant"] for t in TrajectoryStore(store).read()
            }
    if len(greedy) == 2:
        shared = greedy["sft"].keys() & greedy["rl"].keys()
        differ = sum(greedy["sft"][t] != greedy["rl"][t] for t in shared)
        parts.append(f"greedy episodes differ on {differ} of {len(shared)} held-out tasks")
    return "RL moved the policy: " + "; ".join(parts) if parts else None


def training_steps(results: dict[str, dict | None]) -> dict[str, int]:
    """Optimizer updates behind each trained arm: untrained 0, sft its steps, rl the SFT steps plus its own."""
    sft = int((results.get("sft") or {}).get("steps") or 0)
    return {"untrained": 0, "sft": sft, "rl": sft + int((results.get("rl") or {}).get("steps_done") or 0)}


def finish_pipeline(
    ctx: StepContext,
    results: Mapping[str, dict | str | None],
    *,
    exec_latency: dict[str, float] | None = None,
    stage_seconds: dict[str, float] | None = None,
    stages_skipped: list[str] | None = None,
    stores: dict[str, Path] | None = None,
    tasks_dir: Path | None = None,
    status: str = "FINISHED",
):
    """Log the results table and plots to the parent run and close it (registering is the gate's job).

    `results`: each stage's result by stage name. Returns (RunReport, markdown table).
    """
    from pipelines import report

    parsed = {k: json.loads(v) if isinstance(v, str) else v for k, v in results.items()}
    evals = {arm: r for name, r in parsed.items() if r is not None and (arm := stages.eval_arm(name))}
    notes = [why for stage in ("sft", "rl") for _, why in [model_trained(stage, parsed.get(stage))]]
    data = parsed.get("accumulate")
    if data and data.get("data_store"):
        notes.append(f"trained on {len(data['trained_on'])} trajectory shard(s) of data store {data['data_store']}")
    gate = parsed.get("promote")
    if gate:
        notes.append(report.promotion_note(gate))
    if ctx.config.evaluate.split != "heldout":
        notes.append(
            f"the policies were evaluated on the {ctx.config.evaluate.split} split (for tuning), not on "
            "the held-out one: the rows are not held-out results"
        )
    moved = rl_movement(parsed.get("rl"), evals)
    if moved:
        notes.append(moved)
    per_task, units = per_task_pass_at_1(evals)
    own = {
        "untrained": 0,
        "sft": int((parsed.get("sft") or {}).get("steps") or 0),
        "rl": int((parsed.get("rl") or {}).get("steps_done") or 0),
    }
    run_report = report.build_report(
        evals,
        parsed.get("distill"),
        exec_latency=exec_latency,
        stage_seconds=stage_seconds,
        stages_skipped=stages_skipped,
        notes=notes,
        per_task=per_task,
        units=units,
        gate=gate,
        updates={arm: n for arm, n in own.items() if arm in evals},
    )
    markdown = report.to_markdown(run_report)
    if ctx.parent_run_id:
        report.log_to_parent(
            ctx.tracking_config,
            ctx.parent_run_id,
            run_report,
            markdown,
            stores=stores,
            tasks_dir=tasks_dir,
            training_steps=training_steps(parsed),
        )
        close_pipeline_run(ctx.tracking_config, ctx.parent_run_id, status=status)
    return run_report, markdown


def close_if_running(ctx: StepContext, status: str) -> None:
    """Exit handler: a run that failed before its report step must not stay RUNNING in MLflow."""
    import mlflow

    if not ctx.parent_run_id:
        return
    client = mlflow.MlflowClient(ctx.tracking_config.tracking_uri)
    if client.get_run(ctx.parent_run_id).info.status == "RUNNING":
        close_pipeline_run(ctx.tracking_config, ctx.parent_run_id, status=status)


def close_pipeline_by_tag(tracking_uri: str, experiment: str, tag: str, value: str, status: str) -> int:
    """Close every still-RUNNING parent run carrying `tag=value`; returns how many were closed."""
    import mlflow

    tracking = TrackingConfig(tracking_uri=tracking_uri, experiment=experiment)
    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs(
        [e.experiment_id for e in [client.get_experiment_by_name(experiment)] if e],
        filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'RUNNING'",
    )
    for run in runs:
        close_pipeline_run(tracking, run.info.run_id, status=status)
    return len(runs)


# ---------------------------------------------------------------------------------------------
# KFP: each component body calls this with its artifacts
# ---------------------------------------------------------------------------------------------
def kfp_entry(
    name: str, config_json: str, parent_run_id: str, inputs: dict[str, Any], outputs: dict[str, Any], metrics: Any
) -> str:
    """The body of every KFP stage component: artifacts in, `run_stage`, metrics and result out."""
    ctx = StepContext.from_json(config_json, parent_run_id)
    stage = stages.BY_NAME[name]
    out_paths = {k: Path(a.path) for k, a in outputs.items()}
    mount = os.environ.get("ORCHARD_STORE_MOUNT")
    work = {k: Path(mount) / name / k if (mount and stage.resumable) else p for k, p in out_paths.items()}
    from components.core.interrupts import stop_on_signals

    # A stopped run (KFP's, or Ctrl-C/SIGTERM forwarded by `orchard run --kfp-local`) ends the stage at its
    # next turn or optimizer step: episodes delete their sandboxes, the stage's MLflow run is KILLED.
    with stop_on_signals():
        record = run_stage(name, ctx, {k: a.path for k, a in inputs.items()}, work)
    for k, path in work.items():  # resumable stores live on the PVC; the artifact gets a copy
        if path != out_paths[k]:
            shutil.copytree(path, out_paths[k], dirs_exist_ok=True)
    log_record_metrics(record, metrics)
    return json.dumps(record)


def log_record_metrics(record: dict, metrics: Any) -> None:
    """A stage result's numbers onto its KFP Metrics artifact (NaN left out)."""
    for key, value in (record.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and value == value:
            metrics.log_metric(key, float(value))


# ---------------------------------------------------------------------------------------------
# Argo (and the local runner): one step over a run directory
# ---------------------------------------------------------------------------------------------
def run_in_layout(name: str, layout: RunLayout, ctx: StepContext) -> dict:
    """Run one stage with its artifacts at the run directory's paths; writes and returns its result."""
    stage = stages.BY_NAME[name]
    inputs = {arg: layout.artifact(*ref.split(".", 1)) for arg, ref in stage.inputs.items()}
    outputs = {out: layout.artifact(name, out) for out in stage.outputs}
    record = run_stage(name, ctx, inputs, outputs)
    if is_main_process():  # a PyTorchJob's other ranks trained too; rank 0 writes the one result
        layout.write_result(name, record)
    if name == "init-policy":  # the first moment the model's template exists: lengths fit, before any episode
        check_model(ctx.config, inputs["tasks"], layout.artifact(name, "model"))  # the row reads provision.tasks
    return record


def report_in_layout(layout: RunLayout, ctx: StepContext, **kw: Any):
    """The report step over a run directory: every stage result present, models by stage."""
    results = {s.name: layout.read_result(s.name) for s in stages.STAGES}
    stores = {
        "trajectories": layout.artifact("distill", "trajectories"),
        "credited": layout.artifact("credit", "credited"),
    }
    run_report, markdown = finish_pipeline(
        ctx, results, stores=stores, tasks_dir=layout.artifact("provision", "tasks"), **kw
    )
    layout.report.write_text(markdown)
    return run_report, markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.steps", description="Run one pipeline step (Argo).")
    parser.add_argument("step", choices=[stages.START, "run", stages.REPORT, stages.CLOSE])
    parser.add_argument("stage", nargs="?", choices=list(stages.BY_NAME), help="run: the stage to run.")
    parser.add_argument("--status", default="Failed", help="close-run: the workflow status ({{workflow.status}}).")
    parser.add_argument("--run-dir", type=Path, required=True, help="The run directory on the shared volume.")
    parser.add_argument("--config-json", default="", help="The run's PipelineConfig (from the start step).")
    parser.add_argument(
        "--config-file",
        type=Path,
        default=None,
        help="Instead of --config-json: a file holding it (a PyTorchJob's pods read the run dir's).",
    )
    parser.add_argument("--parent-run-id", default="", help="MLflow parent run id (from the start step).")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="start: a pipeline parameter (preset, recipe, seed, overrides_json, ...).",
    )
    parser.add_argument(
        "--outputs-dir", type=Path, default=Path("/tmp/outputs"), help="start: where Argo reads output parameters from."
    )
    args = parser.parse_args(argv)
    from pipelines.layout import RunLayout

    if args.config_file is not None:
        args.config_json = args.config_file.read_text()
    if args.step == stages.CLOSE:
        if not args.parent_run_id or not args.config_json.startswith("{"):
            print("close-run: the start step produced no MLflow parent run; nothing to close")
            return 0
        ctx = StepContext.from_json(args.config_json, args.parent_run_id)
        close_if_running(ctx, "FINISHED" if args.status == "Succeeded" else "FAILED")
        return 0
    if args.step == stages.START:
        params: dict[str, Any] = dict(item.split("=", 1) for item in args.param)
        params["seed"] = int(params.get("seed", 0))
        try:  # before the parent run exists: a volume the step cannot write fails it with no run left RUNNING
            for directory in (args.run_dir, args.outputs_dir):
                directory.mkdir(parents=True, exist_ok=True)
                probe = directory / ".orchard-write-check"
                probe.write_text("")
                probe.unlink()
        except OSError as err:
            print(
                f"error: cannot write the run directory ({err}); the volume must be writable by uid "
                f"{os.getuid()} (the stage pods' fsGroup, ClusterConfig.stage_uid)",
                file=sys.stderr,
            )
            return 1
        from pipelines.config import ConfigError
        from pipelines.preflight import PreflightError

        try:
            config, run_id = start_pipeline(**params, tags={"orchard.runner": "argo"})
        except (ConfigError, PreflightError) as err:  # a run that cannot work: one line, no parent run left open
            print(f"error: {err}", file=sys.stderr)
            return 2
        try:
            (args.outputs_dir / "config_json").write_text(config.model_dump_json())
            RunLayout(args.run_dir).config.write_text(config.model_dump_json())  # for a stage's PyTorchJob pods
            (args.outputs_dir / "parent_run_id").write_text(run_id)
        except OSError:
            close_pipeline_run(StepContext(config, run_id).tracking_config, run_id, status="FAILED")
            raise
        return 0
    ctx = StepContext.from_json(args.config_json, args.parent_run_id)
    if args.step == stages.REPORT:
        print(report_in_layout(RunLayout(args.run_dir), ctx)[1])
        return 0
    if args.stage is None:
        parser.error("run needs the stage name")
    from components.core.interrupts import RunInterrupted, stop_on_signals

    try:
        # A stopped workflow or a pod deadline sends SIGTERM: the stage ends at its next turn or optimizer step,
        # its episodes delete their sandboxes and its MLflow run is KILLED (the exit handler closes the parent).
        with stop_on_signals():
            run_in_layout(args.stage, RunLayout(args.run_dir), ctx)
    except stages.StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as err:
        print(f"error: stage {args.stage} {err}: stopped", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
