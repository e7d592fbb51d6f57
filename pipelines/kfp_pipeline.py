"""The orchard training pipeline as a KFP v2 DAG; it reads like the diagram:

    provision -> distill -> credit -> sft -> rl -> evaluate(untrained, sft, rl) -> report

Kubernetes settings (kfp-kubernetes, compiled into the YAML's second document): SFT and RL ask for
one GPU on the GPU node pool (nodeSelector + toleration); the trajectory store lives on a PVC that
the distill and credit steps mount; the sandbox API token and the model-endpoint key come from
Secrets as environment variables, never as parameters.
"""


from pathlib import Path

from kfp import compiler, dsl, kubernetes

from pipelines import kfp_components as c
from pipelines.config import PipelineConfig

PIPELINE_NAME = "orchard-training"
TRAJECTORY_MOUNT = "/mnt/trajectory-store"


def _with_secrets(task: dsl.PipelineTask, k8s) -> dsl.PipelineTask:
    kubernetes.use_secret_as_env(task, secret_name=k8s.sandbox_secret, secret_key_to_env={"token": "ORCHARD_SANDBOX_TOKEN"})
    kubernetes.use_secret_as_env(task, secret_name=k8s.endpoint_secret, secret_key_to_env={"api-key": "OPENAI_API_KEY"},
                                 optional=True)
    kubernetes.set_timeout(task, k8s.stage_timeout_seconds)
    return task


def _on_gpu(task: dsl.PipelineTask, image, k8s) -> dsl.PipelineTask:
    task.set_container_image(image)
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
    task.set_cpu_request("4").set_memory_request("16G")
    for key, value in k8s.gpu_node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    kubernetes.add_toleration(task, key=k8s.gpu_toleration_key, operator="Exists", effect="NoSchedule")
    return task


def build_pipeline(defaults: PipelineConfig | None = None, *, for_cluster: bool = True):
    """The pipeline function, with parameter defaults and Kubernetes settings from a PipelineConfig.

    `for_cluster=False` leaves out what only a cluster can run (the PVC create/delete container
    steps and the exit handler), for `kfp.local`; kfp-kubernetes settings are ignored there anyway.
    """
    d = defaults or PipelineConfig.preset_config("demo")
    k8s = d.kubernetes

    def dag(config, run_id, image, gpu_image):
        tasks = _with_secrets(c.provision(config_json=config, parent_run_id=run_id), k8s).set_container_image(image)
        base = c.init_policy(config_json=config, parent_run_id=run_id).set_container_image(image)

        distilled = _with_secrets(
            c.distill(config_json=config, parent_run_id=run_id, tasks=tasks.outputs["tasks"]), k8s
        ).set_container_image(image)
        credited = _with_secrets(
            c.credit(config_json=config, parent_run_id=run_id, tasks=tasks.outputs["tasks"],
                     trajectories=distilled.outputs["trajectories"]), k8s
        ).set_container_image(image)
        if for_cluster:  # the trajectory store's working copy lives on a PVC (retried pods resume)
            store = kubernetes.CreatePVC(pvc_name_suffix="-trajectories", access_modes=["ReadWriteOnce"],
                                         size=k8s.trajectory_pvc_size, storage_class_name=k8s.storage_class)
            for step in (distilled, credited):
                kubernetes.mount_pvc(step, pvc_name=store.outputs["name"], mount_path=TRAJECTORY_MOUNT)
                step.set_env_variable("ORCHARD_STORE_MOUNT", TRAJECTORY_MOUNT)
            kubernetes.DeletePVC(pvc_name=store.outputs["name"]).after(credited)

        sft = _on_gpu(_with_secrets(
            c.sft(config_json=config, parent_run_id=run_id, credited=credited.outputs["credited"],
                  base_model=base.outputs["model"]), k8s), gpu_image, k8s)
        rl = _on_gpu(_with_secrets(
            c.rl(config_json=config, parent_run_id=run_id, tasks=tasks.outputs["tasks"],
                 sft_model=sft.outputs["model"]), k8s), gpu_image, k8s)

        evals = {}
        for arm, model in (("untrained", base), ("sft", sft), ("rl", rl)):
            evals[arm] = _with_secrets(
                c.evaluate(config_json=config, parent_run_id=run_id, arm=arm, tasks=tasks.outputs["tasks"],
                           model=model.outputs["model"]), k8s
            ).set_container_image(image).set_display_name(f"evaluate-{arm}")

        c.report(config_json=config, parent_run_id=run_id, distill_result=distilled.outputs["Output"],
                 untrained_result=evals["untrained"].outputs["Output"], sft_result=evals["sft"].outputs["Output"],
                 rl_result=evals["rl"].outputs["Output"], final_model=rl.outputs["model"]).set_container_image(image)

    @dsl.pipeline(name=PIPELINE_NAME, description="Distill -> credit -> SFT -> adaptive RL -> evaluate, on one sandbox layer.")
    def orchard_training(
        recipe: str = d.recipe,
        preset: str = d.preset,
        n_train_tasks: int = d.tasks.n_train,
        n_heldout_tasks: int = d.tasks.n_heldout,
        sft_steps: int = d.sft.steps,
        rl_steps: int = d.rl.steps,
        seed: int = d.seed,
        image: str = d.images.stage,
        gpu_image: str = d.images.gpu,
        sandbox_url: str = d.sandbox_url or "http://orchard-sandbox.orchard.svc:8765",
        mlflow_uri: str = d.tracking_uri or "http://mlflow.orchard.svc:5000",
        experiment: str = d.experiment,
        overrides_json: str = "{}",
        run_label: str = "",
    ):
        def body():
            start = c.start_run(preset=preset, recipe=recipe, n_train_tasks=n_train_tasks,
                                n_heldout_tasks=n_heldout_tasks, sft_steps=sft_steps, rl_steps=rl_steps, seed=seed,
                                sandbox_url=sandbox_url, mlflow_uri=mlflow_uri, experiment=experiment,
                                overrides_json=overrides_json, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                                run_label=run_label)
            start.set_container_image(image).set_caching_options(False)  # a fresh parent run every time
            dag(start.outputs["config_json"], start.outputs["parent_run_id"], image, gpu_image)

        if for_cluster:
            closer = c.close_run(mlflow_uri=mlflow_uri, experiment=experiment,
                                 kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER).set_container_image(image)
            with dsl.ExitHandler(closer, name="mlflow-parent-run"):
                body()
        else:
            body()

    return orchard_training


def compile_pipeline(out_path: str | Path, defaults: PipelineConfig | None = None) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(defaults), package_path=str(out))
    return out
