"""The KFP v2 components: one per row of the stage table, generated from the row, plus the steps around them.

KFP reads a component's interface from annotations and embeds its function's source in the compiled YAML, so
each stage's component is a function written from its row (`stage_source`): typed artifacts (Dataset for task
and trajectory stores, Model for checkpoints, Metrics for each stage's numbers) named as the row names its
inputs and outputs, and a body that is always `pipelines.steps.kfp_entry(<stage>, ...)`, i.e. `run_stage`,
the same code as the local runner and the Argo steps. A row that may run in several processes
(`Stage.distributed`) also gets a launcher component (the same artifacts plus the PyTorchJob's launch and
placement; `pipelines/launcher.py`), and the report step takes every row's result. Adding a row to
`pipelines/stages.py` is all a new stage needs here. The image is set per task from a pipeline parameter; it
already contains kfp and this project, so nothing is pip-installed when a step starts. (No
`from __future__ import annotations` here: KFP reads the annotations as real types.)
"""

import linecache
from typing import Callable, NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from pipelines import stages
from pipelines.cluster import image_ref

DEFAULT_IMAGE = image_ref("stage-runtime")


def _component(func):
    return dsl.component(func, base_image=DEFAULT_IMAGE, install_kfp_package=False)


@_component
def start(
    preset: str,
    recipe: str,
    seed: int,
    overrides_json: str,
    experiment: str,
    sandbox_url: str,
    mlflow_uri: str,
    start_from: str,
    promotion_margin: Optional[float],
    train_tasks: int,
    data_store: str,
    window_runs: int,
    kfp_run_id: str,
    run_label: str,
) -> NamedTuple("RunStart", [("config_json", str), ("parent_run_id", str)]):
    """Validate the run's PipelineConfig and open the MLflow parent run (left RUNNING)."""
    from collections import namedtuple

    from pipelines.steps import start_pipeline

    config, run_id = start_pipeline(
        preset=preset,
        recipe=recipe,
        seed=seed,
        sandbox_url=sandbox_url,
        mlflow_uri=mlflow_uri,
        experiment=experiment,
        overrides_json=overrides_json,
        start_from=start_from,
        promotion_margin=promotion_margin,
        train_tasks=train_tasks,
        data_store=data_store,
        window_runs=window_runs,
        tags={"orchard.runner": "kfp", "orchard.kfp_run_id": kfp_run_id, "orchard.run_label": run_label},
    )
    return namedtuple("RunStart", ["config_json", "parent_run_id"])(config.model_dump_json(), run_id)


@_component
def run_store(kfp_run_id: str, size: str, access_mode: str, storage_class: str) -> str:
    """Create the run's store PVC; storage_class '' leaves the class out (the cluster's default;
    pipelines/run_store.py)."""
    from pipelines.run_store import create_run_store

    return create_run_store(kfp_run_id, size=size, access_mode=access_mode, storage_class=storage_class or None)


@_component
def close_run(mlflow_uri: str, experiment: str, kfp_run_id: str, status: dsl.PipelineTaskFinalStatus):
    """Exit handler: mark the MLflow parent FAILED if the pipeline died before its report step.

    An exit task may not depend on other tasks, so it finds the parent run by the KFP run id
    that `start` tagged it with.
    """
    from pipelines.steps import close_pipeline_by_tag

    close_pipeline_by_tag(
        mlflow_uri,
        experiment,
        "orchard.kfp_run_id",
        kfp_run_id,
        "FINISHED" if status.state == "SUCCEEDED" else "FAILED",
    )


# --- Generated from the stage table -------------------------------------------------------------------------
_ARTIFACT = {"dataset": "Dataset", "model": "Model"}
# What a launcher step adds to its stage's artifacts: the PyTorchJob's launch and placement (pipelines/launcher.py).
LAUNCHER_PARAMETERS = {
    "run_store": "str",
    "job_image": "str",
    "nproc_per_node": "int",
    "workers": "int",
    "timeout_seconds": "int",
    "sandbox_token_secret": "str",
    "endpoint_secret": "str",
    "secret_keys": "dict",
    "gpu_node_selector": "dict",
    "gpu_tolerations": "list",
    "pod_security_context": "dict",
}
RESERVED = {"config_json", "parent_run_id", "metrics", *LAUNCHER_PARAMETERS}  # no row may name an artifact so


def function_name(stage: str) -> str:
    """A stage's task name as a Python name (KFP names a component's task after its function: back again)."""
    return stage.replace("-", "_")


def _artifacts(stage: stages.Stage, table: list[stages.Stage]) -> list[tuple[str, str]]:
    """(parameter, annotation) of the row's inputs (the producers' kinds) and outputs, then its Metrics."""
    kinds = {f"{s.name}.{out}": kind for s in table for out, kind in s.outputs.items()}
    clash = (set(stage.inputs) | set(stage.outputs)) & RESERVED
    if clash:
        raise ValueError(
            f"stage {stage.name}: artifact name(s) {sorted(clash)} are reserved for the component's own "
            "parameters; rename them in its row (pipelines/stages.py)"
        )
    return (
        [(arg, f"Input[{_ARTIFACT[kinds[ref]]}]") for arg, ref in stage.inputs.items()]
        + [(out, f"Output[{_ARTIFACT[kind]}]") for out, kind in stage.outputs.items()]
        + [("metrics", "Output[Metrics]")]
    )


