"""The rollout side of the RL stage: our sandbox episodes as `GRPOTrainer`'s `rollout_func`.

`EpisodeSource` is the sampler's `RolloutSource` over real episodes: the task's sandbox, the policy, the
verifier's reward (+1 resolved / -1 unresolved; an `infra_error` episode has no reward). `TRLRollout` is
the `rollout_func`. For each group of `num_generations` identical prompts TRL hands it, it runs our
multi-turn harness episodes through the sampler (`sample_prompt`: BAR or fixed groups, each group of N
chosen from up to N_max attempts) and returns per completion:

- `prompt_ids`: the episode up to the first sampled token (system, task, assistant header; for a
  prefix-forked attempt also the teacher's prefix, which is context only);
- `completion_ids`: the rest of the episode, every assistant turn as sampled and every tool observation;
- `env_mask`: 1 on sampled assistant tokens, 0 on tool/environment tokens and chat markup (no loss);
- `logprobs`: the rollout logprobs of sampled tokens (`Step.logprobs` when the harness recorded them,
  else one no-grad forward of the rollout weights at the sampling temperature); 0 on env tokens;
- `verified_reward`: +1 / -1, read by `verified_reward` (the reward function TRL's group advantages come
  from under `rollout.advantage_baseline="group"`);
- `advantage`: the sampler's advantage of the attempt, read by `sampler_advantage` (the one the update uses
  under `"pool"`, the default: GRPO over the prompt's whole pool, sampling/sampler.py deviation 2).

A group the sampler does not keep (an attempt without a verified outcome, zero variance, abandoned,
budget spent), and a fixed-size group left with fewer than N verified attempts (its record is marked
dropped, `short`, so it is not counted informative), is sent as N placeholder rows: the bare prompt, one
end-of-turn token with env_mask 0, reward None for all N, so TRL leaves them out of its reward means and
stds, gives them advantage 0, and no token carries loss (loss types that average over rows, grpo / sapo /
luspo / dr_grpo, would still count them: `RLConfig` refuses those). The infra-error episode's tokens
and reward never leave this module; `TRLRollout.dropped_groups` counts such groups. With
`rollout.refill` a dropped group is first replaced by a kept group of another training prompt (its own
prompt ids and rewards; `TRLRollout.replacements`, `PromptRecord.replaces`).

The prompts of a generation batch are sampled at the same time (a thread each), so with `batch_rollouts`
every live episode of every prompt shares one batched forward per turn (`BatchingPolicy`, up to
`batch_prompts x stride` rows); the global budget may then be overrun by the waves already in flight.
Generation is HF `generate` through our policy (batched, `BatchingPolicy`), or with
`RLConfig.use_vllm` TRL's colocated vLLM engine (`VLLMPolicy`, still batched per wave; TRL syncs the
weights into it before each step's rollout). vLLM's server mode is not wired: its client lives on rank 0
only, while every rank runs its own multi-turn episodes here.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from components.core.distributed import world_size
from components.core.data.episode_traces import log_episode_traces
from components.core.episode.harness import HarnessConfig, initial_steps, run_episode, steps_to_messages
from components.core.data.schema import EpisodeStatus, Outcome, Task, Trajectory
from components.core.data.parquet_store import TrajectoryStore
from components.rl.sampling import (
    Attempt,
    PromptHistory,
    PromptRecord,
    RolloutBudget,
    outcome_reward,
    sample_prompt,
    skipped_record,
    summarize,
)

if TYPE_CHECKING:
    from components.rl.config import RLConfig

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16


class EpisodeSource:
    """`RolloutSource` over real episodes: the task's sandbox, the policy, the verifier's reward."""

    def __init__(
        self,
        tasks: dict[str, Task],
        recipe: Any,
        policy: Any,
        client: Any,
        config: RLConfig,
        store: TrajectoryStore | None = None,
        references: dict[str, Trajectory] | None = None,
    ):
        self.tasks, self.recipe, self.policy, self.client, self.config = tasks, recipe, policy, client, config
        self.store = store
        self.references = references or {}  # task id -> a resolved trajectory to fork from
        self.episodes = 0
        self._episode_numbers = itertools.count(1)  # prompts sample concurrently: one counter, no lost update
        self.finished: list[Trajectory] = []  # the current call's episodes, for its partial-progress metrics

    def _harness(self, extra_turns: int = 0) -> HarnessConfig:
        self.episodes = number = next(self._episode_numbers)
        generation = self.config.harness.generation.model_copy(
            update={"temperature": self.config.temperature, "seed": self.config.seed * 1_000_003 + number}
        )
        return self.config.harness.model_copy(
            update={"generation": generation, "max_steps": self.config.harness.max_steps + extra_turns}
        )

    def _attempts(self, trajectories: list[Trajectory], prefix_tool_steps: int = 0) -> list[Attempt]:
        if self.store is not None:
            self.store.append(trajectories)
        self.finished.extend(trajectories)
        return [
            Attempt(
                reward=outcome_reward(t),
                status=t.status,
                attempt_id=t.id,
                payload=t,
                prefix_steps=prefix_tool_steps,
                env_steps=sum(s.role == "tool" for s in t.steps[t.metadata.get("prefix_len", 0) :]),
            )
            for t in trajectories
        ]

    def has_prefix(self, prompt_id: str) -> bool:
        from components.credit.base import assistant_positions

        return prompt_id in self.references and len(assistant_positions(self.references[prompt_id])) >= 2

    def fork(self, prompt_id: str, n: int, fraction: float) -> list[Attempt]:
        """n episodes continuing from the state after the first `fraction` of the reference's assistant
        steps: the sandbox forks that step's snapshot, or (none kept) the prefix's tool calls are replayed."""
        from components.credit.base import assistant_positions, state_end

        ref = self.references[prompt_id]
        positions = assistant_positions(ref)
        turns = max(1, min(len(positions) - 1, round(fraction * len(positions))))
        prefix = ref.steps[: state_end(ref, positions[turns - 1])]
        snapshot = prefix[-1].sandbox_state_id

        def one(harness: HarnessConfig) -> Trajectory:  # max_steps counts the prefix's turns too
            traj = run_episode(
                self.tasks[prompt_id],
                self.recipe,
                self.policy,
                self.client,
                harness,
                prefix_steps=prefix,
                from_snapshot=snapshot,
            )
            if snapshot and traj.outcome is Outcome.infra_error and "setup failed" in (traj.outcome_reason or ""):
                traj = run_episode(
                    self.tasks[prompt_id], self.recipe, self.policy, self.client, harness, prefix_steps=prefix
                )  # the snapshot is gone: rebuild the state by replay
            return traj

        trajectories = self._run([lambda h=self._harness(extra_turns=turns): one(h) for _ in range(n)])
        return self._attempts(trajectories, prefix_tool_steps=sum(s.role == "tool" for s in prefix))

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        task = self.tasks[prompt_id]
        return self._attempts(
            self._run(
                [
                    lambda h=self._harness(): run_episode(task, self.recipe, self.policy, self.client, h)
                    for _ in range(n)
                ]
            )
        )

    def _run(self, episodes: list) -> list[Trajectory]:
        """The wave's episodes: in threads when the policy batches their turns (`BatchingPolicy`), else in turn."""
        from components.core.policy.batching import BatchingPolicy

        if len(episodes) < 2 or not isinstance(self.policy, BatchingPolicy):
            return [run() for run in episodes]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(episodes)) as pool:
            return list(pool.map(lambda run: run(), episodes))


