"""The same DAG for Argo Workflows, built with hera from the stage table: a WorkflowTemplate + a CronWorkflow.

Where KFP passes artifacts, Argo steps share one volume per workflow (a volumeClaimTemplate: storage
class and access mode from the ClusterConfig it is compiled with, no class meaning the cluster's default;
size a workflow parameter). A ReadWriteOnce volume can be attached to one node at a time, so with it the
DAG runs one step at a time (`parallelism: 1`: parallel branches on two nodes would fail with
Multi-Attach); ReadWriteMany lets them run at once. Every pod runs as the stage image's user with
fsGroup = its uid, so fresh volumes are writable. The run directory `/data/<workflow
name>` holds the layout of `pipelines/layout.py`, and each stage is `python -m pipelines.steps run
<stage>` in the project image, as its own template (resources, GPU placement, retries, deadline from
its row); the rows with `store_volume` also mount the persistent data store's PVC (workflow parameter
`data_store_claim`), which outlives the run. The start step validates the PipelineConfig and opens the
MLflow parent run; its output parameters reach every stage through `get_parameter`, and the
dependencies are the rows' inputs (`>>`).
A row whose config asks for more than one process (`Stage.launch`) is a `resource` template instead:
it creates a PyTorchJob (`pipelines/jobs/pytorchjob.py`) whose pods mount the same volume and run the same
step under torchrun, and succeeds or fails with the job's Master replica.
"""

from __future__ import annotations

from hera.workflows import (
    DAG,
    Container,
    CronWorkflow,
    Parameter,
    Resource,
    Resources,
    RetryStrategy,
    SecretEnv,
    Task,
    WorkflowTemplate,
)
from hera.workflows import models as m
from hera.workflows.models import ValueFrom, WorkflowTemplateRef

from pipelines import stages

from pipelines.jobs import pytorchjob
from pipelines.cluster import PIPELINE_POD_LABELS, ClusterConfig
from pipelines.config import PipelineConfig
from pipelines.parameters import argo_text, pipeline_parameters, retrain_arguments

TEMPLATE_NAME = "orchard-training"
CRON_NAME = "orchard-retrain"
DATA = "/data"
RUN_DIR = DATA + "/{{workflow.name}}"
STEP_INPUTS = ["config_json", "parent_run_id"]
LABELS = {"app.kubernetes.io/part-of": "orchard"}
# On a stage's PyTorchJob and its pods: which workflow started it (Argo labels its own pods the same way).
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
DATA_STORE_VOLUME = "data-store"
JOB_DEADLINE_GRACE_SECONDS = 120


def _wf(name: str) -> str:
    return "{{workflow.parameters.%s}}" % name


def _snake(fields: dict) -> dict:
    """camelCase Kubernetes field names -> hera's model argument names."""
    return {"".join("_" + c.lower() if c.isupper() else c for c in k): v for k, v in fields.items()}


def _requests(cpu: str, memory: str, gpu: bool = False) -> Resources:
    """A pod's requests; its memory request is its limit too, as in a stage's PyTorchJob pods (a stage past it
    is OOM-killed in its own pod, not the node's other pods)."""
    return Resources(cpu_request=cpu, memory_request=memory, memory_limit=memory, gpus=1 if gpu else None)


def _secrets(cluster: ClusterConfig) -> list:
    return [
        SecretEnv(
            name="ORCHARD_SANDBOX_TOKEN", secret_name=_wf("sandbox_token_secret"), secret_key=cluster.sandbox_token_key
        ),
        SecretEnv(
            name="OPENAI_API_KEY", secret_name=_wf("endpoint_secret"), secret_key=cluster.endpoint_key, optional=True
        ),
    ]


