"""The same DAG for Argo Workflows, built with hera: a WorkflowTemplate plus a CronWorkflow.

Where KFP passes artifacts, Argo steps share one volume per workflow (a volumeClaimTemplate): the
run directory `/data/<workflow name>` holds the layout of `pipelines/layout.py`, and every step is
`python -m pipelines.steps <step> --run-dir ...` in the project image. The start step validates the
PipelineConfig and opens the MLflow parent run; its outputs (config JSON, parent run id) are
parameters of every later step. SFT and RL request a GPU (`Resources(gpus=1)`) on the GPU pool.
"""

from __future__ import annotations

from hera.workflows import (
    DAG,
    Container,
    CronWorkflow,
    Parameter,
    Resources,
    SecretEnv,
    Volume,
    WorkflowTemplate,
)
from hera.workflows.models import Toleration, ValueFrom, WorkflowTemplateRef

from pipelines.config import PipelineConfig

TEMPLATE_NAME = "orchard-training"
CRON_NAME = "orchard-retrain"
DATA = "/data"
RUN_DIR = DATA + "/{{workflow.name}}"
STEP_INPUTS = ["config_json", "parent_run_id"]


def _secrets(k8s) -> list:
    return [
        SecretEnv(name="ORCHARD_SANDBOX_TOKEN", secret_name=k8s.sandbox_secret, secret_key="token"),
        SecretEnv(name="OPENAI_API_KEY", secret_name=k8s.endpoint_secret, secret_key="api-key", optional=True),
    ]


