"""Each pipeline step as a KFP v2 component: a plain typed function first, a container step second.

Every body imports the plain stage function from `components/` and calls it with the stage config
that `pipelines.stage_configs` derives from the run's PipelineConfig (passed as JSON). Artifacts are
typed: Dataset for task and trajectory stores, Model for checkpoints, Metrics for each stage's
numbers. The image is a parameter twice over: `base_image` here (the default, compile time) and
`task.set_container_image(image)` in the DAG (a pipeline parameter, run time). The image already
contains kfp and this project, so nothing is pip-installed when a step starts.
(No `from __future__ import annotations` here: KFP reads the annotations as real types.)
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from pipelines.config import DEFAULT_IMAGE


def _component(func):
    return dsl.component(func, base_image=DEFAULT_IMAGE, install_kfp_package=False)


@_component
def start_run(
    preset: str,
    recipe: str,
    n_train_tasks: int,
    n_heldout_tasks: int,
    sft_steps: int,
    rl_steps: int,
    seed: int,
    sandbox_url: str,
    mlflow_uri: str,
    experiment: str,
    overrides_json: str,
    kfp_run_id: str,
    run_label: str,
) -> NamedTuple("RunStart", [("config_json", str), ("parent_run_id", str)]):
    """Validate the run's PipelineConfig and open the MLflow parent run (left RUNNING)."""
    from collections import namedtuple

    from pipelines.steps import start_pipeline

    config, run_id = start_pipeline(
        preset=preset, recipe=recipe, n_train_tasks=n_train_tasks, n_heldout_tasks=n_heldout_tasks,
        sft_steps=sft_steps, rl_steps=rl_steps, seed=seed, sandbox_url=sandbox_url,
        mlflow_uri=mlflow_uri, experiment=experiment, overrides_json=overrides_json,
        tags={"orchard.kfp_run_id": kfp_run_id, "orchard.run_label": run_label},
    )
    return namedtuple("RunStart", ["config_json", "parent_run_id"])(config.model_dump_json(), run_id)


@_component
def provision(config_json: str, parent_run_id: str, tasks: Output[Dataset], metrics: Output[Metrics]) -> str:
    """Generate (or import) the task suite: train and held-out splits."""
    from components.provision import provision_environment
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    result = provision_environment(ctx.stage_config("provision"), tasks.path, tracking=ctx.tracking("provision"))
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def init_policy(config_json: str, parent_run_id: str, model: Output[Model]) -> str:
    """Build the untrained tiny policy (the common start of SFT and the 'untrained' eval arm)."""
    import json

    from pipelines.steps import StepContext, tracked_init_policy

    ctx = StepContext.from_json(config_json, parent_run_id)
    return json.dumps(tracked_init_policy(ctx, model.path))


@_component
def distill(
    config_json: str, parent_run_id: str, tasks: Input[Dataset], trajectories: Output[Dataset], metrics: Output[Metrics]
) -> str:
    """Run the teacher over the training tasks in sandboxes; verified trajectories to the store."""
    from components.distill import distill as run_distill
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    work = ctx.work_dir("trajectories", trajectories.path)
    result = run_distill(ctx.stage_config("distill"), tasks.path, work, tracking=ctx.tracking("distill"))
    ctx.publish(work, trajectories.path)
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def credit(
    config_json: str,
    parent_run_id: str,
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    credited: Output[Dataset],
    metrics: Output[Metrics],
) -> str:
    """Label per-step credit on the teacher trajectories (Monte-Carlo by default)."""
    from components.credit import label_credit
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    work = ctx.work_dir("credited", credited.path)
    result = label_credit(ctx.stage_config("credit"), trajectories.path, tasks.path, work, tracking=ctx.tracking("credit"))
    ctx.publish(work, credited.path)
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def sft(
    config_json: str,
    parent_run_id: str,
    credited: Input[Dataset],
    base_model: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
) -> str:
    """Supervised fine-tuning on credited segments, from the untrained policy."""
    from components.sft import train_sft
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    result = train_sft(
        ctx.stage_config("sft"), credited.path, model.path, base_model_dir=base_model.path, tracking=ctx.tracking("sft")
    )
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def rl(
    config_json: str,
    parent_run_id: str,
    tasks: Input[Dataset],
    sft_model: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
) -> str:
    """Adaptive RL (Balanced Adaptive Rollout) from the SFT checkpoint."""
    from components.rl import train_rl
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    result = train_rl(ctx.stage_config("rl"), tasks.path, sft_model.path, model.path, tracking=ctx.tracking("rl"))
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def evaluate(
    config_json: str,
    parent_run_id: str,
    arm: str,
    tasks: Input[Dataset],
    model: Input[Model],
    results: Output[Dataset],
    metrics: Output[Metrics],
) -> str:
    """Evaluate one policy (arm: untrained, sft, rl) on the held-out tasks."""
    from components.evaluate import evaluate as run_evaluate
    from pipelines.steps import StepContext

    ctx = StepContext.from_json(config_json, parent_run_id)
    result = run_evaluate(
        ctx.stage_config("evaluate"), tasks.path, model.path, results.path, tracking=ctx.tracking(f"evaluate-{arm}")
    )
    ctx.to_kfp_metrics(result, metrics)
    return result.model_dump_json()


@_component
def report(
    config_json: str,
    parent_run_id: str,
    distill_result: str,
    untrained_result: str,
    sft_result: str,
    rl_result: str,
    final_model: Input[Model],
    table: Output[Markdown],
) -> str:
    """The results table; registers the final model and closes the MLflow parent run."""
    from pipelines.steps import StepContext, finish_pipeline

    ctx = StepContext.from_json(config_json, parent_run_id)
    _, markdown = finish_pipeline(
        ctx,
        distill_result=distill_result,
        eval_results={"untrained": untrained_result, "sft": sft_result, "rl": rl_result},
        final_model_dir=final_model.path,
    )
    with open(table.path, "w") as f:
        f.write(markdown)
    return markdown


@_component
def close_run(mlflow_uri: str, experiment: str, kfp_run_id: str, status: dsl.PipelineTaskFinalStatus):
    """Exit handler: mark the MLflow parent FAILED if the pipeline died before its report step.

    An exit task may not depend on other tasks, so it finds the parent run by the KFP run id
    that `start_run` tagged it with.
    """
    from pipelines.steps import close_pipeline_by_tag

    close_pipeline_by_tag(mlflow_uri, experiment, "orchard.kfp_run_id", kfp_run_id,
                          "FINISHED" if status.state == "SUCCEEDED" else "FAILED")
