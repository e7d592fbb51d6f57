"""The RL stage on TRL's `GRPOTrainer` (`RLConfig.engine="trl"`): our episodes and sampler, TRL's loss.

TRL owns the optimisation: advantages (group mean/std of the rewards), loss variant, clipping, KL,
importance sampling, optimizer, scheduler, logging and (through accelerate) distribution. We own the
rollout: `TRLRollout` is the `rollout_func`. For each group of `num_generations` identical prompts TRL
hands it, it runs our multi-turn harness episodes in sandboxes through the sampler (`sample_prompt`:
BAR or fixed groups, each group of N chosen from up to N_max attempts) and returns per completion:

- `prompt_ids`: the episode up to the first sampled token (system, task, assistant header);
- `completion_ids`: the rest of the episode, every assistant turn as sampled and every tool observation;
- `env_mask`: 1 on sampled assistant tokens, 0 on tool/environment tokens and chat markup (no loss);
- `logprobs`: the rollout logprobs of sampled tokens (`Step.logprobs` when the harness recorded them,
  else one no-grad forward of the rollout weights at the sampling temperature); 0 on env tokens;
- `verified_reward`: +1 resolved / -1 unresolved, read by `verified_reward` (the reward function).

A group the sampler does not keep (an attempt without a verified outcome, zero variance, abandoned,
budget spent) is sent as N placeholder rows: the bare prompt, one end-of-turn token with env_mask 0,
reward 0 for all N, so TRL's advantage is 0 and no token carries loss. The infra-error episode's tokens
and reward never leave this module; `TRLRollout.dropped_groups` counts such groups.

Several processes (torchrun / accelerate launch / a PyTorchJob, `RLConfig.launch`): every rank rolls
out its own groups (TRL's RepeatSampler hands each rank whole groups of N identical prompts, and
`rollout_func` runs on each rank), advantages are computed over the gathered batch, gradients are
averaged by DDP (or sharded by FSDP/ZeRO-3). Each rank has an equal share of `rollout_budget`; the
main process alone logs to MLflow and writes the model, the records of every rank and the result.

Differences from the builtin engine, numbered:
1. Advantages are TRL's (group baseline, `scale_rewards` from GRPOConfig), so the sampler's pool
   baseline (`RolloutConfig.advantage_baseline="pool"`) does not apply here.
2. TRL hands out exactly `batch_prompts` prompts per optimizer step; DAPO refill (`RolloutConfig.refill`)
   cannot pull more, a dropped group is a step with fewer informative groups.
3. Generation is HF `generate` through our policy (batched across a wave, `BatchingPolicy`), or with
   `RLConfig.use_vllm` TRL's colocated vLLM engine (`VLLMPolicy`, still batched per wave; TRL syncs the
   weights into it before each step's rollout). vLLM's server mode is not wired: its client lives on
   rank 0 only, while every rank runs its own multi-turn episodes here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components.core.distributed import barrier, is_main_process, world_size
from components.core.harness import initial_steps, steps_to_messages
from components.core.schema import Outcome, Task, Trajectory
from components.core.store import TrajectoryStore
from components.core.tracking import TrackingConfig, log_json, log_metrics, stage_run
from components.rl import RLConfig, RLResult, episode_tokens
from components.rl_sampling import Attempt, PromptHistory, PromptRecord, RolloutBudget, sample_prompt, summarize

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16


def _key(prompt: list[dict]) -> str:
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in prompt], sort_keys=True)


def verified_reward(prompts: list, completions: list, verified_reward: list[float], **_: Any) -> list[float]:
    """The reward function: the verifier's reward that `TRLRollout` carried with each completion."""
    return list(verified_reward)


