"""Adaptive RL stage: TRL's `GRPOTrainer` over multi-turn agent episodes in sandboxes.

The algorithm's choices, in order:
1. The policy starts from the SFT checkpoint (`load_policy`); rollouts sample from the weights being
   trained (HF generate through our policy, or TRL's colocated vLLM engine with `use_vllm`), so every
   batch is on-policy.
2. TRL deals the prompts (the run's training tasks, reshuffled each pass), `batch_prompts` per optimizer
   step, each repeated N = `rollout.group_size` times. Our `rollout_func` (`rollout.TRLRollout`)
   hands each prompt to the sampler (`sampling`: Balanced Adaptive Rollout or fixed-size groups), which
   runs up to N_max attempts (one `harness.run_episode` each, in a real sandbox, rewarded +1 resolved /
   -1 unresolved from the verifier only) and chooses the group of N. An `infra_error` episode has no
   reward and never enters a group; a group that cannot be assembled is N placeholder rows with equal
   rewards (no gradient) and is counted (`dropped_groups`).
3. Each episode goes to TRL as prompt + completion ids with `env_mask` 1 on the tokens the policy sampled
   and 0 on tool output and chat markup (and on a forked attempt's teacher prefix), with its rollout
   logprobs.
4. TRL owns the update: the advantages (the sampler's, GRPO over the prompt's whole pool, by default;
   with `rollout.advantage_baseline="group"` TRL's own group (r - mean) / std, `scale_rewards`), the loss
   variant (`loss_type`), PPO clipping (`clip_eps`/`clip_eps_high` -> `epsilon`/`epsilon_high`), KL to the
   starting policy (`kl_coef` -> `beta`), `epochs_per_batch` -> `num_iterations`, AdamW, gradient
   clipping and, through accelerate, distribution (`launch`). Any other GRPOConfig field goes through
   `trl_args`. The global rollout budget ends the run early.
5. The result is saved with `save_pretrained`; every sampler choice goes to `rollout_records.jsonl`
   next to it and, with the loss curve and the group-statistics plot, to MLflow. TRL still takes an optimizer
   step on a batch of placeholders (`steps_without_update` counts those), but `signal_only` keeps it from
   moving any weight (no router loss, no AdamW momentum step); `steps_done` counts the steps it let train
   (at least one kept, mixed-reward group): the promotion gate reads it.

Where the sampler's options meet TRL, numbered (3 refused by `RLConfig`, still open to the sampler study in
`scripts/compare_rollout.py`; 1 and 2 apply in their own form):
1. The pool rule (`RolloutConfig.advantage_baseline="pool"`, the default; sampling/sampler.py deviation 2):
   TRL computes advantages over the N rows of a group, so the sampler's advantages travel as a second
   reward function (`rollout.sampler_advantage`, weight 1; the verified reward weight 0, still logged as
   `rewards/verified_reward/mean`) with `scale_rewards="none"`: with +/-1 rewards they sum to zero over the
   group, so TRL's centring leaves them unchanged. TRL's `reward` metric is then their mean (0), not the
   verified reward's. A TRL scaling in `trl_args` would undo the pool's weights and is refused.
2. Refill is not DAPO's (more prompts per step): TRL deals exactly `batch_prompts` prompts per optimizer step.
   With `rollout.refill` (BAR's "groups that remain unsuitable can be filtered and replenished from other
   tasks") a dropped group is replaced inside the rollout by a kept group of another training prompt, not
   in this batch, with that prompt's own ids and rewards (`rollout_func` returns each completion's
   `prompt_ids`), up to `max_prompts_per_batch` pulls per call; `replacement_groups` counts them and each
   step logs its informative groups with and without them. TRL still logs the dealt prompt's text beside a
   replacement's completion. Off by default in this stage; every preset turns it on (docs/concepts/stages.md).
3. Lookahead ordering (`RolloutConfig.lookahead` > 1): TRL's sampler orders the prompts. History's
   skipping does apply: a skipped prompt spends no episode and goes to TRL as placeholders.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.core.distributed import barrier, is_main_process, world_size
from components.core.interrupts import trainer_callback
from components.core.data.schema import Outcome, Task
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig, log_figure, log_json, log_metrics, stage_run
from components.rl.config import RLConfig
from components.rl.rollout import TRLRollout, sampler_advantage, verified_reward


class RLResult(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # final_loss NaN: no update
    model_dir: str
    sampler: Literal["bar", "fixed"]
    steps_done: int = Field(
        description="Optimizer steps that got a gradient (a kept, mixed-reward group's "
        "loss-bearing tokens on some process): the updates that trained on a reward."
    )
    steps_without_update: int = Field(
        description="Optimizer steps TRL took on batches of only dropped groups (no "
        "weight moved); steps_done + steps_without_update = TRL's steps."
    )
    trajectories: int = Field(description="Episodes generated.")
    informative_groups: int = Field(description="Groups with mixed verified rewards (trained on).")
    informative_groups_per_trajectory: float
    infra_errors: int = Field(description="Episodes without a verified outcome (never rewarded).")
    stop_reason: Literal["steps", "budget"] = Field(description="Why the run ended.")
    records_path: str = Field(description="JSONL of PromptRecord: every sampler choice.")
    weight_change: float | None = Field(
        None,
        description="How far RL moved the weights: ||theta_rl - theta_start|| / "
        "||theta_start|| over every parameter (None: the start's "
        "weights were not readable as safetensors).",
    )
    metrics: dict[str, float] = Field(default_factory=dict)


def grpo_args(config: RLConfig, out: Path, **overrides: Any) -> Any:
    """GRPOConfig from RLConfig (the one mapping): one optimizer step per batch of `batch_prompts` groups of N."""
    from trl import GRPOConfig

    r = config.rollout
    args: dict[str, Any] = dict(
        output_dir=str(out / "trl"),
        max_steps=config.steps,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        num_generations=r.group_size,
        per_device_train_batch_size=r.group_size,
        gradient_accumulation_steps=r.batch_prompts,
        num_iterations=config.epochs_per_batch,
        epsilon=config.clip_eps,
        epsilon_high=config.clip_eps_high or config.clip_eps,
        beta=config.kl_coef,
        temperature=config.temperature,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=config.seed,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        max_completion_length=config.max_len,
        use_cpu=not _cuda(),
        bf16=False,
        shuffle_dataset=True,
        # CPU processes (tests, laptops) talk over gloo; GPUs over NCCL, which accelerate picks itself.
        ddp_backend="gloo" if world_size() > 1 and not _cuda() else None,
    )
    # The weights of `reward_functions()`, in order: under the pool rule the sampler's advantages go to the loss
    # as they are (they sum to zero per group, so TRL's centring is a no-op, and "none" skips its scaling); under
    # the group rule TRL computes group advantages from the verified reward (scale_rewards as trl_args say).
    pool = r.advantage_baseline == "pool"
    args.update(reward_weights=[0.0, 1.0] if pool else [1.0, 0.0], **({"scale_rewards": "none"} if pool else {}))
    if use_vllm(config):
        args.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            vllm_max_model_length=config.max_len,
        )
    args.update(config.trl_args)
    args.update(overrides)
    return GRPOConfig(**args)


def reward_functions() -> list:
    """TRL's reward functions, in the order of `grpo_args`' reward_weights: the verified reward (+1 / -1) and the
    sampler's advantage."""
    return [verified_reward, sampler_advantage]