def build_workflow_template(defaults: PipelineConfig | None = None, namespace: str | None = None) -> WorkflowTemplate:
    d = defaults or PipelineConfig.preset_config("demo")
    k8s = d.kubernetes
    params = {
        "recipe": d.recipe, "preset": d.preset, "n_train_tasks": d.tasks.n_train, "n_heldout_tasks": d.tasks.n_heldout,
        "sft_steps": d.sft.steps, "rl_steps": d.rl.steps, "seed": d.seed,
        "image": d.images.stage, "gpu_image": d.images.gpu,
        "sandbox_url": "http://orchard-sandbox.orchard.svc:8765", "mlflow_uri": "http://mlflow.orchard.svc:5000",
        "experiment": d.experiment, "overrides_json": "{}",
    }
    start_params = ["recipe", "n_train_tasks", "n_heldout_tasks", "sft_steps", "rl_steps", "seed", "sandbox_url",
                    "experiment"]
    # ReadWriteMany: evaluation and training steps of one run share the volume from different nodes.
    data = Volume(name="run-data", size=k8s.trajectory_pvc_size, mount_path=DATA, access_modes=["ReadWriteMany"],
                  storage_class_name=k8s.storage_class or None)

    with WorkflowTemplate(
        name=TEMPLATE_NAME,
        namespace=namespace,
        entrypoint="pipeline",
        on_exit="close-run",
        arguments=[Parameter(name=k, value=str(v)) for k, v in params.items()],
        labels={"app.kubernetes.io/part-of": "orchard"},
    ) as wt:
        # The start step turns the workflow parameters into one validated PipelineConfig.
        params_json = "{" + ", ".join(
            f'"{k}": ' + (f'"{{{{workflow.parameters.{k}}}}}"' if k in ("recipe", "sandbox_url", "experiment")
                          else f"{{{{workflow.parameters.{k}}}}}")
            for k in start_params
        ) + ', "mlflow_uri": "{{workflow.parameters.mlflow_uri}}"}'
        start = Container(
            name="start",
            image="{{workflow.parameters.image}}",
            command=["python", "-m", "pipelines.steps", "start"],
            args=["--run-dir", RUN_DIR, "--preset", "{{workflow.parameters.preset}}", "--params-json", params_json,
                  "--overrides-json", "{{workflow.parameters.overrides_json}}", "--outputs-dir", "/tmp/outputs"],
            # Global outputs, so the exit handler can read them after any failure.
            outputs=[Parameter(name=n, value_from=ValueFrom(path=f"/tmp/outputs/{n}"), global_name=n)
                     for n in STEP_INPUTS],
            volumes=[data],
        )
        step_args = ["{{inputs.parameters.step}}", "--run-dir", RUN_DIR,
                     "--config-json", "{{inputs.parameters.config_json}}",
                     "--parent-run-id", "{{inputs.parameters.parent_run_id}}", "--arm", "{{inputs.parameters.arm}}"]
        inputs = [Parameter(name="step"), Parameter(name="arm", default="none")] + [Parameter(name=n) for n in STEP_INPUTS]
        cpu_step = Container(
            name="cpu-step",
            image="{{workflow.parameters.image}}",
            command=["python", "-m", "pipelines.steps"],
            args=step_args,
            inputs=inputs,
            env=_secrets(k8s),
            resources=Resources(cpu_request=2, memory_request="8Gi"),
            active_deadline_seconds=k8s.stage_timeout_seconds,
            volumes=[data],
        )
        gpu_step = Container(
            name="gpu-step",
            image="{{workflow.parameters.gpu_image}}",
            command=["python", "-m", "pipelines.steps"],
            args=step_args,
            inputs=inputs,
            env=_secrets(k8s),
            resources=Resources(cpu_request=4, memory_request="16Gi", gpus=1),
            node_selector=dict(k8s.gpu_node_selector),
            tolerations=[Toleration(key=k8s.gpu_toleration_key, operator="Exists", effect="NoSchedule")],
            active_deadline_seconds=k8s.stage_timeout_seconds,
            volumes=[data],
        )

        Container(  # exit handler: a run that died before `report` must not stay RUNNING in MLflow
            name="close-run",
            image="{{workflow.parameters.image}}",
            command=["python", "-m", "pipelines.steps", "close"],
            args=["--run-dir", RUN_DIR, "--status", "{{workflow.status}}",
                  "--config-json", "{{workflow.outputs.parameters.config_json}}",
                  "--parent-run-id", "{{workflow.outputs.parameters.parent_run_id}}"],
        )

        with DAG(name="pipeline"):
            s = start(name="start")
            common = {n: f"{{{{tasks.start.outputs.parameters.{n}}}}}" for n in STEP_INPUTS}

            def step(template: Container, name: str, arm: str = "none"):
                return template(name=name, arguments={"step": name if arm == "none" else "evaluate", "arm": arm, **common})

            provision = step(cpu_step, "provision")
            init = step(cpu_step, "init-policy")
            distill = step(cpu_step, "distill")
            credit = step(cpu_step, "credit")
            sft = step(gpu_step, "sft")
            rl = step(gpu_step, "rl")
            ev_untrained = step(cpu_step, "evaluate-untrained", arm="untrained")
            ev_sft = step(cpu_step, "evaluate-sft", arm="sft")
            ev_rl = step(cpu_step, "evaluate-rl", arm="rl")
            report = step(cpu_step, "report")

            s >> [provision, init]
            provision >> distill >> credit
            [credit, init] >> sft >> rl
            [provision, init] >> ev_untrained
            sft >> ev_sft
            rl >> ev_rl
            [ev_untrained, ev_sft, ev_rl] >> report
    return wt


def build_cron_workflow(schedule: str = "0 3 * * 0", *, timezone: str = "UTC", namespace: str | None = None,
                        parameters: dict[str, str] | None = None) -> CronWorkflow:
    """Scheduled retraining: runs the WorkflowTemplate on a cron schedule, one run at a time."""
    return CronWorkflow(
        name=CRON_NAME,
        namespace=namespace,
        schedules=[schedule],
        timezone=timezone,
        concurrency_policy="Forbid",  # a retrain still running blocks the next one instead of racing it
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=3,
        workflow_template_ref=WorkflowTemplateRef(name=TEMPLATE_NAME),
        arguments=[Parameter(name=k, value=v) for k, v in (parameters or {}).items()] or None,
        labels={"app.kubernetes.io/part-of": "orchard"},
    )
