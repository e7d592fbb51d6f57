"""The KFP v2 component signatures, one per row of the stage table, each body one shared entry point.

KFP reads a component's interface from annotations, so the signatures are written here (typed
artifacts: Dataset for task and trajectory stores, Model for checkpoints, Metrics for each stage's
numbers); what runs is always `pipelines.steps.kfp_entry(<stage>, ...)`, i.e. `run_stage`, the same
code as the local runner and the Argo steps. `tests/pipelines/test_stage_table.py` checks that every
signature has exactly its row's inputs and outputs. The image is set per task from a pipeline
parameter; it already contains kfp and this project, so nothing is pip-installed when a step starts.
(No `from __future__ import annotations` here: KFP reads the annotations as real types.)
"""

import copy
from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from pipelines.cluster import image_ref

DEFAULT_IMAGE = image_ref("stage-runtime")


def _component(func):
    return dsl.component(func, base_image=DEFAULT_IMAGE, install_kfp_package=False)


@_component
def start(preset: str, recipe: str, seed: int, overrides_json: str, experiment: str, sandbox_url: str,
          mlflow_uri: str, start_from: str, promotion_margin: Optional[float], train_tasks: int, data_store: str,
          window_runs: int, kfp_run_id: str, run_label: str) -> NamedTuple("RunStart", [("config_json", str), ("parent_run_id", str)]):
    """Validate the run's PipelineConfig and open the MLflow parent run (left RUNNING)."""
    from collections import namedtuple

    from pipelines.steps import start_pipeline

    config, run_id = start_pipeline(preset=preset, recipe=recipe, seed=seed, sandbox_url=sandbox_url,
                                    mlflow_uri=mlflow_uri, experiment=experiment, overrides_json=overrides_json,
                                    start_from=start_from, promotion_margin=promotion_margin, train_tasks=train_tasks,
                                    data_store=data_store, window_runs=window_runs,
                                    tags={"orchard.runner": "kfp", "orchard.kfp_run_id": kfp_run_id,
                                          "orchard.run_label": run_label})
    return namedtuple("RunStart", ["config_json", "parent_run_id"])(config.model_dump_json(), run_id)


@_component
def provision(config_json: str, parent_run_id: str, tasks: Output[Dataset], metrics: Output[Metrics]) -> str:
    """Generate (or import) the task suite: train and held-out splits."""
    from pipelines.steps import kfp_entry

    return kfp_entry("provision", config_json, parent_run_id, {}, {"tasks": tasks}, metrics)


@_component
def init_policy(config_json: str, parent_run_id: str, model: Output[Model], metrics: Output[Metrics]) -> str:
    """Build the untrained policy (the common start of SFT and the 'untrained' eval arm)."""
    from pipelines.steps import kfp_entry

    return kfp_entry("init-policy", config_json, parent_run_id, {}, {"model": model}, metrics)


@_component
def distill(config_json: str, parent_run_id: str, tasks: Input[Dataset], trajectories: Output[Dataset],
            metrics: Output[Metrics]) -> str:
    """Run the teacher over the training tasks in sandboxes; verified trajectories to the store."""
    from pipelines.steps import kfp_entry

    return kfp_entry("distill", config_json, parent_run_id, {"tasks": tasks}, {"trajectories": trajectories}, metrics)


@_component
def credit(config_json: str, parent_run_id: str, tasks: Input[Dataset], trajectories: Input[Dataset],
           credited: Output[Dataset], metrics: Output[Metrics]) -> str:
    """Label per-step credit on the teacher trajectories (Monte-Carlo by default)."""
    from pipelines.steps import kfp_entry

    return kfp_entry("credit", config_json, parent_run_id, {"tasks": tasks, "trajectories": trajectories},
                     {"credited": credited}, metrics)


@_component
def accumulate(config_json: str, parent_run_id: str, tasks: Input[Dataset], credited: Input[Dataset],
               training: Output[Dataset], metrics: Output[Metrics]) -> str:
    """Add the run's credited trajectories to the data store; the training set is the store's shards."""
    from pipelines.steps import kfp_entry

    return kfp_entry("accumulate", config_json, parent_run_id, {"tasks": tasks, "credited": credited},
                     {"training": training}, metrics)


@_component
def sft(config_json: str, parent_run_id: str, credited: Input[Dataset], base_model: Input[Model],
        model: Output[Model], metrics: Output[Metrics]) -> str:
    """Supervised fine-tuning on credited segments, from the untrained policy."""
    from pipelines.steps import kfp_entry

    return kfp_entry("sft", config_json, parent_run_id, {"credited": credited, "base_model": base_model},
                     {"model": model}, metrics)


@_component
def rl(config_json: str, parent_run_id: str, tasks: Input[Dataset], sft_model: Input[Model], model: Output[Model],
       metrics: Output[Metrics]) -> str:
    """Adaptive RL (Balanced Adaptive Rollout) from the SFT checkpoint."""
    from pipelines.steps import kfp_entry

    return kfp_entry("rl", config_json, parent_run_id, {"tasks": tasks, "sft_model": sft_model}, {"model": model},
                     metrics)


@_component
def sft_job(config_json: str, parent_run_id: str, credited: Input[Dataset], base_model: Input[Model],
            model: Output[Model], metrics: Output[Metrics], run_store: str, job_image: str, nproc_per_node: int,
            workers: int, timeout_seconds: int, sandbox_token_secret: str, endpoint_secret: str, secret_keys: dict,
            gpu_node_selector: dict, gpu_tolerations: list, pod_security_context: dict) -> str:
    """The sft stage as a PyTorchJob of (1 + workers) nodes x nproc_per_node processes (pipelines/launcher.py)."""
    args = dict(locals())  # the parameters, taken before the import below adds a name
    from pipelines.launcher import kfp_job_step

    return kfp_job_step("sft", **args)


