"""Adaptive RL stage: group-relative policy optimisation over multi-turn agent episodes in sandboxes.

The algorithm's choices, in order:
1. The policy starts from the SFT checkpoint (`load_policy`); the rollout policy is the same model
   object, so every batch is sampled on-policy.
2. Prompts are training tasks, reshuffled each pass. For each prompt the sampler (`rl_sampler`:
   Balanced Adaptive Rollout or fixed-size groups) asks for attempts; an attempt is one episode
   through `harness.run_episode` in a real sandbox, rewarded +1 resolved / -1 unresolved from the
   verifier only. An `infra_error` episode has no reward and never enters a group.
3. Kept groups get advantages (r - mean) / std, set by the sampler (mean/std over all of the prompt's
   verified attempts by default: `RolloutConfig.advantage_baseline`); each episode is rendered with
   the ids the policy sampled, loss on assistant tokens only (`rendering.render_trajectory(loss_on=
   "assistant")`), none on a forked attempt's teacher prefix (`RLConfig.prefix_trajectories`).
4. One `rl_update` per batch: clipped token-level policy gradient against the rollout logprobs,
   optional KL to the frozen SFT policy. Budgets (global rollouts, prompts per batch) end the run early.
5. The result is saved with `save_pretrained`; every sampler choice goes to `rollout_records.jsonl`
   next to it and, with the loss curve and the group-statistics plot, to MLflow.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.core.connection import SandboxConnection
from components.core.distributed import LaunchConfig, world_size
from components.core.harness import HarnessConfig, run_episode
from components.core.modeling import LoadOptions
from components.core.schema import Outcome, Recipe, Task, Trajectory, hidden_pass_metrics
from components.core.store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig, log_figure, log_json, log_metrics, stage_run
from components.rl_loss import group_advantages, outcome_reward, rl_update
from components.rl_sampler import (
    Attempt, PromptHistory, PromptRecord, RolloutBudget, RolloutConfig, sample_batch, summarize,
)


class RLConfig(BaseModel):
    """Everything that decides an RL run."""

    model_config = ConfigDict(extra="forbid")
    engine: Literal["builtin", "trl"] = Field(
        "builtin", description="builtin: our clipped update (rl_loss) with the sampler's pool baseline and DAPO "
                               "refill; trl: TRL's GRPOTrainer with our episodes as its rollout_func (rl_trl).")
    trl_args: dict[str, Any] = Field(default_factory=dict, description="engine='trl': extra GRPOConfig fields "
                                     "(loss_type, scale_rewards, ...); they override the ones derived here.")
    recipe: Recipe = Field("swe", description="Task suite (get_recipe name).")
    recipe_options: dict = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig,
                                   description="Sampler: bar|fixed, N, N_max, stride, [rho_min, rho_max], batch.")
    rollout_budget: int | None = Field(None, ge=1, description="Global cap on episodes over the whole run.")
    steps: int = Field(4, ge=1, description="Optimizer steps (one per batch of groups).")
    learning_rate: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    epochs_per_batch: int = Field(1, ge=1, description="Policy-gradient passes over each batch (clipping bites from 2).")
    micro_batch: int = Field(4, ge=1, description="Episodes per forward/backward pass (gradient accumulated).")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range below (and above, unless clip_eps_high).")
    clip_eps_high: float | None = Field(None, gt=0, description="Upper clip range (DAPO clip-higher); None = clip_eps.")
    kl_coef: float = Field(0.0, ge=0, description="KL weight to the frozen starting policy (0 = no reference).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    max_len: int = Field(4096, ge=16, description="Tokens per episode in the update; longer ones are cut at the end.")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature (also scales logprobs).")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="Episode limits and generation.")
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service to use.")
    split: Literal["train", "heldout"] = Field("train", description="Tasks of the store used as prompts.")
    prefix_trajectories: str | None = Field(
        None, description="TrajectoryStore of resolved (teacher) trajectories that prefix-fork sampling "
                          "(rollout.prefix_fork) starts attempts from; None = no prompt can be forked.")
    save_rollouts: bool = Field(False, description="Also store every episode under out_model_dir/rollouts.")
    batch_rollouts: bool = Field(
        True, description="Episodes of a wave run in threads and their turns share one batched forward "
                          "(BatchingPolicy); a sampled episode then depends on its batch-mates. False: one "
                          "episode at a time (each episode's seed alone decides its samples).")
    use_vllm: bool | Literal["auto"] = Field(
        False, description="engine='trl': sample episodes through TRL's colocated vLLM engine (GRPOConfig use_vllm, "
                           "vllm_mode='colocate'; needs vllm and a GPU). 'auto': when vllm imports and CUDA is "
                           "available, else HF generate. False: HF generate.")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1,
                                               description="Share of the GPU the colocated vLLM engine takes.")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads (None = torch default).")
    load: LoadOptions = Field(default_factory=LoadOptions,
                              description="Device, dtype and attention kernel of the policy (and its reference).")
    launch: LaunchConfig = Field(default_factory=LaunchConfig,
                                 description="Processes of the stage in a pipeline (> 1: a PyTorchJob; engine trl).")
    seed: int = Field(0, description="Seed of prompt order, sampling and the optimizer.")

    @model_validator(mode="after")
    def _distributed_needs_trl(self) -> "RLConfig":
        if self.launch.processes > 1 and self.engine != "trl":
            raise ValueError(f"launch asks for {self.launch.processes} processes but engine={self.engine!r} trains "
                             "in one process; set engine to 'trl' (GRPOTrainer, distributed through accelerate)")
        return self


class RLResult(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # final_loss NaN: no update
    model_dir: str
    sampler: Literal["bar", "fixed"]
    steps_done: int = Field(description="Optimizer updates actually made.")
    trajectories: int = Field(description="Episodes generated.")
    informative_groups: int = Field(description="Groups with mixed verified rewards (trained on).")
    informative_groups_per_trajectory: float
    infra_errors: int = Field(description="Episodes without a verified outcome (never rewarded).")
    stop_reason: Literal["steps", "budget"] = Field(description="Why the run ended.")
    records_path: str = Field(description="JSONL of PromptRecord: every sampler choice.")
    metrics: dict[str, float] = Field(default_factory=dict)


class EpisodeSource:
    """`RolloutSource` over real episodes: the task's sandbox, the policy, the verifier's reward."""

    def __init__(self, tasks: dict[str, Task], recipe: Any, policy: Any, client: Any, config: RLConfig,
                 store: TrajectoryStore | None = None, references: dict[str, Trajectory] | None = None):
        self.tasks, self.recipe, self.policy, self.client, self.config = tasks, recipe, policy, client, config
        self.store = store
        self.references = references or {}  # task id -> a resolved trajectory to fork from
        self.episodes = 0
        self.finished: list[Trajectory] = []  # this batch's episodes, for its partial-progress metrics

    def _harness(self, extra_turns: int = 0) -> HarnessConfig:
        self.episodes += 1
        generation = self.config.harness.generation.model_copy(update={
            "temperature": self.config.temperature, "seed": self.config.seed * 1_000_003 + self.episodes})
        return self.config.harness.model_copy(update={
            "generation": generation, "max_steps": self.config.harness.max_steps + extra_turns})

    def _attempts(self, trajectories: list[Trajectory], prefix_tool_steps: int = 0) -> list[Attempt]:
        if self.store is not None:
            self.store.append(trajectories)
        self.finished.extend(trajectories)
        return [Attempt(reward=outcome_reward(t), status=t.status, attempt_id=t.id, payload=t,
                        prefix_steps=prefix_tool_steps,
                        env_steps=sum(s.role == "tool" for s in t.steps[t.metadata.get("prefix_len", 0):]))
                for t in trajectories]

    def has_prefix(self, prompt_id: str) -> bool:
        from components.credit_base import assistant_positions

        return prompt_id in self.references and len(assistant_positions(self.references[prompt_id])) >= 2

    def fork(self, prompt_id: str, n: int, fraction: float) -> list[Attempt]:
        """n episodes continuing from the state after the first `fraction` of the reference's assistant
        steps: the sandbox forks that step's snapshot, or (none kept) the prefix's tool calls are replayed."""
        from components.credit_base import assistant_positions, state_end

        ref = self.references[prompt_id]
        positions = assistant_positions(ref)
        turns = max(1, min(len(positions) - 1, round(fraction * len(positions))))
        prefix = ref.steps[:state_end(ref, positions[turns - 1])]
        snapshot = prefix[-1].sandbox_state_id

        def one(harness: HarnessConfig) -> Trajectory:  # max_steps counts the prefix's turns too
            traj = run_episode(self.tasks[prompt_id], self.recipe, self.policy, self.client, harness,
                               prefix_steps=prefix, from_snapshot=snapshot)
            if snapshot and traj.outcome is Outcome.infra_error and "setup failed" in (traj.outcome_reason or ""):
                traj = run_episode(self.tasks[prompt_id], self.recipe, self.policy, self.client, harness,
                                   prefix_steps=prefix)  # the snapshot is gone: rebuild the state by replay
            return traj

        trajectories = self._run([lambda h=self._harness(extra_turns=turns): one(h) for _ in range(n)])
        return self._attempts(trajectories, prefix_tool_steps=sum(s.role == "tool" for s in prefix))

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        task = self.tasks[prompt_id]
        return self._attempts(self._run([
            lambda h=self._harness(): run_episode(task, self.recipe, self.policy, self.client, h) for _ in range(n)]))

    def _run(self, episodes: list) -> list[Trajectory]:
        """The wave's episodes: in threads when the policy batches their turns (`BatchingPolicy`), else in turn."""
        from components.core.batching import BatchingPolicy

        if len(episodes) < 2 or not isinstance(self.policy, BatchingPolicy):
            return [run() for run in episodes]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(episodes)) as pool:
            return list(pool.map(lambda run: run(), episodes))