def _job_template(
    stage: stages.Stage, launch, cluster: ClusterConfig, inputs: list, gpu: bool, requests: tuple[str, str]
) -> Resource:
    """The stage as a PyTorchJob over the workflow's volume (claim `<workflow>-run-data`, as Argo names it)."""
    placeholders = (_wf("gpu_node_selector"), _wf("gpu_tolerations"))  # JSON parameters: unquoted in the YAML
    deadline = stage.timeout_seconds or cluster.stage_timeout_seconds
    manifest = pytorchjob.pytorchjob_manifest(
        stage,
        launch,
        gpu=gpu,
        requests=requests,
        security_context=cluster.pod_security_context(),
        generate_name=f"orchard-{stage.name}-",
        image=_wf("gpu_image" if gpu else "image"),
        command=pytorchjob.job_command(stage.name, launch, RUN_DIR, "{{inputs.parameters.parent_run_id}}"),
        claim_name="{{workflow.name}}-run-data",
        mount_path=DATA,
        secret_env=pytorchjob.secret_env(
            _wf("sandbox_token_secret"), cluster.sandbox_token_key, _wf("endpoint_secret"), cluster.endpoint_key
        ),
        node_selector=placeholders[0],
        tolerations=placeholders[1],
        deadline_seconds=deadline,
        labels={WORKFLOW_LABEL: "{{workflow.name}}"},
    )
    return Resource(
        name=stage.name,
        action="create",
        set_owner_reference=True,  # deleted with the workflow
        manifest=pytorchjob.to_yaml(manifest, unquoted=placeholders),
        success_condition=pytorchjob.SUCCESS_CONDITION,
        failure_condition=pytorchjob.FAILURE_CONDITION,
        inputs=inputs,
        retry_strategy=RetryStrategy(limit=stage.retries) if stage.retries else None,
        # A job past its own deadline is failed by the operator with no pod counted as failed, which the
        # conditions above cannot see: the step's deadline, a little later, ends the wait.
        active_deadline_seconds=deadline + JOB_DEADLINE_GRACE_SECONDS,
    )