@_component
def rl_job(config_json: str, parent_run_id: str, tasks: Input[Dataset], sft_model: Input[Model], model: Output[Model],
           metrics: Output[Metrics], run_store: str, job_image: str, nproc_per_node: int, workers: int,
           timeout_seconds: int, sandbox_token_secret: str, endpoint_secret: str, secret_keys: dict,
           gpu_node_selector: dict, gpu_tolerations: list, pod_security_context: dict) -> str:
    """The rl stage (TRL GRPOTrainer) as a PyTorchJob of (1 + workers) nodes x nproc_per_node processes."""
    args = dict(locals())  # the parameters, taken before the import below adds a name
    from pipelines.launcher import kfp_job_step

    return kfp_job_step("rl", **args)


@_component
def evaluate_teacher(config_json: str, parent_run_id: str, tasks: Input[Dataset], results: Output[Dataset],
                     metrics: Output[Metrics]) -> str:
    """Evaluate the reference policy (scripted teacher or an endpoint) on the held-out tasks."""
    from pipelines.steps import kfp_entry

    return kfp_entry("evaluate-teacher", config_json, parent_run_id, {"tasks": tasks}, {"results": results}, metrics)


@_component
def evaluate(stage: str, config_json: str, parent_run_id: str, tasks: Input[Dataset], model: Input[Model],
             results: Output[Dataset], metrics: Output[Metrics]) -> str:
    """Evaluate one trained or untrained policy on the held-out tasks (stage: evaluate-<arm>)."""
    from pipelines.steps import kfp_entry

    return kfp_entry(stage, config_json, parent_run_id, {"tasks": tasks, "model": model}, {"results": results},
                     metrics)


@_component
def promote(config_json: str, parent_run_id: str, tasks: Input[Dataset], base_model: Input[Model],
            sft_model: Input[Model],
            rl_model: Input[Model], sft_results: Input[Dataset], rl_results: Input[Dataset],
            base_results: Input[Dataset], credited: Input[Dataset], results: Output[Dataset],
            metrics: Output[Metrics]) -> str:
    """The promotion gate: the final trained model vs the registry's champion; registers it only if promoted."""
    from pipelines.steps import kfp_entry

    return kfp_entry("promote", config_json, parent_run_id,
                     {"tasks": tasks, "base_model": base_model, "sft_model": sft_model, "rl_model": rl_model, "sft_results": sft_results,
                      "rl_results": rl_results, "base_results": base_results, "credited": credited},
                     {"results": results}, metrics)


@_component
def report(config_json: str, parent_run_id: str, provision: str, init_policy: str, distill: str, credit: str,
           accumulate: str, sft: str, rl: str, evaluate_teacher: str, evaluate_untrained: str, evaluate_sft: str, evaluate_rl: str,
           promote: str, table: Output[Markdown]) -> str:
    """The results table (with the gate's decision); closes the MLflow parent run."""
    from pipelines.steps import StepContext, finish_pipeline

    results = {"provision": provision, "init-policy": init_policy, "distill": distill, "credit": credit,
               "accumulate": accumulate, "sft": sft,
               "rl": rl, "evaluate-teacher": evaluate_teacher, "evaluate-untrained": evaluate_untrained,
               "evaluate-sft": evaluate_sft, "evaluate-rl": evaluate_rl, "promote": promote}
    _, markdown = finish_pipeline(StepContext.from_json(config_json, parent_run_id), results)
    with open(table.path, "w") as f:
        f.write(markdown)
    return markdown


@_component
def run_store(kfp_run_id: str, size: str, access_mode: str, storage_class: str) -> str:
    """Create the run's store PVC; storage_class '' leaves the class out (the cluster's default; pipelines/run_store.py)."""
    from pipelines.run_store import create_run_store

    return create_run_store(kfp_run_id, size=size, access_mode=access_mode, storage_class=storage_class or None)


@_component
def close_run(mlflow_uri: str, experiment: str, kfp_run_id: str, status: dsl.PipelineTaskFinalStatus):
    """Exit handler: mark the MLflow parent FAILED if the pipeline died before its report step.

    An exit task may not depend on other tasks, so it finds the parent run by the KFP run id
    that `start` tagged it with.
    """
    from pipelines.steps import close_pipeline_by_tag

    close_pipeline_by_tag(mlflow_uri, experiment, "orchard.kfp_run_id", kfp_run_id,
                          "FINISHED" if status.state == "SUCCEEDED" else "FAILED")


def named(component, name: str):
    """The same component under another name: KFP names a task after its component."""
    renamed = copy.deepcopy(component)
    renamed.component_spec.name = name
    renamed.name = name
    return renamed


# Stage name -> component (the evaluate arms share one body under their own task names).
BY_STAGE = {
    "provision": provision, "init-policy": init_policy, "distill": distill, "credit": credit,
    "accumulate": accumulate, "sft": sft, "rl": rl,
    "evaluate-teacher": evaluate_teacher, "promote": promote,
    **{f"evaluate-{arm}": named(evaluate, f"evaluate-{arm}") for arm in ("untrained", "sft", "rl")},
}
# Stage name -> its launcher component, for the rows that may run as a PyTorchJob (Stage.distributed).
JOB_BY_STAGE = {"sft": named(sft_job, "sft"), "rl": named(rl_job, "rl")}  # task names are stage names
