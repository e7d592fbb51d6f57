"""THE stage table: the local runner, the KFP pipeline and the Argo WorkflowTemplate are built from it.

    provision ─┬─► evaluate-teacher
               ├─► distill ─► credit ─► accumulate ─┐  (this run's credited data + the data store's shards)
    init-policy┴────────────────────────────────────┴─► sft ─► rl
    evaluate-untrained (init-policy) · evaluate-sft (sft) · evaluate-rl (rl)
    ─► promote (the final trained model vs the registry's champion; registers it only when promoted)
    ─► report (every stage's result)

A row is one stage: its name (the task name in all three runners), the function that runs it, the
PipelineConfig section that is its config, the artifacts it reads (`"stage.output"`) and writes,
where it runs (GPU or not; `distributed`: a PyTorchJob when its config's `launch` asks for more than one
process), retries and timeout. Dependencies are the inputs' producers.
Adding a stage = its work in components/ (a module the import contract's `exhaustive` layers make you
place) + here one adapter function (one call into components/, its docstring the stage's summary) and one
row. The KFP components (`pipelines/kfp/components.py` writes each from its row), the Argo steps, the report
step and the generated docs' stage table all derive from the row; `tests/pipelines/test_new_stage.py` adds a
toy row and nothing else: both cluster pipelines compile it, the local runner runs it.

Around every stage, `pipelines.steps.run_stage` does the rest once: the stage's config with the
run's sandbox connection, its MLflow child run, the result file, and the fail-loud checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel

from components.core.errors import StageFailed

ArtifactKind = Literal["dataset", "model"]


@dataclass(frozen=True)
class StageCall:
    """What a stage function gets: its typed config, input/output paths by name, its MLflow tracking."""

    config: Any
    inputs: dict[str, Path]
    outputs: dict[str, Path]
    tracking: Any


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[StageCall], BaseModel | dict]
    config: str  # PipelineConfig section
    inputs: dict[str, str] = field(default_factory=dict)  # argument -> "producer.output"
    outputs: dict[str, ArtifactKind] = field(default_factory=dict)
    gpu: bool = False  # may use a GPU: it gets one when the config asks (`wants_gpu`)
    retries: int = 1
    timeout_seconds: int | None = None  # None: ClusterConfig.stage_timeout_seconds
    resumable: bool = False  # writes its store on the run volume so a retried pod resumes (KFP: a PVC)
    # Reads or writes the persistent data store (retrain.data_store): on a cluster its pod mounts the
    # store's PVC (ClusterConfig.data_store_claim) at ClusterConfig.data_store_mount.
    store_volume: bool = False
    cache: bool = True  # False: the result depends on state outside its inputs (the registry), never reuse it
    # A stage whose config is built from several sections (the gate): PipelineConfig -> its config.
    build_config: Callable[[Any], BaseModel] | None = None
    # Its config has a `launch` section (LaunchConfig): more than one process runs it as a PyTorchJob.
    distributed: bool = False

    def launch(self, config: Any) -> Any:
        """The stage's LaunchConfig when `config` (a PipelineConfig) runs it in more than one process, else None."""
        if not self.distributed:
            return None
        launch = getattr(config, self.config).launch
        return launch if launch.processes > 1 else None

    @property
    def depends(self) -> list[str]:
        return sorted({ref.split(".", 1)[0] for ref in self.inputs.values()})

    def wants_gpu(self, config: Any) -> bool:
        """Whether this stage's pods ask for a GPU under `config` (a PipelineConfig): the one definition.
        A GPU-capable row (`gpu`) gets one only when `config.resources.gpu` says so; then it also uses the
        GPU image and the GPU nodeSelector/tolerations, else none of them."""
        return self.gpu and config.resources.gpu

    def requests(self, config: Any) -> tuple[str, str]:
        """(cpu, memory) requests of this stage's pods under `config` (`PipelineConfig.resources`)."""
        r = config.resources
        return (r.train_cpu, r.train_memory) if self.gpu else (r.stage_cpu, r.stage_memory)