def use_vllm(config: RLConfig) -> bool:
    """Whether rollouts sample through vLLM: `use_vllm` True needs it installed, 'auto' takes it when it can."""
    import importlib.util

    available = importlib.util.find_spec("vllm") is not None
    if config.use_vllm is True and not available:
        raise ValueError(
            "rl.use_vllm=true but vllm is not installed; install it (scripts/gpu_check.sh pins a "
            "version TRL 1.16 accepts) or set rl.use_vllm to false or 'auto'"
        )
    if config.use_vllm is True and not _cuda():
        raise ValueError(
            "rl.use_vllm=true needs a CUDA GPU (vLLM's colocate mode shares the training GPU); "
            "set rl.use_vllm to false or 'auto' on a CPU machine"
        )
    return config.use_vllm is True or (config.use_vllm == "auto" and available and _cuda())


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def train_rl(
    config: RLConfig,
    tasks_dir: str | Path,
    model_dir: str | Path,
    out_model_dir: str | Path,
    tracking: TrackingConfig | None = None,
) -> RLResult:
    """RL from the checkpoint in `model_dir`; writes the policy and rollout_records.jsonl to out_model_dir."""
    import torch

    out = Path(out_model_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = {t.id: t for t in TaskStore(tasks_dir).read(split=config.split)}
    if not tasks:
        raise ValueError(f"no {config.split!r} tasks in {tasks_dir}; provision the environment first")
    previous_threads = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        return _train(config, tasks, model_dir, out, tracking)
    finally:
        torch.set_num_threads(previous_threads)


# TRL's per-step logs that are headline curves of the run (components.core.tracking.curve), by position; the
# rollout logs the other two (1 resolved rate, 5 uniform-group share: rollout.py). Every other TRL key is kept
# under "trl/" (a section after the headline one). Rewards are the verifier's: +1 resolved, -1 unresolved, so
# "reward" is TRL's mean of the verified reward function over the trained rows, 2 x (their resolved share) - 1
# (TRL's own "reward" is the weighted sum of the reward functions, the sampler's advantage under the pool rule);
# KL (to the starting policy) exists when kl_coef > 0.
TRL_CURVES = {
    "loss": (2, "loss"),
    "entropy": (3, "entropy"),
    "kl": (4, "kl"),
    "rewards/verified_reward/mean": (6, "reward"),
}


def trl_metrics_callback() -> Any:
    """A TrainerCallback that logs each optimizer step's TRL metrics to MLflow as the step ends (step = the
    optimizer step, 1-based, as the rollout's own curves)."""
    from transformers import TrainerCallback

    from components.core.tracking import curve

    class TRLMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:  # the end-of-training summary carries train_loss, not loss
                return
            numeric = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            log_metrics(
                {(curve(*TRL_CURVES[k]) if k in TRL_CURVES else f"trl/{k}"): v for k, v in numeric.items()},
                step=state.global_step,
            )

    return TRLMetrics()


def weight_change(model: Any, start_dir: str | Path) -> float | None:
    """||theta - theta_start|| / ||theta_start|| over the parameters `model` shares with the checkpoint in
    `start_dir` (read tensor by tensor from its safetensors: no second model in memory); None without one."""
    import torch
    from safetensors import safe_open

    files = sorted(Path(start_dir).glob("*.safetensors"))
    if not files:
        return None
    current = {k: v.detach() for k, v in model.state_dict().items()}
    diff = base = 0.0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key in current:
                    start = f.get_tensor(key).to(current[key].device, torch.float32)
                    diff += float((current[key].float() - start).pow(2).sum())
                    base += float(start.pow(2).sum())
    return (diff**0.5) / (base**0.5) if base > 0 else None


def _quiet_placeholder_warning() -> None:
    """TRL warns, with the whole row, whenever every reward function returned None for a row; here that is
    every dropped group's placeholder row by design (`rollout`), counted in `dropped_groups` instead."""
    import logging

    class _Placeholders(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "All reward functions returned None" not in record.getMessage()

    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _Placeholders) or type(f).__name__ == "_Placeholders" for f in trl_logger.filters):
        trl_logger.addFilter(_Placeholders())