class TRLRollout:
    """`rollout_func` for `GRPOTrainer`: sampler-chosen groups of real sandbox episodes (module docstring)."""

    def __init__(self, tasks: dict[str, Task], recipe: Any, client: Any, config: RLConfig, tokenizer: Any,
                 store: TrajectoryStore | None = None):
        self.tasks, self.recipe, self.client, self.config, self.tokenizer = tasks, recipe, client, config, tokenizer
        self.store = store
        # Every rank rolls out its own groups: each gets an equal share of the global episode budget.
        share = None if config.rollout_budget is None else -(-config.rollout_budget // world_size())
        self.budget = RolloutBudget(share)
        self.history = PromptHistory(config.rollout, config.seed)
        self.records: list[PromptRecord] = []
        self.dropped_groups = 0
        self.calls = 0
        self._prompts = {_key(self.prompt(t)): t.id for t in tasks.values()}
        self._source: Any = None
        self._model: Any = None

    def prompt(self, task: Task) -> list[dict]:
        """The dataset prompt of a task: its system and user messages (what an episode starts from)."""
        return [{"role": m.role, "content": m.content} for m in steps_to_messages(initial_steps(task, self.recipe))]

    def dataset_rows(self) -> list[dict]:
        return [{"prompt": self.prompt(t), "task_id": t.id} for t in self.tasks.values()]

    def _episode_source(self, model: Any, trainer: Any = None) -> Any:
        from components.core.batching import BatchingPolicy
        from components.core.local_policy import LocalTransformersPolicy
        from components.rl import EpisodeSource

        if self._model is not model:  # the same weights object across steps: the rollout is on-policy
            device = str(next(model.parameters()).device)
            if getattr(getattr(trainer, "args", None), "use_vllm", False):
                from components.core.vllm_policy import VLLMPolicy

                policy: Any = VLLMPolicy(trainer.vllm_generation.llm, model, self.tokenizer, device=device)
            else:
                policy = LocalTransformersPolicy(model, self.tokenizer, device=device)
            if self.config.batch_rollouts:
                if self._source is not None and isinstance(self._source.policy, BatchingPolicy):
                    self._source.policy.close()
                policy = BatchingPolicy(policy, max_batch=max(self.config.rollout.stride,
                                                              self.config.rollout.group_size))
            self._source = EpisodeSource(self.tasks, self.recipe, policy, self.client, self.config, self.store)
            self._model = model
        return self._source

    def close(self) -> None:
        if self._source is not None and hasattr(self._source.policy, "close"):
            self._source.policy.close()

    def __call__(self, prompts: list[list[dict]], trainer: Any) -> dict[str, list]:
        n = trainer.num_generations
        if n != self.config.rollout.group_size:
            raise ValueError(f"GRPOConfig.num_generations={n} but rollout.group_size={self.config.rollout.group_size}; "
                             "they are the same N")
        if len(prompts) % n:
            raise ValueError(f"{len(prompts)} prompts is not whole groups of {n}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        source = self._episode_source(model, trainer)
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "verified_reward", "attempt_id")}
        try:
            for start in range(0, len(prompts), n):
                chunk = prompts[start:start + n]
                if any(_key(p) != _key(chunk[0]) for p in chunk):
                    raise ValueError("TRL handed a group of different prompts; rollout_func needs each prompt "
                                     "num_generations times in a row (TRL's RepeatSampler)")
                task_id = self._prompts.get(_key(chunk[0]))
                if task_id is None:
                    raise ValueError("a prompt that is no task of this run; build the dataset with "
                                     "TRLRollout.dataset_rows()")
                result = sample_prompt(task_id, source, self.config.rollout, self.budget, step=self.calls,
                                       history=self.history)
                self.records.append(result.record)
                rows = [self._row(a, model) for a in result.group] if result.record.kept else []
                if len(rows) != n:
                    self.dropped_groups += 1
                    rows = [self._placeholder(self.tasks[task_id])] * n
                for row in rows:
                    for k, v in row.items():
                        out[k].append(v)
        finally:
            model.train(was_training)  # generation put it in eval mode; TRL computes the loss next
        self.calls += 1
        return out

    def _row(self, attempt: Attempt, model: Any) -> dict[str, Any]:
        traj: Trajectory = attempt.payload
        if attempt.aborted or traj.outcome is Outcome.infra_error or attempt.reward is None:
            raise AssertionError(f"attempt {attempt.attempt_id} has no verified outcome but was kept; "
                                 "the sampler must drop such groups")
        ids, mask = episode_tokens(attempt, self.tokenizer, self.config.max_len)
        start = mask.index(1) if 1 in mask else len(ids) - 1
        logprobs = self._logprobs(traj, ids, mask, model)
        return {"prompt_ids": ids[:start], "completion_ids": ids[start:], "env_mask": mask[start:],
                "logprobs": logprobs[start:], "verified_reward": float(attempt.reward),
                "attempt_id": attempt.attempt_id}

    def _logprobs(self, traj: Trajectory, ids: list[int], mask: list[int], model: Any) -> list[float]:
        sampled = [s for s in traj.steps if s.role == "assistant"]
        recorded = [getattr(s, "logprobs", None) for s in sampled]
        if sampled and all(lp is not None and s.token_ids is not None and len(lp) == len(s.token_ids)
                           for s, lp in zip(sampled, recorded)):
            # The harness kept the sampler's own logprobs (Step.logprobs): loss tokens are exactly the
            # sampled ids of the assistant steps, in order (a forked prefix has none, so it never gets here).
            flat = iter([x for lp in recorded for x in lp])  # type: ignore[union-attr]
            return [next(flat) if m else 0.0 for m in mask]
        import torch

        with torch.no_grad():  # the rollout weights are still the current ones: this is the sampling distribution
            model.eval()
            logits = model(input_ids=torch.tensor([ids], device=next(model.parameters()).device)).logits[0].float()
            lp = torch.log_softmax(logits[:-1] / self.config.temperature, -1).gather(
                -1, torch.tensor(ids[1:], device=logits.device)[:, None]).squeeze(-1)
        per_token = [0.0] + lp.tolist()
        return [p if m else 0.0 for p, m in zip(per_token, mask)]

    def _placeholder(self, task: Task) -> dict[str, Any]:
        from components.core.rendering import render_prompt

        end = self.tokenizer.eos_token_id  # a finished, empty turn: TRL counts it as terminated, not truncated
        return {"prompt_ids": render_prompt(steps_to_messages(initial_steps(task, self.recipe)), self.tokenizer),
                "completion_ids": [end], "env_mask": [0], "logprobs": [0.0], "verified_reward": 0.0,
                "attempt_id": ""}

    def gather(self) -> None:
        """Under several processes: every rank's records and dropped groups, in rank order, on every rank."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (self.records, self.dropped_groups))
        self.records = [r for records, _ in parts for r in records]
        self.dropped_groups = sum(dropped for _, dropped in parts)

    def summary(self) -> dict[str, float]:
        return {**summarize(self.records), "dropped_groups": float(self.dropped_groups)}


def grpo_args(config: RLConfig, out: Path, **overrides: Any) -> Any:
    """GRPOConfig from RLConfig: one optimizer step per batch of `batch_prompts` groups of N."""
    from trl import GRPOConfig

    r = config.rollout
    args: dict[str, Any] = dict(
        output_dir=str(out / "trl"), max_steps=config.steps, learning_rate=config.learning_rate,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, num_generations=r.group_size,
        per_device_train_batch_size=r.group_size, gradient_accumulation_steps=r.batch_prompts,
        num_iterations=config.epochs_per_batch, epsilon=config.clip_eps,
        epsilon_high=config.clip_eps_high or config.clip_eps, beta=config.kl_coef, temperature=config.temperature,
        logging_steps=1, report_to="none", save_strategy="no", seed=config.seed, dataloader_num_workers=0,
        lr_scheduler_type="constant", max_completion_length=config.max_len, use_cpu=not _cuda(), bf16=False, shuffle_dataset=True,
        # CPU processes (tests, laptops) talk over gloo; GPUs over NCCL, which accelerate picks itself.
        ddp_backend="gloo" if world_size() > 1 and not _cuda() else None,
    )
    if use_vllm(config):
        args.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                    vllm_max_model_length=config.max_len)
    args.update(config.trl_args)
    args.update(overrides)
    return GRPOConfig(**args)


def use_vllm(config: RLConfig) -> bool:
    """Whether rollouts sample through vLLM: `use_vllm` True needs it installed, 'auto' takes it when it can."""
    import importlib.util

    available = importlib.util.find_spec("vllm") is not None
    if config.use_vllm is True and not available:
        raise ValueError("rl.use_vllm=true but vllm is not installed; install it (scripts/gpu_check.sh pins a "
                         "version TRL 1.16 accepts) or set rl.use_vllm to false or 'auto'")
    if config.use_vllm is True and not _cuda():
        raise ValueError("rl.use_vllm=true needs a CUDA GPU (vLLM's colocate mode shares the training GPU); "
                         "set rl.use_vllm to false or 'auto' on a CPU machine")
    return config.use_vllm is True or (config.use_vllm == "auto" and available and _cuda())


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def train_rl_trl(config: RLConfig, tasks: dict[str, Task], model_dir: str | Path, out: Path,
                 tracking: TrackingConfig | None = None) -> RLResult:
    """`train_rl` with `engine="trl"`: GRPOTrainer over `TRLRollout`; writes the policy and rollout records."""
    import time

    from datasets import Dataset
    from trl import GRPOTrainer

    from components.core.modeling import load_policy
    from components.recipes import get_recipe

    model, tokenizer = load_policy(model_dir)
    t0 = time.perf_counter()
    main = is_main_process()  # under accelerate/torchrun every rank rolls out its slice; one writes and logs
    with stage_run("rl", config, tracking if main else None), config.sandbox.client() as client:
        rollout = TRLRollout(tasks, get_recipe(config.recipe, **config.recipe_options), client, config, tokenizer,
                             TrajectoryStore(out / "rollouts") if config.save_rollouts else None)
        try:
            trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[verified_reward],
                                  args=grpo_args(config, out), train_dataset=Dataset.from_list(rollout.dataset_rows()),
                                  rollout_func=rollout)
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
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        for i, h in enumerate(h for h in trainer.state.log_history if "loss" in h):
            log_metrics({k: float(v) for k, v in h.items() if isinstance(v, (int, float))}, step=i)
        totals = rollout.summary()
        result = RLResult(
            model_dir=str(out), sampler=config.rollout.sampler, steps_done=int(trainer.state.global_step),
            trajectories=int(totals["trajectories"]), informative_groups=int(totals["informative_groups"]),
            informative_groups_per_trajectory=totals["informative_groups_per_trajectory"],
            infra_errors=int(totals["aborted_attempts"]),
            stop_reason="budget" if rollout.budget.remaining <= 0 else "steps", records_path=str(records_path),
            metrics={**totals, "steps_done": float(trainer.state.global_step),
                     "train_seconds": time.perf_counter() - t0,
                     "final_loss": losses[-1] if losses else float("nan")},
        )
        log_metrics({f"final.{k}": v for k, v in result.metrics.items()})
        if main:
            (out / "rl_result.json").write_text(result.model_dump_json(indent=2))  # the gate reads steps_done
            log_json(result.model_dump(mode="json"), "rl_result.json")
    return result