def prompt_stream(task_ids: list[str], seed: int) -> Iterator[str]:
    """Task ids forever, reshuffled on every pass."""
    rng = random.Random(seed)
    while True:
        order = list(task_ids)
        rng.shuffle(order)
        yield from order


def episode_tokens(attempt: Attempt, tokenizer: Any, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of an attempt's episode: loss on the tokens the policy sampled, none on a forked
    attempt's teacher prefix, cut at `max_len`."""
    from components.core.rendering import render_trajectory

    s = render_trajectory(attempt.payload, tokenizer, loss_on="assistant")
    prefix_len = attempt.payload.metadata.get("prefix_len", 0) if attempt.forked else 0
    loss = [m if i >= prefix_len else 0 for m, i in zip(s.loss_mask, s.step_index)]
    return s.input_ids[:max_len], loss[:max_len]


def group_samples(groups: list[list[Attempt]], tokenizer: Any, max_len: int) -> list[tuple[list[int], list[int], float]]:
    """(input_ids, loss_mask, advantage) per episode of the kept groups. The sampler sets each
    attempt's advantage (its baseline rule: `RolloutConfig.advantage_baseline`); a forked attempt's
    teacher prefix is context only (no loss)."""
    samples = []
    for group in groups:
        fallback = group_advantages([a.reward for a in group])
        for attempt, adv in zip(group, fallback):
            adv = attempt.advantage if attempt.advantage is not None else adv
            ids, mask = episode_tokens(attempt, tokenizer, max_len)
            if adv != 0.0 and any(mask):
                samples.append((ids, mask, adv))
    return samples


def train_rl(config: RLConfig, tasks_dir: str | Path, model_dir: str | Path, out_model_dir: str | Path,
             tracking: TrackingConfig | None = None) -> RLResult:
    """RL from the checkpoint in `model_dir`; writes the policy and rollout_records.jsonl to out_model_dir."""
    import torch

    out = Path(out_model_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = {t.id: t for t in TaskStore(tasks_dir).read(split=config.split)}
    if not tasks:
        raise ValueError(f"no {config.split!r} tasks in {tasks_dir}; provision the environment first")
    if world_size() > 1 and config.engine != "trl":
        raise ValueError(f"this process is one of WORLD_SIZE={world_size()} but rl.engine={config.engine!r} trains in "
                         "one process (N unsynchronised copies); set rl.engine='trl' to train with GRPOTrainer")
    if config.engine == "trl":
        from components.rl_trl import train_rl_trl

        train: Any = train_rl_trl
    else:
        train = _train
    previous_threads = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        return train(config, tasks, model_dir, out, tracking)
    finally:
        torch.set_num_threads(previous_threads)


def _train(config: RLConfig, tasks: dict[str, Task], model_dir: str | Path, out: Path,
           tracking: TrackingConfig | None) -> RLResult:
    import torch
    from tqdm import tqdm

    from components.core.local_policy import LocalTransformersPolicy
    from components.core.modeling import load_policy, load_policy_model, save_policy
    from components.recipes import get_recipe
    from components.rl_plots import plot_group_statistics

    torch.manual_seed(config.seed)
    model, tokenizer = load_policy(model_dir, spec=config.load)
    ref_model = None
    if config.kl_coef > 0:
        ref_model = load_policy_model(model_dir, spec=config.load).eval().requires_grad_(False)
    tool_format = None if config.harness.tool_format == "auto" else config.harness.tool_format
    policy: Any = LocalTransformersPolicy(model, tokenizer, device=str(model.device), tool_format=tool_format)
    if config.batch_rollouts:
        from components.core.batching import BatchingPolicy

        policy = BatchingPolicy(policy, max_batch=max(config.rollout.stride, config.rollout.group_size))
    base_policy_id = policy.policy_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    budget = RolloutBudget(config.rollout_budget)
    prompt_history = PromptHistory(config.rollout, config.seed)  # per-prompt posteriors across epochs
    prompts = prompt_stream(sorted(tasks), config.seed)
    if config.rollout.history:
        prompts = prompt_history.prefer(prompts)
    references = {}
    if config.prefix_trajectories:
        references = {t.task_id: t for t in TrajectoryStore(config.prefix_trajectories).read()
                      if t.outcome is Outcome.resolved and t.task_id in tasks}
    records: list[PromptRecord] = []
    history: list[dict[str, float]] = []
    steps_done = 0
    stop_reason: Literal["steps", "budget"] = "steps"
    records_path = out / "rollout_records.jsonl"

    closing = contextlib.closing(policy) if config.batch_rollouts else contextlib.nullcontext()
    with stage_run("rl", config, tracking), config.sandbox.client() as client, closing:
        source = EpisodeSource(tasks, get_recipe(config.recipe, **config.recipe_options), policy, client, config,
                               TrajectoryStore(out / "rollouts") if config.save_rollouts else None, references)
        t0 = time.perf_counter()
        progress = tqdm(range(config.steps), desc=f"rl ({config.rollout.sampler})", leave=False)
        for step in progress:
            batch = sample_batch(prompts, source, config.rollout, budget, step=step, history=prompt_history)
            records.extend(batch.records)
            samples = group_samples(batch.groups, tokenizer, config.max_len)
            row = {f"sampler.{k}": v for k, v in summarize(batch.records).items()}
            if samples:
                row |= rl_update(model, optimizer, samples, pad_id=tokenizer.pad_token_id,
                                 temperature=config.temperature, clip_eps=config.clip_eps,
                                 clip_eps_high=config.clip_eps_high, kl_coef=config.kl_coef, ref_model=ref_model,
                                 epochs=config.epochs_per_batch, micro_batch=config.micro_batch,
                                 max_grad_norm=config.max_grad_norm)
                steps_done += 1
                policy.policy_id = f"{base_policy_id}+rl{steps_done}"  # later episodes name the updated weights
            rewards = [a.reward for g in batch.groups for a in g]
            row |= {"groups": float(len(batch.groups)), "samples": float(len(samples)),
                    "reward_mean_all": _mean_reward(batch.records), "elapsed_s": time.perf_counter() - t0,
                    "group_reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
                    **{f"rollout.{k}": v for k, v in hidden_pass_metrics(source.finished).items()}}
            source.finished.clear()
            history.append(row)
            log_metrics(row, step=step)
            progress.set_postfix(episodes=budget.spent, groups=sum(r.kept for r in records), updates=steps_done)
            if batch.stop_reason == "budget":  # a short last batch still trained above
                stop_reason = "budget"
                break
        save_policy(model, tokenizer, out)
        records_path.write_text("".join(r.model_dump_json() + "\n" for r in records))
        totals = summarize(records)
        result = RLResult(
            model_dir=str(out), sampler=config.rollout.sampler, steps_done=steps_done,
            trajectories=int(totals["trajectories"]), informative_groups=int(totals["informative_groups"]),
            informative_groups_per_trajectory=totals["informative_groups_per_trajectory"],
            infra_errors=int(totals["aborted_attempts"]), stop_reason=stop_reason, records_path=str(records_path),
            metrics={**totals, "steps_done": float(steps_done), "train_seconds": time.perf_counter() - t0,
                     "final_loss": next((h["loss"] for h in reversed(history) if "loss" in h), float("nan"))},
        )
        log_metrics({f"final.{k}": v for k, v in result.metrics.items()})
        (out / "rl_result.json").write_text(result.model_dump_json(indent=2))  # the gate reads steps_done
        log_json(result.model_dump(mode="json"), "rl_result.json")
        log_json([r.model_dump(mode="json") for r in records], "rollout_records.json")
        if tracking is not None and tracking.enabled and records:
            import matplotlib.pyplot as plt

            fig = plot_group_statistics(records, title=f"{config.rollout.sampler} rollout groups")
            log_figure(fig, f"{config.rollout.sampler}_group_statistics.png")
            plt.close(fig)
    return result


def _mean_reward(records: list[PromptRecord]) -> float:
    """Mean verified reward over every attempt of the batch (not only kept groups), in [-1, 1]."""
    pos = sum(r.pool_positives for r in records)
    neg = sum(r.pool_negatives for r in records)
    return (pos - neg) / (pos + neg) if pos + neg else 0.0