def signal_only(trainer_class: type) -> type:
    """`trainer_class` (GRPOTrainer) whose micro-batches without one loss-bearing token (only dropped groups'
    placeholder rows, on every process) leave the weights exactly as they are.

    TRL would still run the forward and backward there: the policy-gradient term is zero, but an MoE model's
    router loss is not, and AdamW moves every weight by its momentum whatever the gradient. Returning a loss
    that no weight feeds leaves every `.grad` None, and torch's optimizers skip such parameters entirely.
    The processes agree first (one all-reduce), so under DDP either all skip or none does. `trained_steps`:
    the optimizer steps (global_step at the time) that got a gradient, i.e. the updates `steps_done` counts."""
    import torch

    class SignalOnly(trainer_class):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.trained_steps: set[int] = set()

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mask = inputs["completion_mask"]
            if inputs.get("tool_mask") is not None:
                mask = mask * inputs["tool_mask"]
            loss_tokens = self.accelerator.reduce(mask.sum().detach().float(), reduction="sum")
            if loss_tokens.item() == 0:
                return torch.zeros((), device=mask.device, requires_grad=True)
            self.trained_steps.add(self.state.global_step)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    SignalOnly.__name__ = SignalOnly.__qualname__ = f"SignalOnly{trainer_class.__name__}"
    return SignalOnly


