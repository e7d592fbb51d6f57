"""The orchard training pipeline as a KFP v2 DAG, built from the stage table (`pipelines/stages.py`).

    start -> provision, init-policy -> distill -> credit -> sft -> rl -> evaluate-* -> promote -> report

The pipeline's parameters are `pipelines/parameters.py` (one list for KFP and Argo). Kubernetes
settings (kfp-kubernetes, the YAML's second document), all from pipeline parameters: the GPU rows ask
for one GPU with the GPU nodeSelector and tolerations; a row whose config asks for more than one process
(`Stage.launch`: `sft.launch`, `rl.launch` of the compiled config) is a launcher step that runs it as a
PyTorchJob (`pipelines/jobs/launcher.py`) over a run directory on the PVC; the resumable rows write their stores on a
PVC that the `run-store` step creates (`pipelines/kfp/run_store.py`: size a parameter, storage class and access mode
from the ClusterConfig, no class meaning the cluster's default) and DeletePVC removes; the light steps (start,
report, close-run, launchers) and the stages request `PipelineConfig.resources` (memory: request and limit); the rows
with `store_volume` (provision, accumulate) mount the
persistent data store's PVC (parameter `data_store_claim`, at `ClusterConfig.data_store_mount`), which
the manifests create and every run shares; the sandbox token and the endpoint key come from Secrets as
environment variables, never as parameters. The ServiceAccount is a property of a KFP *run*, not of
a task (kfp-kubernetes has no per-task setting): `orchard schedule` and docs/pipelines/cluster-quickstart.md's `kfp
run create`
pass `ClusterConfig.service_account`.
"""

import inspect
from pathlib import Path

from kfp import compiler, dsl, kubernetes

from pipelines.kfp import components as c
from pipelines import stages
from pipelines.cluster import PIPELINE_POD_LABELS, STORE_MOUNT, ClusterConfig
from pipelines.config import PipelineConfig
from pipelines.parameters import Param, pipeline_parameters

PIPELINE_NAME = "orchard-training"


def _step(task: dsl.PipelineTask, p: dict, config: PipelineConfig) -> dsl.PipelineTask:
    """A light step (start, report, close-run, a job launcher): the CPU image and the small requests."""
    memory = config.resources.step_memory
    return (
        _labelled(task)
        .set_container_image(p["image"])
        .set_cpu_request(config.resources.step_cpu)
        .set_memory_request(memory)
        .set_memory_limit(memory)
    )