def _source(name: str, params: list[tuple[str, str]], doc: str, body: list[str]) -> str:
    signature = ",\n".join(f"    {p}: {a}" for p, a in params)
    lines = [f"def {name}(", signature + ",", ") -> str:", f'    """{doc}"""', *(f"    {b}" if b else "" for b in body)]
    return "\n".join(lines) + "\n"


def _summary(stage: stages.Stage) -> str:
    return " ".join((stage.run.__doc__ or f"The {stage.name} stage.").split()).replace('"""', "'''")


def stage_source(stage: stages.Stage, table: list[stages.Stage]) -> str:
    """The component function of one row, as source: its artifacts typed, its body the shared entry point."""
    artifacts = _artifacts(stage, table)
    ins = ", ".join(f'"{a}": {a}' for a in stage.inputs)
    outs = ", ".join(f'"{o}": {o}' for o in stage.outputs)
    return _source(
        function_name(stage.name),
        [("config_json", "str"), ("parent_run_id", "str"), *artifacts],
        _summary(stage),
        [
            "from pipelines.steps import kfp_entry",
            "",
            f"return kfp_entry({stage.name!r}, config_json, parent_run_id, {{{ins}}}, {{{outs}}}, metrics)",
        ],
    )


def launcher_source(stage: stages.Stage, table: list[stages.Stage]) -> str:
    """The launcher component of a distributed row: runs the stage as a PyTorchJob and waits for it."""
    params = [("config_json", "str"), ("parent_run_id", "str"), *_artifacts(stage, table), *LAUNCHER_PARAMETERS.items()]
    doc = (
        f"The {stage.name} stage as a PyTorchJob of (1 + workers) nodes x nproc_per_node processes "
        "(pipelines/launcher.py)."
    )
    return _source(
        f"{function_name(stage.name)}_job",
        params,
        doc,
        [
            "args = dict(locals())  # the parameters, taken before the import below adds a name",
            "from pipelines.launcher import kfp_job_step",
            "",
            f"return kfp_job_step({stage.name!r}, **args)",
        ],
    )


def report_source(table: list[stages.Stage]) -> str:
    """The report step: every row's result (the JSON string its task returns) by stage name."""
    params = [
        ("config_json", "str"),
        ("parent_run_id", "str"),
        *((function_name(s.name), "str") for s in table),
        ("table", "Output[Markdown]"),
    ]
    results = ", ".join(f'"{s.name}": {function_name(s.name)}' for s in table)
    return _source(
        "report",
        params,
        "The results table (with the gate's decision); closes the MLflow parent run.",
        [
            "from pipelines.steps import StepContext, finish_pipeline",
            "",
            f"results = {{{results}}}",
            "_, markdown = finish_pipeline(StepContext.from_json(config_json, parent_run_id), results)",
            'with open(table.path, "w") as f:',
            "    f.write(markdown)",
            "return markdown",
        ],
    )


def _compiled(source: str, key: str) -> Callable:
    """The function `source` defines, with its source findable by `inspect.getsource` (which KFP embeds)."""
    filename = f"<orchard kfp component {key}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {
        "__name__": __name__,
        "Input": Input,
        "Output": Output,
        "Dataset": Dataset,
        "Model": Model,
        "Metrics": Metrics,
        "Markdown": Markdown,
    }
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own text, written from the stage table
    (func,) = [
        v
        for k, v in namespace.items()
        if callable(v) and getattr(v, "__code__", None) and v.__code__.co_filename == filename
    ]
    return func


def stage_components(table: list[stages.Stage] | None = None) -> dict[str, Callable]:
    """Stage name -> its KFP component, for every row of `table` (default: the stage table)."""
    table = stages.STAGES if table is None else table
    return {s.name: _component(_compiled(stage_source(s, table), s.name)) for s in table}


def launcher_components(table: list[stages.Stage] | None = None) -> dict[str, Callable]:
    """Stage name -> its PyTorchJob launcher component, for the rows that may run distributed."""
    table = stages.STAGES if table is None else table
    launchers = {}
    for s in table:
        if s.distributed:  # `<stage>_job`, the function KFP runs, under the task name of its stage
            launcher = _component(_compiled(launcher_source(s, table), f"{s.name} launcher"))
            launcher.component_spec.name = launcher.name = s.name
            launchers[s.name] = launcher
    return launchers


def report_component(table: list[stages.Stage] | None = None) -> Callable:
    table = stages.STAGES if table is None else table
    return _component(_compiled(report_source(table), "report"))