def build_workflow_template(
    cluster: ClusterConfig | None = None, defaults: PipelineConfig | None = None, namespace: str | None = None
) -> WorkflowTemplate:
    cluster = cluster or ClusterConfig()
    defaults = defaults or PipelineConfig.preset_config("demo")  # also decides which stages are PyTorchJobs
    params = [p for p in pipeline_parameters(defaults, cluster) if p.argo]
    # A model-level claim template. Its size is compiled in (`orchard compile --cluster volume_size=50Gi`
    # or ClusterConfig): the controller parses it before substituting parameters. No storage class: the
    # field is left out (the cluster's default), never "" (no provisioning at all).
    claim = m.PersistentVolumeClaim(
        metadata=m.ObjectMeta(name="run-data"),
        spec=m.PersistentVolumeClaimSpec(
            access_modes=[cluster.access_mode],
            storage_class_name=cluster.storage_class,
            resources=m.VolumeResourceRequirements(requests={"storage": cluster.volume_size}),
        ),
    )
    data = m.VolumeMount(name="run-data", mount_path=DATA)
    # The persistent data store: an existing PVC (manifests/base/pipelines/data-store.yaml) every run shares; Argo
    # substitutes workflow parameters in `volumes`, so the claim is a parameter like the run volume's settings.
    store_volume = m.Volume(
        name=DATA_STORE_VOLUME,
        persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name=_wf("data_store_claim")),
    )
    store = m.VolumeMount(name=DATA_STORE_VOLUME, mount_path=cluster.data_store_mount)

    with WorkflowTemplate(
        name=TEMPLATE_NAME,
        namespace=namespace,
        entrypoint="pipeline",
        on_exit=stages.CLOSE,
        service_account_name=cluster.service_account,
        security_context=m.PodSecurityContext(**_snake(cluster.pod_security_context())),
        pod_metadata=m.Metadata(labels={**LABELS, **PIPELINE_POD_LABELS}),  # admitted to MLflow and the sandbox API
        volume_claim_templates=[claim],
        volumes=[store_volume],
        arguments=[Parameter(name=x.name, value=x.argo_value, description=x.description) for x in params],
        labels=LABELS,
    ) as wt:
        step = _requests(defaults.resources.step_cpu, defaults.resources.step_memory)  # start, report, close-run
        start = Container(
            name=stages.START,
            image=_wf("image"),
            command=["python", "-m", "pipelines.steps", stages.START],
            args=[
                "--run-dir",
                RUN_DIR,
                "--outputs-dir",
                "/tmp/outputs",
                *[a for x in params if x.start for a in ("--param", f"{x.name}={_wf(x.name)}")],
            ],
            # Global outputs, so the exit handler can read them after any failure.
            outputs=[
                Parameter(name=n, value_from=ValueFrom(path=f"/tmp/outputs/{n}"), global_name=n) for n in STEP_INPUTS
            ],
            resources=step,
            volume_mounts=[data],
        )
        inputs = [Parameter(name=n) for n in STEP_INPUTS]
        step_args = [
            "--run-dir",
            RUN_DIR,
            "--config-json",
            "{{inputs.parameters.config_json}}",
            "--parent-run-id",
            "{{inputs.parameters.parent_run_id}}",
        ]
        templates: dict[str, Container | Resource] = {}
        for stage in stages.STAGES:
            launch, gpu = stage.launch(defaults), stage.wants_gpu(defaults)
            if launch is not None:
                templates[stage.name] = _job_template(stage, launch, cluster, inputs, gpu, stage.requests(defaults))
                continue
            templates[stage.name] = Container(
                name=stage.name,
                image=_wf("gpu_image" if gpu else "image"),
                command=["python", "-m", "pipelines.steps", "run", stage.name],
                args=step_args,
                inputs=inputs,
                env=_secrets(cluster),
                resources=_requests(*stage.requests(defaults), gpu=gpu),
                # nodeSelector and tolerations come from workflow parameters (JSON), hence a patch.
                pod_spec_patch=(
                    '{"nodeSelector": %s, "tolerations": %s}' % (_wf("gpu_node_selector"), _wf("gpu_tolerations"))
                )
                if gpu
                else None,
                retry_strategy=RetryStrategy(limit=stage.retries) if stage.retries else None,
                active_deadline_seconds=stage.timeout_seconds or cluster.stage_timeout_seconds,
                volume_mounts=[data, store] if stage.store_volume else [data],
            )
        report = Container(
            name=stages.REPORT,
            image=_wf("image"),
            command=["python", "-m", "pipelines.steps", stages.REPORT],
            args=step_args,
            inputs=inputs,
            env=_secrets(cluster),
            resources=step,
            volume_mounts=[data],
        )
        Container(  # exit handler: a run that died before `report` must not stay RUNNING in MLflow
            name=stages.CLOSE,
            image=_wf("image"),
            command=["python", "-m", "pipelines.steps", stages.CLOSE],
            args=[
                "--run-dir",
                RUN_DIR,
                "--status",
                "{{workflow.status}}",
                "--config-json",
                "{{workflow.outputs.parameters.config_json}}",
                "--parent-run-id",
                "{{workflow.outputs.parameters.parent_run_id}}",
            ],
            resources=step,
        )

        # One node at a time can attach a ReadWriteOnce run volume: then one step at a time.
        with DAG(name="pipeline", parallelism=1 if cluster.access_mode == "ReadWriteOnce" else None):
            # A template called inside a DAG context makes a Task of it (hera types the call for any context).
            begin = start(name=stages.START)
            assert isinstance(begin, Task)
            common = {n: begin.get_parameter(n) for n in STEP_INPUTS}
            tasks: dict[str, Task] = {}
            for stage in stages.STAGES:
                task = templates[stage.name](name=stage.name, arguments=common)
                assert isinstance(task, Task)
                for producer in stage.depends or [stages.START]:
                    (tasks[producer] if producer in tasks else begin) >> task
                tasks[stage.name] = task
            final = report(name=stages.REPORT, arguments=common)
            assert isinstance(final, Task)
            upstream: list[Task | str] = [tasks[s.name] for s in stages.STAGES]
            upstream >> final
    return wt


def build_cron_workflow(
    schedule: str = "0 3 * * 0",
    cluster: ClusterConfig | None = None,
    *,
    timezone: str = "UTC",
    namespace: str | None = None,
    parameters: dict[str, str] | None = None,
) -> CronWorkflow:
    """Scheduled retraining: runs the WorkflowTemplate on a cron schedule, one run at a time."""
    cluster = cluster or ClusterConfig()
    return CronWorkflow(
        name=CRON_NAME,
        namespace=namespace,
        schedules=[schedule],
        timezone=timezone,
        concurrency_policy="Forbid",  # a retrain still running blocks the next one instead of racing it
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=3,
        service_account_name=cluster.service_account,
        workflow_template_ref=WorkflowTemplateRef(name=TEMPLATE_NAME),
        # The retraining knobs are always stated on the schedule (defaults from the parameter list).
        arguments=[
            Parameter(name=k, value=argo_text(v))
            for k, v in {**retrain_arguments(cluster=cluster), **(parameters or {})}.items()
        ],
        labels=LABELS,
    )