# --- The stage functions: each one call into components/ (the rule: a stage's work lives there) ---------
def provision(call: StageCall):
    """Generate (or import) the task suite: train, validation and held-out splits."""
    from components.provision import provision_environment

    return provision_environment(call.config, call.outputs["tasks"], tracking=call.tracking)


def init_policy(call: StageCall):
    """Build the untrained policy (the common start of SFT and the 'untrained' eval arm)."""
    from components.init_policy import init_policy as run

    return run(call.config, call.outputs["model"], call.tracking)


def _init_config(config: Any) -> BaseModel:
    from components.init_policy import InitConfig

    return InitConfig(
        model=config.model,
        start_from=config.retrain.start_from,
        promotion=config.promote,
        enabled=config.register_model_name is not None,
    )


def distill(call: StageCall):
    """Run the teacher over the training tasks in sandboxes; verified trajectories to the store."""
    from components.distill import distill as run

    return run(call.config, call.inputs["tasks"], call.outputs["trajectories"], tracking=call.tracking)


def credit(call: StageCall):
    """Label per-step credit on the teacher trajectories (Monte-Carlo by default)."""
    from components.credit.stage import label_credit

    return label_credit(
        call.config, call.inputs["trajectories"], call.inputs["tasks"], call.outputs["credited"], tracking=call.tracking
    )


def accumulate(call: StageCall):
    """Add the run's credited trajectories to the data store; the training set is the store's shards."""
    from components.accumulate import accumulate as run

    return run(
        call.config, call.inputs["tasks"], call.inputs["credited"], call.outputs["training"], tracking=call.tracking
    )


def sft(call: StageCall):
    """Supervised fine-tuning on credited segments, from the untrained policy."""
    from components.sft.stage import train_sft

    return train_sft(
        call.config,
        call.inputs["credited"],
        call.outputs["model"],
        base_model_dir=call.inputs["base_model"],
        tracking=call.tracking,
    )


def rl(call: StageCall):
    """Adaptive RL (Balanced Adaptive Rollout) from the SFT checkpoint."""
    from components.rl.stage import train_rl

    return train_rl(
        call.config, call.inputs["tasks"], call.inputs["sft_model"], call.outputs["model"], tracking=call.tracking
    )


def evaluate(call: StageCall):
    """Evaluate a policy (a trained or untrained model, or the reference teacher) on the held-out tasks."""
    from components.evaluate import evaluate as run

    check_endpoint(call.config)
    return run(
        call.config, call.inputs["tasks"], call.inputs.get("model"), call.outputs["results"], tracking=call.tracking
    )


def promote(call: StageCall):
    """The promotion gate: the final trained model vs the registry's champion; registers it only if promoted."""
    from components.promote.stage import run_gate

    i = call.inputs
    return run_gate(
        call.config,
        i["tasks"],
        i["base_model"],
        i["sft_model"],
        i["rl_model"],
        i["sft_results"],
        i["rl_results"],
        i["credited"],
        call.outputs["results"],
        call.tracking,
        base_results=i["base_results"],
    )


def _gate_config(config: Any) -> BaseModel:
    """The gate's config from the run's: its `promote` section and the candidates' EvalConfig."""
    from components.promote.stage import GateConfig

    return GateConfig(
        promotion=config.promote, evaluate=config.evaluate, enabled=config.register_model_name is not None
    )


def check_endpoint(config: Any) -> None:
    """An endpoint that cannot work fails the stage with the reason (not NaN rates): the run's preflight check,
    again when the stage starts (on a cluster, hours may lie between the two)."""
    if getattr(config, "policy", None) != "openai" or config.endpoint is None:
        return
    from pipelines.preflight import Endpoint, PreflightError, check_endpoint as ask

    e = config.endpoint
    try:
        ask(Endpoint("endpoint", e.base_url, e.model, e.api_key_env), timeout=e.connect_timeout_seconds)
    except PreflightError as err:
        raise StageFailed(f"evaluation {err}") from err