def _labelled(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """The pipeline-pod labels: manifests/base/service-network.yaml admits these pods to MLflow and the sandbox API."""
    for key, value in PIPELINE_POD_LABELS.items():
        kubernetes.add_pod_label(task, key, value)
    return task


def _place(
    task: dsl.PipelineTask,
    stage: stages.Stage,
    p: dict,
    cluster: ClusterConfig,
    config: PipelineConfig,
    job: bool = False,
) -> dsl.PipelineTask:
    """Image, secrets, resources, retries and timeout of one stage's task (`job`: its PyTorchJob launcher)."""
    gpu = stage.wants_gpu(config) and not job  # a launcher only waits; its job's pods get the GPUs
    if job:
        _step(task, p, config)
    else:
        cpu, memory = stage.requests(config)
        _labelled(task).set_container_image(p["gpu_image"] if gpu else p["image"])
        task.set_cpu_request(cpu).set_memory_request(memory).set_memory_limit(memory)  # the limit: as in Argo
    kubernetes.use_secret_as_env(
        task,
        secret_name=p["sandbox_token_secret"],
        secret_key_to_env={cluster.sandbox_token_key: "ORCHARD_SANDBOX_TOKEN"},
    )
    kubernetes.use_secret_as_env(
        task,
        secret_name=p["endpoint_secret"],
        secret_key_to_env={cluster.endpoint_key: "OPENAI_API_KEY"},
        optional=True,
    )
    # a launcher outlives its job's own deadline by the time to stage artifacts and start the pods
    kubernetes.set_timeout(task, (stage.timeout_seconds or cluster.stage_timeout_seconds) + (1800 if job else 0))
    if not stage.cache:
        task.set_caching_options(False)
    if stage.retries:
        task.set_retry(num_retries=stage.retries, backoff_duration="30s")
    if gpu:
        task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
        kubernetes.add_node_selector_json(task, p["gpu_node_selector"])
        kubernetes.add_toleration_json(task, p["gpu_tolerations"])
    return task


def build_pipeline(
    cluster: ClusterConfig | None = None, defaults: PipelineConfig | None = None, *, for_cluster: bool = True
):
    """The pipeline function; parameter defaults from a PipelineConfig and a ClusterConfig.

    `for_cluster=False` leaves out what only a cluster can run (the PVC create/delete steps and the
    exit handler), for `kfp.local`; kfp-kubernetes settings are ignored there anyway.
    """
    cluster = cluster or ClusterConfig()
    config_defaults = defaults or PipelineConfig.preset_config("demo")  # also decides which stages are PyTorchJobs
    params: list[Param] = pipeline_parameters(config_defaults, cluster)
    params.append(Param("run_label", "", "A label for finding this run's MLflow parent run (tests)."))
    names = [x.name for x in params]

    table = list(stages.STAGES)
    components, launchers, report = c.stage_components(table), c.launcher_components(table), c.report_component(table)

    def dag(p: dict, config, run_id) -> None:
        store = None
        if for_cluster:  # resumable stores live on a PVC, so a retried pod resumes from its shards
            store = _step(
                c.run_store(
                    kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    size=p["volume_size"],
                    access_mode=cluster.access_mode,
                    storage_class=cluster.storage_class or "",
                ),
                p,
                config_defaults,
            ).set_caching_options(False)
        tasks: dict[str, dsl.PipelineTask] = {}
        for stage in table:
            args = {arg: tasks[ref.split(".")[0]].outputs[ref.split(".")[1]] for arg, ref in stage.inputs.items()}
            launch = stage.launch(config_defaults)
            if launch is not None:  # more than one process: a launcher step runs the stage as a PyTorchJob
                if store is None:
                    raise ValueError(
                        f"stage {stage.name} asks for {launch.processes} processes ({stage.config}.launch), "
                        "a PyTorchJob, which needs a cluster; kfp.local runs one process per stage"
                    )
                task = launchers[stage.name](
                    config_json=config,
                    parent_run_id=run_id,
                    **args,
                    run_store=store.output,
                    job_image=p["gpu_image"] if stage.wants_gpu(config_defaults) else p["image"],
                    nproc_per_node=launch.nproc_per_node,
                    workers=launch.workers,
                    timeout_seconds=stage.timeout_seconds or cluster.stage_timeout_seconds,
                    sandbox_token_secret=p["sandbox_token_secret"],
                    endpoint_secret=p["endpoint_secret"],
                    secret_keys={"sandbox_token_key": cluster.sandbox_token_key, "endpoint_key": cluster.endpoint_key},
                    gpu_node_selector=p["gpu_node_selector"],
                    gpu_tolerations=p["gpu_tolerations"],
                    pod_security_context=cluster.pod_security_context(),
                )
                tasks[stage.name] = _place(task, stage, p, cluster, config_defaults, job=True)
                kubernetes.mount_pvc(task, pvc_name=store.output, mount_path=STORE_MOUNT)
                continue
            task = components[stage.name](config_json=config, parent_run_id=run_id, **args)
            tasks[stage.name] = _place(task, stage, p, cluster, config_defaults)
            if store is not None and stage.resumable:
                kubernetes.mount_pvc(task, pvc_name=store.output, mount_path=STORE_MOUNT)
                task.set_env_variable("ORCHARD_STORE_MOUNT", STORE_MOUNT)
            if for_cluster and stage.store_volume:  # the persistent data store, the same PVC in every run
                kubernetes.mount_pvc(task, pvc_name=p["data_store_claim"], mount_path=cluster.data_store_mount)
        if store is not None:
            kubernetes.DeletePVC(pvc_name=store.output).after(
                *[tasks[s.name] for s in table if s.resumable or s.launch(config_defaults)]
            )
        results = {c.function_name(s.name): tasks[s.name].outputs["Output"] for s in table}
        _step(report(config_json=config, parent_run_id=run_id, **results), p, config_defaults)

    def orchard_training(*values):
        p = dict(zip(names, values))

        def body():
            begin = c.start(
                **{x.name: p[x.name] for x in params if x.start},
                kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                run_label=p["run_label"],
            )
            _step(begin, p, config_defaults).set_caching_options(False)  # a fresh parent run every time
            dag(p, begin.outputs["config_json"], begin.outputs["parent_run_id"])

        if for_cluster:
            closer = c.close_run(
                mlflow_uri=p["mlflow_uri"], experiment=p["experiment"], kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
            )
            _step(closer, p, config_defaults)
            with dsl.ExitHandler(closer, name="mlflow-parent-run"):
                body()
        else:
            body()

    # KFP reads the parameters from the signature: build it from the one parameter list. (inspect honours a
    # function's __signature__, which typeshed does not declare on functions.)
    orchard_training.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                x.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=x.default, annotation=x.annotation
            )
            for x in params
        ]
    )
    orchard_training.__annotations__ = {x.name: x.annotation for x in params}
    orchard_training.__doc__ = (
        "Distill -> credit -> SFT -> adaptive RL -> evaluate, on one sandbox layer.\n\n"
        + "\n".join(f"{x.name}: {x.description}" for x in params)
    )
    return dsl.pipeline(
        name=PIPELINE_NAME, description="Distill -> credit -> SFT -> adaptive RL -> evaluate, on one sandbox layer."
    )(orchard_training)


def compile_pipeline(
    out_path: str | Path, cluster: ClusterConfig | None = None, defaults: PipelineConfig | None = None
) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(cluster, defaults), package_path=str(out))
    type_integer_defaults(out)
    return out


def type_integer_defaults(path: Path) -> None:
    """Integer parameters' defaults as integers in a compiled KFP file (`seed: 0`, not `0.0`).

    KFP keeps every default as a protobuf Value, whose only number is a double, so its YAML (and the header
    comments written from it) shows `[Default: 0.0]` for an `int` parameter. The file is rewritten the way the
    compiler writes it (the comments, then `yaml.dump_all(..., sort_keys=True)`, multi-line strings as `|`
    blocks), whatever else is imported; KFP reads an integral number back into the same Value."""
    import re

    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)

    Dumper.add_representer(str, block)

    lines = path.read_text().splitlines(keepends=True)
    split = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    header = [
        re.sub(r"^(#\s+\w+: int \[Default: -?\d+)\.0\]$", r"\1]", line.rstrip("\n")) + "\n" for line in lines[:split]
    ]
    docs = list(yaml.safe_load_all("".join(lines[split:])))

    def walk(node):
        if isinstance(node, dict):
            value = node.get("defaultValue")
            if node.get("parameterType") == "NUMBER_INTEGER" and isinstance(value, float) and value.is_integer():
                node["defaultValue"] = int(value)
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(docs)
    path.write_text("".join(header) + yaml.dump_all(docs, Dumper=Dumper, sort_keys=True))