def _train(
    config: RLConfig, tasks: dict[str, Task], model_dir: str | Path, out: Path, tracking: TrackingConfig | None
) -> RLResult:
    from datasets import Dataset
    from trl import GRPOTrainer

    from components.core.policy.modeling import load_policy
    from components.recipes import get_recipe

    model, tokenizer = load_policy(model_dir, spec=config.load)
    references = {}
    if config.prefix_trajectories:
        references = {
            t.task_id: t
            for t in TrajectoryStore(config.prefix_trajectories).read()
            if t.outcome is Outcome.resolved and t.task_id in tasks
        }
    t0 = time.perf_counter()
    main = is_main_process()  # under accelerate/torchrun every rank rolls out its slice; one writes and logs
    with stage_run("rl", config, tracking if main else None), config.sandbox.client() as client:
        rollout = TRLRollout(
            tasks,
            get_recipe(config.recipe, **config.recipe_options),
            client,
            config,
            tokenizer,
            TrajectoryStore(out / "rollouts") if config.save_rollouts else None,
            references,
        )
        args = grpo_args(config, out)
        _quiet_placeholder_warning()
        try:
            trainer = signal_only(GRPOTrainer)(
                model=model,
                processing_class=tokenizer,
                reward_funcs=reward_functions(),
                args=args,
                train_dataset=Dataset.from_list(rollout.dataset_rows()),
                rollout_func=rollout,
                callbacks=[trainer_callback(), trl_metrics_callback()],
            )
            trainer.train()
        finally:
            rollout.close()
        records_path = out / "rollout_records.jsonl"
        rollout.gather()  # every rank's sampler choices, so the result counts the whole job
        # every rank calls save_model: under FSDP / ZeRO-3 each holds a shard, the main process writes
        trainer.save_model(str(out))
        if main:
            tokenizer.save_pretrained(str(out))
            records_path.write_text("".join(r.model_dump_json() + "\n" for r in rollout.records))
        barrier()  # nobody returns (and reads the model) before it is written
        logged = [h for h in trainer.state.log_history if "loss" in h]
        steps_done = len(trainer.trained_steps)
        steps_without_update = int(trainer.state.global_step) - steps_done
        totals = rollout.summary()
        result = RLResult(
            model_dir=str(out),
            sampler=config.rollout.sampler,
            steps_done=steps_done,
            steps_without_update=steps_without_update,
            trajectories=int(totals["trajectories"]),
            informative_groups=int(totals["informative_groups"]),
            informative_groups_per_trajectory=totals["informative_groups_per_trajectory"],
            infra_errors=int(totals["aborted_attempts"]),
            stop_reason="budget" if rollout.budget.remaining <= 0 else "steps",
            records_path=str(records_path),
            weight_change=weight_change(trainer.accelerator.unwrap_model(trainer.model), model_dir),
            metrics={
                **totals,
                "steps_done": float(steps_done),
                "steps_without_update": float(steps_without_update),
                "train_seconds": time.perf_counter() - t0,
                "final_loss": logged[-1]["loss"] if logged else float("nan"),
                # tokens through the model in training (TRL's count: prompts and completions of every row)
                "num_tokens": float(logged[-1].get("num_tokens", float("nan"))) if logged else 0.0,
            },
        )
        if result.weight_change is not None:
            result.metrics["weight_change"] = result.weight_change
        log_metrics({f"final.{k}": v for k, v in result.metrics.items()})
        if main:
            (out / "rl_result.json").write_text(result.model_dump_json(indent=2))  # the gate reads steps_done
            log_json(result.model_dump(mode="json"), "rl_result.json")
            log_json([r.model_dump(mode="json") for r in rollout.records], "rollout_records.json")
            if tracking is not None and tracking.enabled and rollout.records:
                import matplotlib.pyplot as plt

                from components.rl.plots import plot_group_statistics

                fig = plot_group_statistics(rollout.records, title=f"{config.rollout.sampler} rollout groups")
                log_figure(fig, f"{config.rollout.sampler}_group_statistics.png")
                plt.close(fig)
    return result