# --- The table ----------------------------------------------------------------------------------
_TASKS = {"tasks": "provision.tasks"}
STAGES: list[Stage] = [
    Stage("provision", provision, "provision", outputs={"tasks": "dataset"}, store_volume=True),
    # It reads the tasks too: the model's template is checked against the first task's episode once it exists
    # (`steps.run_in_layout`), so it must start after provision.
    Stage("init-policy", init_policy, "model", _TASKS, {"model": "model"}, build_config=_init_config),
    # The reference row first: a teacher endpoint that cannot be reached stops the run before training.
    Stage("evaluate-teacher", evaluate, "evaluate_teacher", _TASKS, {"results": "dataset"}),
    Stage("distill", distill, "distill", _TASKS, {"trajectories": "dataset"}, retries=2, resumable=True),
    Stage(
        "credit",
        credit,
        "credit",
        {**_TASKS, "trajectories": "distill.trajectories"},
        {"credited": "dataset"},
        retries=2,
        resumable=True,
    ),
    # This run's credited trajectories join the data store (retrain.data_store); SFT reads the union.
    Stage(
        "accumulate",
        accumulate,
        "retrain",
        {**_TASKS, "credited": "credit.credited"},
        {"training": "dataset"},
        retries=2,
        cache=False,
        store_volume=True,
    ),  # the store lives outside the artifacts
    Stage(
        "sft",
        sft,
        "sft",
        {"credited": "accumulate.training", "base_model": "init-policy.model"},
        {"model": "model"},
        gpu=True,
        distributed=True,
    ),
    Stage("rl", rl, "rl", {**_TASKS, "sft_model": "sft.model"}, {"model": "model"}, gpu=True, distributed=True),
    Stage("evaluate-untrained", evaluate, "evaluate", {**_TASKS, "model": "init-policy.model"}, {"results": "dataset"}),
    Stage("evaluate-sft", evaluate, "evaluate", {**_TASKS, "model": "sft.model"}, {"results": "dataset"}),
    Stage("evaluate-rl", evaluate, "evaluate", {**_TASKS, "model": "rl.model"}, {"results": "dataset"}),
    # Last: the final trained model against the registry's champion; only a promoted model is registered.
    Stage(
        "promote",
        promote,
        "promote",
        {
            **_TASKS,
            "base_model": "init-policy.model",
            "sft_model": "sft.model",
            "rl_model": "rl.model",
            "sft_results": "evaluate-sft.results",
            "rl_results": "evaluate-rl.results",
            "base_results": "evaluate-untrained.results",
            "credited": "accumulate.training",
        },
        {"results": "dataset"},
        retries=0,
        cache=False,
        build_config=_gate_config,
    ),  # a retry could register twice
]
BY_NAME = {s.name: s for s in STAGES}
# Steps around the stages, with the same names in every runner: `start` validates the config and
# opens the MLflow parent run, `report` reads every stage's result, `close-run` is the exit handler.
START, REPORT, CLOSE = "start", "report", "close-run"


def task_names() -> list[str]:
    """Every task of one run, in DAG order (the exit handler aside)."""
    return [START, *(s.name for s in STAGES), REPORT]


def eval_arm(stage: str) -> str | None:
    return stage.removeprefix("evaluate-") if stage.startswith("evaluate-") else None


def _check_table() -> None:
    seen: set[str] = set()
    for stage in STAGES:
        for ref in stage.inputs.values():
            producer, out = ref.split(".", 1)
            if producer not in seen or out not in BY_NAME[producer].outputs:
                raise ValueError(f"stage {stage.name}: input {ref} is not an output of an earlier stage")
        if stage.store_volume and stage.distributed:  # a PyTorchJob's pods mount only the run volume
            raise ValueError(f"stage {stage.name}: a distributed stage cannot mount the data store")
        seen.add(stage.name)


_check_table()