def episode_tokens(attempt: Attempt, tokenizer: Any, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of an attempt's episode: loss on the tokens the policy sampled, none on a forked
    attempt's teacher prefix, cut at `max_len`. Rendered in the tool format the episode was sampled in
    (`metadata["tool_format"]`, which the harness records), not the template's detected one: with an
    explicit `harness.tool_format` they differ, and so would the system prompt and every call's markup."""
    ids, loss = _whole_episode(attempt, tokenizer)
    return ids[:max_len], loss[:max_len]


def _whole_episode(attempt: Attempt, tokenizer: Any) -> tuple[list[int], list[int]]:
    from components.core.rendering.tokens import render_trajectory

    s = render_trajectory(
        attempt.payload, tokenizer, loss_on="assistant", tool_format=attempt.payload.metadata.get("tool_format")
    )
    prefix_len = attempt.payload.metadata.get("prefix_len", 0) if attempt.forked else 0
    return s.input_ids, [m if i >= prefix_len else 0 for m, i in zip(s.loss_mask, s.step_index)]


def _end_turn(ids: list[int], mask: list[int], tokenizer: Any, truncated: bool) -> tuple[list[int], list[int]]:
    """The episode as TRL judges its end: TRL calls a completion truncated when its last token is not an end
    token. The template's glue after the final end-of-turn token (ChatML's newline after `<|im_end|>`, no
    loss) goes, so an episode that ended (the agent submitted) ends on its end token; one cut by a step,
    token or wall-clock limit, or at `max_len`, keeps a last token that is no end token (else TRL's
    `clipped_ratio` and `mask_truncated_completions` would see every episode alike)."""
    from components.core.rendering.tokens import chat_format

    stops = chat_format(tokenizer).stop_ids | ({tokenizer.pad_token_id} - {None})
    last = max((i for i, t in enumerate(ids) if t in stops), default=None)
    if not truncated:
        if last is not None and not any(mask[last + 1 :]):
            return ids[: last + 1], mask[: last + 1]
        return ids, mask
    if ids and ids[-1] in stops:  # a cut right after an end token still reads as a cut
        return ids[:-1], mask[:-1]
    return ids, mask


def step_curves(episodes: list[Trajectory], records: list[PromptRecord]) -> dict[str, float]:
    """The rollout's headline curves of one optimizer step (components.core.tracking.curve):
    1. resolved rate: the share of the step's verified on-policy episodes (no teacher prefix) that resolved their
       task (0-1; every generated episode, not only the kept groups, which the sampler balances towards one half);
    5. uniform-group share: of the prompts sampled this step (history skips excluded), the share whose verified
       attempts all agreed (all resolved or all failed), i.e. that gave no gradient."""
    from components.core.tracking import curve

    verified = [t for t in episodes if t.outcome is not Outcome.infra_error and not t.metadata.get("prefix_len")]
    sampled = [r for r in records if r.drop_reason != "skipped" and r.pool_positives + r.pool_negatives > 0]
    uniform = [r for r in sampled if r.pool_positives == 0 or r.pool_negatives == 0]
    out = {}
    if verified:
        out[curve(1, "resolved_rate")] = sum(t.resolved for t in verified) / len(verified)
    if sampled:
        out[curve(5, "uniform_group_share")] = len(uniform) / len(sampled)
    return out


def _key(prompt: list[dict]) -> str:
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in prompt], sort_keys=True)


