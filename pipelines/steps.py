"""What every pipeline step does around its stage: config in, tracking, result out.

The KFP components, the Argo container steps (`python -m pipelines.steps <step> --run-dir D ...`)
and the local runner all go through these functions, so the three paths run the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from components.core.connection import SandboxConnection
from components.core.tracking import TrackingConfig, close_pipeline_run, open_pipeline_run
from pipelines import stage_configs
from pipelines.config import PipelineConfig

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
        # In a cluster the token comes from a Secret as ORCHARD_SANDBOX_TOKEN (SandboxConnection's default).
        self.sandbox = sandbox or (
            SandboxConnection(url=config.sandbox_url) if config.sandbox_url else SandboxConnection()
        )

    @classmethod
    def from_json(cls, config_json: str, parent_run_id: str | None) -> "StepContext":
        return cls(PipelineConfig.model_validate_json(config_json), parent_run_id)

    @property
    def tracking_config(self) -> TrackingConfig:
        return TrackingConfig(tracking_uri=tracking_uri_for(self.config), experiment=self.config.experiment,
                              parent_run_id=self.parent_run_id)

    def tracking(self, stage: str) -> TrackingConfig | None:
        if self.parent_run_id is None:
            return None
        return self.tracking_config.model_copy(update={"run_name": stage})

    def stage_config(self, stage: str) -> BaseModel:
        return stage_configs.build(stage, self.config, self.sandbox)

    @staticmethod
    def work_dir(name: str, artifact_path: str | Path) -> Path:
        """Where a store is written: the mounted PVC if the step has one, else the artifact itself.

        On the cluster the trajectory store lives on a PVC, so a retried pod resumes from the shards
        already written instead of starting over; `publish` then copies it into the KFP artifact.
        """
        mount = os.environ.get("ORCHARD_STORE_MOUNT")
        return Path(mount) / name if mount else Path(artifact_path)

    @staticmethod
    def publish(work: Path, artifact_path: str | Path) -> None:
        if Path(work).resolve() != Path(artifact_path).resolve():
            shutil.copytree(work, artifact_path, dirs_exist_ok=True)

    @staticmethod
    def to_kfp_metrics(result: BaseModel, metrics: Any) -> None:
        """Copy a stage result's numeric metrics onto a KFP Metrics artifact."""
        for key, value in (getattr(result, "metrics", None) or {}).items():
            if isinstance(value, (int, float)) and value == value:
                metrics.log_metric(key, float(value))


def start_pipeline(*, preset: str, recipe: str, n_train_tasks: int, n_heldout_tasks: int, sft_steps: int,
                   rl_steps: int, seed: int, sandbox_url: str, mlflow_uri: str, experiment: str,
                   overrides_json: str = "{}", run_name: str | None = None,
                   tags: dict[str, str] | None = None) -> tuple[PipelineConfig, str]:
    """Build and validate the run's config from pipeline parameters; open the MLflow parent run."""
    overrides = json.loads(overrides_json or "{}")
    config = PipelineConfig.preset_config(
        preset,
        **{
            **overrides,
            "recipe": recipe,
            "seed": seed,
            "sandbox_url": sandbox_url or None,
            "tracking_uri": mlflow_uri or None,
            "experiment": experiment,
            "tasks": {**overrides.get("tasks", {}), "n_train": n_train_tasks, "n_heldout": n_heldout_tasks},
            "sft": {**overrides.get("sft", {}), "steps": sft_steps},
            "rl": {**overrides.get("rl", {}), "steps": rl_steps},
        },
    )
    ctx = StepContext(config, None)
    run_id = open_pipeline_run(ctx.tracking_config, run_name or f"pipeline-{config.recipe}", config,
                               tags={"orchard.preset": config.preset, "orchard.recipe": config.recipe, **(tags or {})})
    return config, run_id


def init_policy_model(config: PipelineConfig, out_dir: str | Path) -> str:
    """Save the untrained tiny policy and its tokenizer (`save_pretrained`); returns the dir."""
    from components.core import modeling

    model, tokenizer = modeling.build_policy(stage_configs.model_config(config))
    return str(modeling.save_policy(model, tokenizer, out_dir))


def tracked_provision(ctx: StepContext, out_tasks_dir: str | Path):
    """Provision the task suite (train + held-out) into a TaskStore, in its own child run."""
    from components.provision import provision_environment

    return provision_environment(ctx.stage_config("provision"), out_tasks_dir, tracking=ctx.tracking("provision"))


def tracked_init_policy(ctx: StepContext, out_dir: str | Path) -> dict[str, Any]:
    from components.core.modeling import load_policy_model, num_parameters
    from components.core.tracking import log_metrics, stage_run

    with stage_run("init-policy", stage_configs.model_config(ctx.config), ctx.tracking("init-policy")):
        model_dir = init_policy_model(ctx.config, out_dir)
        params = float(num_parameters(load_policy_model(model_dir)))
        log_metrics({"num_parameters": params})
    return {"model_dir": model_dir, "metrics": {"num_parameters": params}}


