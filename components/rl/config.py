"""The RL stage's settings (`RLConfig`): one typed object for `stage.train_rl`, the rollout and the pipeline."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox_service.connection import SandboxConnection
from components.core.distributed import LaunchConfig
from components.core.data.episode_traces import TraceConfig
from components.core.episode.harness import HarnessConfig
from components.core.policy.modeling import LoadOptions
from components.recipes import RecipeName
from components.rl.sampling import RolloutConfig


class RLConfig(BaseModel):
    """Everything that decides an RL run."""

    model_config = ConfigDict(extra="forbid")
    trl_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra GRPOConfig fields (loss_type, scale_rewards, ...); they override the ones derived here.",
    )
    recipe: RecipeName = Field("swe", description="Task suite (a registered recipe).")
    recipe_options: dict = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    rollout: RolloutConfig = Field(
        default_factory=lambda: RolloutConfig(refill=False),
        description="Sampler: bar|fixed, N, N_max, stride, [rho_min, rho_max], batch_prompts (groups per step), "
        "group_choice, advantage_baseline; refill off unless set.",
    )
    rollout_budget: int | None = Field(None, ge=1, description="Global cap on episodes over the whole run.")
    steps: int = Field(4, ge=1, description="Optimizer steps (GRPOConfig max_steps).")
    learning_rate: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    epochs_per_batch: int = Field(
        1, ge=1, description="Optimizer steps per generated batch (GRPOConfig num_iterations; clipping bites from 2)."
    )
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range below (and above, unless clip_eps_high): epsilon.")
    clip_eps_high: float | None = Field(
        None, gt=0, description="Upper clip range (DAPO clip-higher): epsilon_high; None = clip_eps."
    )
    kl_coef: float = Field(0.0, ge=0, description="KL weight to the starting policy (beta; 0 = no reference).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    max_len: int = Field(4096, ge=16, description="Tokens per episode in the update; longer ones are cut at the end.")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature (also scales logprobs).")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="Episode limits and generation.")
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service to use.")
    split: Literal["train", "heldout"] = Field("train", description="Tasks of the store used as prompts.")
    prefix_trajectories: str | None = Field(
        None,
        description="TrajectoryStore of resolved (teacher) trajectories that prefix-fork sampling "
        "(rollout.prefix_fork) starts attempts from; None = no prompt can be forked.",
    )
    save_rollouts: bool = Field(False, description="Also store every episode under out_model_dir/rollouts.")
    traces: TraceConfig = Field(
        default_factory=TraceConfig,
        description="Which rollout episodes become MLflow traces (max_per_stage: over the run).",
    )
    batch_rollouts: bool = Field(
        True,
        description="Episodes of a wave run in threads and their turns share one batched forward "
        "(BatchingPolicy); a sampled episode then depends on its batch-mates. False: one "
        "episode at a time (each episode's seed alone decides its samples).",
    )
    use_vllm: bool | Literal["auto"] = Field(
        False,
        description="Sample episodes through TRL's colocated vLLM engine (GRPOConfig use_vllm, "
        "vllm_mode='colocate'; needs vllm and a GPU). 'auto': when vllm imports and CUDA is "
        "available, else HF generate. False: HF generate.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="Share of the GPU the colocated vLLM engine takes."
    )
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads (None = torch default).")
    load: LoadOptions = Field(
        default_factory=LoadOptions, description="Device, dtype and attention kernel of the policy."
    )
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig, description="Processes of the stage in a pipeline (> 1: a PyTorchJob)."
    )
    seed: int = Field(0, description="Seed of prompt order, sampling and the optimizer.")

    @model_validator(mode="before")
    @classmethod
    def _no_engine(cls, data: Any) -> Any:
        if isinstance(data, dict) and "engine" in data:
            was = (
                "the builtin RL engine (our own clipped update) was removed"
                if data["engine"] == "builtin"
                else "rl.engine was removed"
            )
            raise ValueError(
                f"{was}: TRL's GRPOTrainer is the only RL engine. Delete the `engine` setting; loss "
                "variant, advantage scaling and other GRPOConfig fields go in rl.trl_args (e.g. "
                "{'loss_type': 'dapo', 'scale_rewards': 'group'}), clipping and KL in clip_eps, "
                "clip_eps_high and kl_coef"
            )
        return data

    @field_validator("trl_args")
    @classmethod
    def _loss_over_tokens(cls, trl_args: dict[str, Any]) -> dict[str, Any]:
        """Dropped groups reach TRL as placeholder rows (no loss token, reward None). A loss averaged per row
        or per micro-batch (grpo, sapo: mean over sequences; luspo, dr_grpo: over rows; bnpo: token mean per
        micro-batch, then divided by the accumulation steps, and a micro-batch is one group here) counts them
        in its denominator, so a step's gradient would shrink with the number of dropped groups. TRL's
        default dapo (and cispo, vespo) divides by the loss tokens of the whole batch: placeholders have none."""
        if trl_args.get("loss_type") in ("grpo", "sapo", "luspo", "dr_grpo", "bnpo"):
            raise ValueError(
                f"rl.trl_args.loss_type={trl_args['loss_type']!r} averages over rows or micro-batches, "
                "so dropped groups' placeholder rows would dilute every step's gradient; use 'dapo' "
                "(TRL's default), 'cispo' or 'vespo', which divide by the batch's loss tokens"
            )
        return trl_args

    @field_validator("rollout")
    @classmethod
    def _sampler_fits_trl(cls, rollout: RolloutConfig) -> RolloutConfig:
        """The sampler option TRL cannot honour (rl/stage.py's docstring) is refused; refill is off unless asked
        for (a replacement group costs episodes beyond the dealt prompt's)."""
        if rollout.lookahead > 1:
            raise ValueError(
                "rollout.lookahead cannot apply in the RL stage: TRL deals the prompts (its sampler "
                "orders them), so ours cannot reorder them by their history; set lookahead to 1 "
                "(history still skips prompts whose recent groups were all one reward)"
            )
        refill = rollout.refill if "refill" in rollout.model_fields_set else False  # off unless asked for
        return rollout.model_copy(update={"refill": refill})

    @model_validator(mode="after")
    def _advantages_reach_trl_unchanged(self) -> RLConfig:
        """The reward weights are ours (rl/stage.py `grpo_args`: the verifier's reward, or the sampler's
        advantages); with the pool rule TRL must apply the sampler's advantages as they are: any scaling of its
        own would undo the pool's weights."""
        if "reward_weights" in self.trl_args:
            raise ValueError(
                "rl.trl_args.reward_weights is set by the RL stage (the verifier's reward or the "
                "sampler's advantages, by rollout.advantage_baseline); remove it"
            )
        if self.rollout.advantage_baseline == "pool":
            raw = self.trl_args.get("scale_rewards", "none")
            scale = {True: "group", False: "none"}.get(raw, raw)  # GRPOConfig's bool spelling
            if (
                scale != "none"
                or self.trl_args.get("multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize"
            ):
                raise ValueError(
                    "rollout.advantage_baseline='pool' hands TRL the sampler's advantages (GRPO over the "
                    "prompt's whole pool, components/rl/sampling/sampler.py); a TRL scaling "
                    f"(scale_rewards={self.trl_args.get('scale_rewards')!r}, multi_objective_aggregation="
                    f"{self.trl_args.get('multi_objective_aggregation')!r}) would rescale them per "
                    "group or batch. Drop those rl.trl_args, or set rollout.advantage_baseline='group' "
                    "to let TRL compute group advantages from the verified reward"
                )
        return self