def verified_reward(
    prompts: list, completions: list, verified_reward: list[float | None], **_: Any
) -> list[float | None]:
    """The reward function: the verifier's reward that `TRLRollout` carried with each completion; None for a
    dropped group's placeholder rows, which TRL then leaves out of every mean and std (the batch std of
    `scale_rewards="batch"`, the logged reward) and gives advantage 0."""
    return list(verified_reward)


def sampler_advantage(prompts: list, completions: list, advantage: list[float | None], **_: Any) -> list[float | None]:
    """The second reward function: the advantage the sampler gave each completion; None for placeholder rows.
    Under `rollout.advantage_baseline="pool"` `stage.grpo_args` weights it 1 and `verified_reward` 0, with
    `scale_rewards="none"`: the group's advantages sum to zero, so TRL's group centring hands them to the loss
    unchanged. Under `"group"` it is weighted 0 (logged only) and TRL computes group advantages itself."""
    return list(advantage)


class TRLRollout:
    """`rollout_func` for `GRPOTrainer`: sampler-chosen groups of real sandbox episodes (module docstring)."""

    def __init__(
        self,
        tasks: dict[str, Task],
        recipe: Any,
        client: Any,
        config: RLConfig,
        tokenizer: Any,
        store: TrajectoryStore | None = None,
        references: dict[str, Trajectory] | None = None,
    ):
        self.tasks, self.recipe, self.client, self.config, self.tokenizer = tasks, recipe, client, config, tokenizer
        self.store = store
        self.references = references or {}  # task id -> a resolved trajectory that prefix-fork starts from
        # Every rank rolls out its own groups: each gets an equal share of the global episode budget.
        share = None if config.rollout_budget is None else -(-config.rollout_budget // world_size())
        self.budget = RolloutBudget(share)
        self.history = PromptHistory(config.rollout, config.seed)
        self.records: list[PromptRecord] = []
        self.dropped_groups = 0
        self.replacements = 0  # dropped groups replaced by a kept group of another prompt (rollout.refill)
        self._refill_order = self._refill_stream()
        self._pulling = threading.Lock()
        self.calls = 0  # rollout_func calls so far (one per generation batch): the records' step
        self.traced = 0  # episodes logged as MLflow traces so far (config.traces.max_per_stage bounds the run)
        self._prompts = {_key(self.prompt(t)): t.id for t in tasks.values()}
        self._source: Any = None
        self._model: Any = None

    def prompt(self, task: Task) -> list[dict]:
        """The dataset prompt of a task: its system and user messages (what an episode starts from)."""
        return [{"role": m.role, "content": m.content} for m in steps_to_messages(initial_steps(task, self.recipe))]

    def dataset_rows(self) -> list[dict]:
        return [{"prompt": self.prompt(t), "task_id": t.id} for t in self.tasks.values()]

    def _episode_source(self, model: Any, trainer: Any = None) -> EpisodeSource:
        from components.core.policy.batching import BatchingPolicy
        from components.core.policy.local import LocalTransformersPolicy

        if self._model is not model:  # the same weights object across steps: the rollout is on-policy
            device = str(next(model.parameters()).device)
            if getattr(getattr(trainer, "args", None), "use_vllm", False):
                from components.core.policy.vllm import VLLMPolicy

                policy: Any = VLLMPolicy(trainer.vllm_generation.llm, model, self.tokenizer, device=device)
            else:
                tool_format = None if self.config.harness.tool_format == "auto" else self.config.harness.tool_format
                policy = LocalTransformersPolicy(model, self.tokenizer, device=device, tool_format=tool_format)
            if self.config.batch_rollouts:
                r = self.config.rollout  # every prompt of a batch has a wave in flight at once
                policy = BatchingPolicy(policy, max_batch=r.batch_prompts * max(r.stride, r.group_size))
            self.close()
            self._source = EpisodeSource(
                self.tasks, self.recipe, policy, self.client, self.config, self.store, self.references
            )
            self._model = model
        return self._source

    def close(self) -> None:
        if self._source is not None and hasattr(self._source.policy, "close"):
            self._source.policy.close()

    def __call__(self, prompts: list[list[dict]], trainer: Any) -> dict[str, list]:
        from components.core.policy.batching import BatchingPolicy
        from components.core.data.schema import hidden_pass_metrics
        from components.core.tracking import log_metrics

        n = trainer.num_generations
        if n != self.config.rollout.group_size:
            raise ValueError(
                f"GRPOConfig.num_generations={n} but rollout.group_size={self.config.rollout.group_size}; "
                "they are the same N"
            )
        if len(prompts) % n:
            raise ValueError(f"{len(prompts)} prompts is not whole groups of {n}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        source = self._episode_source(model, trainer)
        out: dict[str, list] = {
            k: []
            for k in (
                "prompt_ids",
                "completion_ids",
                "logprobs",
                "env_mask",
                "verified_reward",
                "advantage",
                "attempt_id",
            )
        }
        task_ids = []
        for start in range(0, len(prompts), n):
            chunk = prompts[start : start + n]
            if any(_key(p) != _key(chunk[0]) for p in chunk):
                raise ValueError(
                    "TRL handed a group of different prompts; rollout_func needs each prompt "
                    "num_generations times in a row (TRL's RepeatSampler)"
                )
            task_id = self._prompts.get(_key(chunk[0]))
            if task_id is None:
                raise ValueError(
                    "a prompt that is no task of this run; build the dataset with TRLRollout.dataset_rows()"
                )
            task_ids.append(task_id)
        exclude = set(task_ids)  # this batch's own prompts are no replacements
        pulls = [0]  # replacement prompts pulled in this call (capped by rollout.max_prompts_per_batch)

        def slot(task_id: str) -> tuple[list[dict[str, Any]], list[PromptRecord]]:
            """One dealt prompt: its kept group's rows (or a replacement's, or []), and its records."""
            own: list[PromptRecord] = []
            rows = self._group(task_id, source, model, own)
            if len(rows) != n and self.config.rollout.refill:
                rows = self._replacement(exclude, source, model, own, pulls)
            return rows, own

        try:
            # The batch's prompts are sampled at once: with a batching policy every live episode of every
            # prompt shares each batched forward (batch_prompts x stride rows), not one prompt's wave at a time.
            if len(task_ids) > 1 and isinstance(source.policy, BatchingPolicy):
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(task_ids)) as pool:
                    slots = list(pool.map(slot, task_ids))
            else:
                slots = [slot(task_id) for task_id in task_ids]
        finally:
            model.train(was_training)  # generation put it in eval mode; TRL computes the loss next
        records: list[PromptRecord] = []
        for task_id, (rows, own) in zip(task_ids, slots):
            records += own
            if len(rows) != n:
                self.dropped_groups += 1
                rows = [self._placeholder(self.tasks[task_id])] * n
            for row in rows:
                for k, v in row.items():
                    out[k].append(v)
        self.records.extend(records)
        replaced = sum(1 for r in records if r.replaces and r.kept)
        log_metrics(
            {
                **step_curves(source.finished, records),
                **{f"sampler.{k}": v for k, v in summarize(records).items()},
                "rollout.informative_groups_without_refill": float(sum(r.kept for r in records) - replaced),
                "rollout.replacement_groups": float(replaced),
                **{f"rollout.{k}": v for k, v in hidden_pass_metrics(source.finished).items()},
            },
            step=self.calls + 1,
        )  # the optimizer step this batch trains (TRL's curves use the same)
        left = self.config.traces.max_per_stage - self.traced
        if left > 0:
            sampling = self.config.harness.generation.model_dump(include={"max_new_tokens", "top_p"})
            self.traced += log_episode_traces(
                source.finished,
                self.config.traces.model_copy(update={"max_per_stage": left}),
                stage="rl",
                sampling={**sampling, "temperature": self.config.temperature},
                step=self.calls,
            )
        source.finished.clear()
        self.calls += 1
        return out

    def _group(
        self, task_id: str, source: EpisodeSource, model: Any, records: list[PromptRecord], replaces: str | None = None
    ) -> list[dict[str, Any]]:
        """The N rows of the prompt's kept group, or [] (its record, kept or not, goes to `records`)."""
        n = self.config.rollout.group_size
        # A prompt the history skips spends no episode: its group goes out as placeholders (no gradient).
        skipped = skipped_record(task_id, source, self.config.rollout, self.history, step=self.calls)
        if skipped is not None:
            records.append(skipped.model_copy(update={"replaces": replaces}))
            return []
        result = sample_prompt(
            task_id,
            source,
            self.config.rollout,
            self.budget,
            step=self.calls,
            history=self.history,
            seed=self.config.seed,
        )
        record = result.record.model_copy(update={"replaces": replaces})
        if record.kept and len(result.group) != n:
            # A fixed group that lost attempts to infra errors or wall-clock cuts is smaller than N; TRL takes
            # exactly N rows, so it goes out as placeholders and is no informative group.
            record = record.model_copy(update={"kept": False, "drop_reason": "short", "group_reward_variance": 0.0})
        records.append(record)
        return [self._row(a, model) for a in result.group] if record.kept else []

    def _replacement(
        self, exclude: set, source: EpisodeSource, model: Any, records: list[PromptRecord], pulls: list[int]
    ) -> list[dict[str, Any]]:
        """BAR's refill inside one rollout_func call: the rows of a kept group of another training prompt (with
        that prompt's own ids and rewards), or [] when none could be had within `max_prompts_per_batch` pulls,
        the budget, or the prompts not already in this batch."""
        n, dropped = self.config.rollout.group_size, records[-1].prompt_id
        while True:
            with self._pulling:  # the batch's prompts refill concurrently: one pull at a time
                task_id = self._next_replacement(exclude, pulls)
            if task_id is None:
                return []
            rows = self._group(task_id, source, model, records, replaces=dropped)
            if len(rows) == n:
                self.replacements += 1
                return rows
        return []

    def _next_replacement(self, exclude: set, pulls: list[int]) -> str | None:
        """The next training prompt to refill from (claimed: added to `exclude`, counted in `pulls`), or None
        when the pull cap, the budget or the prompts outside this batch are spent."""
        while pulls[0] < self.config.rollout.max_prompts_per_batch and self.budget.remaining > 0:
            if exclude >= set(self.tasks):
                return None
            task_id = next(self._refill_order)
            if task_id not in exclude:
                exclude.add(task_id)
                pulls[0] += 1
                return task_id
        return None

    def _refill_stream(self):
        """Training task ids forever, reshuffled on every pass (this rank's own order)."""
        import random

        from components.core.distributed import rank

        rng = random.Random(f"refill/{self.config.seed}/{rank()}")
        while True:
            order = sorted(self.tasks)
            rng.shuffle(order)
            yield from order

    def _row(self, attempt: Attempt, model: Any) -> dict[str, Any]:
        traj: Trajectory = attempt.payload
        if attempt.aborted or traj.outcome is Outcome.infra_error or attempt.reward is None:
            raise AssertionError(
                f"attempt {attempt.attempt_id} has no verified outcome but was kept; the sampler must drop such groups"
            )
        if attempt.advantage is None:
            raise AssertionError(f"attempt {attempt.attempt_id} was kept without an advantage; the sampler sets one")
        whole, whole_mask = _whole_episode(attempt, self.tokenizer)
        ids, mask = whole[: self.config.max_len], whole_mask[: self.config.max_len]
        cut = len(ids) < len(whole) or traj.status is not EpisodeStatus.completed
        ids, mask = _end_turn(ids, mask, self.tokenizer, truncated=cut)
        start = mask.index(1) if 1 in mask else len(ids) - 1
        prefix_len = traj.metadata.get("prefix_len", 0) if attempt.forked else 0
        logprobs = self._logprobs(traj, ids, mask, model, prefix_len)
        return {
            "prompt_ids": ids[:start],
            "completion_ids": ids[start:],
            "env_mask": mask[start:],
            "logprobs": logprobs[start:],
            "verified_reward": float(attempt.reward),
            "advantage": float(attempt.advantage),
            "attempt_id": attempt.attempt_id,
        }

    def _logprobs(
        self, traj: Trajectory, ids: list[int], mask: list[int], model: Any, prefix_len: int = 0
    ) -> list[float]:
        # Loss tokens are exactly the sampled ids of the assistant steps after a forked attempt's prefix, in
        # order: a prefix's own steps (a teacher's, possibly with stored logprobs) carry no loss and give none.
        sampled = [s for s in traj.steps[prefix_len:] if s.role == "assistant"]
        recorded = [getattr(s, "logprobs", None) for s in sampled]
        if sampled and all(
            lp is not None and s.token_ids is not None and len(lp) == len(s.token_ids)
            for s, lp in zip(sampled, recorded)
        ):
            # The harness kept the sampler's own logprobs (Step.logprobs).
            flat = iter([x for lp in recorded for x in lp])  # type: ignore[union-attr]
            return [next(flat) if m else 0.0 for m in mask]
        import torch

        from components.core.policy.logprobs import token_logprobs

        with torch.no_grad():  # the rollout weights are still the current ones: this is the sampling distribution
            model.eval()
            t = torch.tensor([ids], device=next(model.parameters()).device)
            per_token = [0.0] + token_logprobs(model, t, torch.ones_like(t), self.config.temperature)[0].tolist()
        return [p if m else 0.0 for p, m in zip(per_token, mask)]

    def _placeholder(self, task: Task) -> dict[str, Any]:
        from components.core.rendering.tokens import render_prompt

        end = self.tokenizer.eos_token_id  # a finished, empty turn: TRL counts it as terminated, not truncated
        return {
            "prompt_ids": render_prompt(steps_to_messages(initial_steps(task, self.recipe)), self.tokenizer),
            "completion_ids": [end],
            "env_mask": [0],
            "logprobs": [0.0],
            "verified_reward": None,
            "advantage": None,
            "attempt_id": "",
        }

    def gather(self) -> None:
        """Under several processes: every rank's records and dropped groups, in rank order, on every rank."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (self.records, self.dropped_groups, self.replacements))
        self.records = [r for records, _, _ in parts for r in records]
        self.dropped_groups = sum(dropped for _, dropped, _ in parts)
        self.replacements = sum(replaced for _, _, replaced in parts)

    def summary(self) -> dict[str, float]:
        return {
            **summarize(self.records),
            "dropped_groups": float(self.dropped_groups),
            "replacement_groups": float(self.replacements),
        }