def finish_pipeline(ctx: StepContext, *, distill_result: str | dict | None, eval_results: dict[str, str | dict],
                    final_model_dir: str | Path | None, exec_latency: dict[str, float] | None = None,
                    stage_seconds: dict[str, float] | None = None, stages_skipped: list[str] | None = None,
                    stores: dict[str, Path] | None = None, status: str = "FINISHED"):
    """Log the results table and plots to the parent run, register the final model, close the run.

    Returns (RunReport, markdown table).
    """
    from pipelines import report

    def as_dict(x: str | dict | None) -> dict:
        return json.loads(x) if isinstance(x, str) else (x or {})

    run_report = report.build_report({k: as_dict(v) for k, v in eval_results.items()}, as_dict(distill_result),
                                     exec_latency=exec_latency, stage_seconds=stage_seconds,
                                     stages_skipped=stages_skipped)
    markdown = report.to_markdown(run_report)
    if ctx.parent_run_id:
        report.log_to_parent(ctx.tracking_config, ctx.parent_run_id, run_report, markdown,
                             final_model_dir=final_model_dir, register_name=ctx.config.register_model_name,
                             stores=stores)
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
    runs = mlflow.MlflowClient(tracking_uri).search_runs(
        [e.experiment_id for e in [mlflow.MlflowClient(tracking_uri).get_experiment_by_name(experiment)] if e],
        filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'RUNNING'",
    )
    for run in runs:
        close_pipeline_run(tracking, run.info.run_id, status=status)
    return len(runs)


# ---------------------------------------------------------------------------------------------
# One step over a run directory: the Argo container steps and the local runner use this.
# ---------------------------------------------------------------------------------------------
STEPS = ["provision", "init-policy", "distill", "credit", "sft", "rl", "evaluate", "report"]
ARMS = ("untrained", "sft", "rl")


def run_step(step: str, layout: "RunLayout", ctx: StepContext, arm: str | None = None) -> Any:
    """Run one step with the run directory's artifact layout; writes and returns its result."""
    result: Any
    if step == "provision":
        result = tracked_provision(ctx, layout.tasks)
    elif step == "init-policy":
        result = tracked_init_policy(ctx, layout.base_model)
    elif step == "distill":
        from components.distill import distill

        result = distill(ctx.stage_config("distill"), layout.tasks, layout.trajectories, tracking=ctx.tracking("distill"))
    elif step == "credit":
        from components.credit import label_credit

        result = label_credit(ctx.stage_config("credit"), layout.trajectories, layout.tasks, layout.credited,
                              tracking=ctx.tracking("credit"))
    elif step == "sft":
        from components.sft import train_sft

        result = train_sft(ctx.stage_config("sft"), layout.credited, layout.sft_model,
                           base_model_dir=layout.base_model, tracking=ctx.tracking("sft"))
    elif step == "rl":
        from components.rl import train_rl

        result = train_rl(ctx.stage_config("rl"), layout.tasks, layout.sft_model, layout.rl_model,
                          tracking=ctx.tracking("rl"))
    elif step == "evaluate":
        from components.evaluate import evaluate

        if arm not in (*ARMS, "teacher"):
            raise ValueError(f"evaluate needs --arm in {(*ARMS, 'teacher')}, got {arm!r}")
        if arm == "teacher":  # the scripted teacher needs no model directory
            config, model_dir = ctx.stage_config("evaluate-teacher"), None
        else:
            config = ctx.stage_config("evaluate")
            model_dir = {"untrained": layout.base_model, "sft": layout.sft_model, "rl": layout.rl_model}[arm]
        result = evaluate(config, layout.tasks, model_dir, layout.eval_dir(arm), tracking=ctx.tracking(f"evaluate-{arm}"))
        step = f"evaluate-{arm}"
    elif step == "report":
        def read(name: str) -> dict:
            return json.loads(layout.result_path(name).read_text())

        _, markdown = finish_pipeline(ctx, distill_result=read("distill"),
                                      eval_results={a: read(f"evaluate-{a}") for a in ARMS},
                                      final_model_dir=layout.rl_model,
                                      stores={"trajectories": layout.trajectories, "credited": layout.credited})
        layout.report.write_text(markdown)
        return markdown
    else:
        raise ValueError(f"unknown step {step!r}; choose one of {STEPS}")
    layout.write_result(step, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.steps", description="Run one pipeline step (Argo).")
    parser.add_argument("step", choices=["start", "close", *STEPS])
    parser.add_argument("--status", default="Failed", help="Close: the workflow status ({{workflow.status}}).")
    parser.add_argument("--run-dir", type=Path, required=True, help="The run directory on the shared volume.")
    parser.add_argument("--config-json", default="", help="The run's PipelineConfig (from the start step).")
    parser.add_argument("--parent-run-id", default="", help="MLflow parent run id (from the start step).")
    parser.add_argument("--arm", default=None, help="Evaluate: untrained, sft, rl or teacher.")
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--params-json", default="{}", help="Start: pipeline parameters as JSON.")
    parser.add_argument("--overrides-json", default="{}", help="Start: further PipelineConfig knobs as JSON.")
    parser.add_argument("--outputs-dir", type=Path, default=Path("/tmp/outputs"),
                        help="Start: where Argo reads output parameters from.")
    args = parser.parse_args(argv)
    if args.step == "close":
        if not args.parent_run_id or not args.config_json.startswith("{"):
            print("close: the start step produced no MLflow parent run; nothing to close")
            return 0
        ctx = StepContext.from_json(args.config_json, args.parent_run_id)
        close_if_running(ctx, "FINISHED" if args.status == "Succeeded" else "FAILED")
        return 0
    if args.step == "start":
        params = json.loads(args.params_json)
        config, run_id = start_pipeline(preset=args.preset, overrides_json=args.overrides_json, **params,
                                        tags={"orchard.runner": "argo"})
        args.run_dir.mkdir(parents=True, exist_ok=True)
        args.outputs_dir.mkdir(parents=True, exist_ok=True)
        (args.outputs_dir / "config_json").write_text(config.model_dump_json())
        (args.outputs_dir / "parent_run_id").write_text(run_id)
        return 0
    from pipelines.layout import RunLayout

    ctx = StepContext.from_json(args.config_json, args.parent_run_id)
    out = run_step(args.step, RunLayout(args.run_dir), ctx, arm=None if args.arm in (None, "none") else args.arm)
    if args.step == "report":
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
