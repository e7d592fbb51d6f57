"""What `TRLRollout` hands TRL, row by row, on synthetic episodes (no sandbox, no generation): short
fixed groups, TRL's truncation flag, placeholder rows that carry no reward, and a forked attempt's logprobs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from components.core.policy.modeling import TokenizerConfig
from components.tiny_model import build_tokenizer
from components.core.rendering.tokens import tokenizer_id
from components.core.data.schema import EnvironmentSpec, EpisodeStatus, Outcome, Step, Task, Trajectory
from components.recipes import get_recipe
from components.rl.config import RLConfig
from components.rl.rollout import TRLRollout, verified_reward
from components.rl.sampling import Attempt, RolloutConfig


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TokenizerConfig(corpus_tasks=4))


def _turn(tokenizer, index: int, text: str, logprob: float) -> Step:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Step(
        index=index,
        role="assistant",
        content=text,
        token_ids=ids,
        logprobs=[logprob] * len(ids),
        tokenizer_id=tokenizer_id(tokenizer),
    )


def _episode(
    tokenizer,
    reward: float | None,
    status=EpisodeStatus.completed,
    prefix_logprob: float | None = None,
    own_logprob: float = -0.5,
) -> Trajectory:
    """system, user, [a forked prefix: an assistant turn and its observation], the policy's own turn."""
    steps = [Step(index=0, role="system", content="You fix bugs."), Step(index=1, role="user", content="Fix it.")]
    prefix_len = 0
    if prefix_logprob is not None:
        steps += [
            _turn(tokenizer, 2, "teacher reads the file", prefix_logprob),
            Step(index=3, role="tool", content="def add(a, b): return a - b"),
        ]
        prefix_len = 4
    steps.append(_turn(tokenizer, len(steps), "the policy submits", own_logprob))
    outcome = {1.0: Outcome.resolved, -1.0: Outcome.unresolved, None: Outcome.infra_error}[reward]
    return Trajectory(
        task_id="t",
        recipe="swe",
        policy_id="p",
        steps=steps,
        outcome=outcome,
        status=status,
        metadata={"tool_format": "protocol", "prefix_len": prefix_len},
    )


class ListSource:
    """Hands out prepared attempts in order, per prompt (what `EpisodeSource` would have produced)."""

    def __init__(self, attempts: list[Attempt] | dict[str, list[Attempt]]):
        self.attempts = (
            {k: list(v) for k, v in attempts.items()} if isinstance(attempts, dict) else {"t": list(attempts)}
        )
        self.finished, self.policy, self.calls = [], None, []

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        self.calls.append(prompt_id)
        out, self.attempts[prompt_id] = self.attempts[prompt_id][:n], self.attempts[prompt_id][n:]
        return out


def _rollout(tokenizer, attempts, n: int, tasks=("t",), **rollout) -> tuple[TRLRollout, dict]:
    prompts = {"t": "Fix it.", "u": "Fix the other one.", "v": "And this."}
    found = {
        i: Task(id=i, recipe="swe", split="train", prompt=prompts[i], environment=EnvironmentSpec(files={}))
        for i in tasks
    }
    config = RLConfig(
        rollout=RolloutConfig(group_size=n, max_rollouts_per_prompt=n, stride=n, batch_prompts=1, **rollout)
    )
    rollout_func = TRLRollout(found, get_recipe("swe"), None, config, tokenizer)
    model = SimpleNamespace(training=True, train=lambda mode=True: None)
    rollout_func._model, rollout_func._source = model, ListSource(attempts)
    trainer = SimpleNamespace(num_generations=n, model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    prompt = next(r["prompt"] for r in rollout_func.dataset_rows() if r["task_id"] == "t")
    return rollout_func, rollout_func([prompt] * n, trainer)


def _attempt(traj: Trajectory, prefix_steps: int = 0) -> Attempt:
    reward = None if traj.outcome is Outcome.infra_error else (1.0 if traj.resolved else -1.0)
    return Attempt(reward=reward, status=traj.status, attempt_id=traj.id, payload=traj, prefix_steps=prefix_steps)


def test_a_fixed_group_short_of_n_is_dropped_and_not_counted_informative(tokenizer):
    crashed = _episode(tokenizer, None, EpisodeStatus.aborted)
    attempts = [_attempt(_episode(tokenizer, r)) for r in (1.0, -1.0, 1.0)] + [_attempt(crashed)]
    rollout, out = _rollout(tokenizer, attempts, 4, sampler="fixed")
    (record,) = rollout.records
    assert (record.kept, record.drop_reason) == (False, "short")
    assert rollout.summary()["informative_groups"] == 0 and rollout.dropped_groups == 1
    assert out["attempt_id"] == [""] * 4


def test_an_episode_that_ended_ends_on_its_end_token_and_a_cut_one_does_not(tokenizer):
    """TRL: truncated = last completion token not an end/pad token (clipped_ratio, mask_truncated_completions)."""
    ends = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    finished = [_attempt(_episode(tokenizer, r)) for r in (1.0, -1.0)]
    _, out = _rollout(tokenizer, finished, 2)
    assert all(ids[-1] in ends for ids in out["completion_ids"])
    cut = [_attempt(_episode(tokenizer, r, EpisodeStatus.truncated)) for r in (1.0, -1.0)]
    _, out = _rollout(tokenizer, cut, 2)
    assert all(ids[-1] not in ends for ids in out["completion_ids"])
    # no loss token is lost to the trim: the sampled end token stays
    assert all(
        sum(m) == len(tokenizer.encode("the policy submits", add_special_tokens=False)) + 1 for m in out["env_mask"]
    )


def test_placeholder_rows_carry_no_reward_and_leave_the_batch_std_alone(tokenizer):
    from trl.trainer.utils import nanstd

    _, kept = _rollout(tokenizer, [_attempt(_episode(tokenizer, r)) for r in (1.0, 1.0, -1.0, -1.0)], 4)
    _, dropped = _rollout(tokenizer, [_attempt(_episode(tokenizer, -1.0)) for _ in range(4)], 4)
    assert dropped["verified_reward"] == [None] * 4
    rewards = verified_reward([], [], kept["verified_reward"] + dropped["verified_reward"] * 3)

    def batch_scaled(values):  # TRL's scale_rewards="batch": None -> NaN, nan-aware mean and std
        r = torch.tensor([math.nan if v is None else v for v in values])
        mean = torch.nanmean(r.view(-1, 4), dim=1).repeat_interleave(4)
        return torch.nan_to_num((r - mean) / (nanstd(r) + 1e-4), nan=0.0)

    alone = batch_scaled(kept["verified_reward"])
    assert batch_scaled(rewards)[:4].tolist() == pytest.approx(alone.tolist())
    assert batch_scaled(rewards)[4:].abs().sum() == 0
    assert alone[0].item() == pytest.approx(0.866, abs=1e-3)


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "luspo", "dr_grpo", "bnpo"])
def test_loss_types_that_average_over_rows_are_refused(loss_type):
    with pytest.raises(ValueError, match="placeholder rows"):
        RLConfig(trl_args={"loss_type": loss_type})
    assert RLConfig(trl_args={"loss_type": "dapo"}).trl_args["loss_type"] == "dapo"


def test_a_forked_attempt_gets_its_own_turns_logprobs_not_its_prefixs(tokenizer):
    forked = [
        _attempt(_episode(tokenizer, r, prefix_logprob=-9.0, own_logprob=-0.5), prefix_steps=1) for r in (1.0, -1.0)
    ]
    _, out = _rollout(tokenizer, forked, 2)
    for mask, logprobs in zip(out["env_mask"], out["logprobs"]):
        assert sum(mask) > 0 and {lp for m, lp in zip(mask, logprobs) if m} == {-0.5}


@pytest.mark.parametrize("refill", [False, True])
def test_refill_replaces_a_dropped_group_by_another_prompts_kept_group(tokenizer, refill):
    """BAR's "replenished from other tasks" inside rollout_func: TRL dealt `t`, whose group is all failures;
    with refill the N rows TRL gets are a kept group of `u` or `v` (their own prompt ids and rewards)."""
    flat = [_attempt(_episode(tokenizer, -1.0)) for _ in range(2)]
    uniform = [_attempt(_episode(tokenizer, 1.0)) for _ in range(2)]
    mixed = [_attempt(_episode(tokenizer, r)) for r in (1.0, -1.0)]
    rollout, out = _rollout(
        tokenizer,
        {"t": flat, "u": uniform, "v": mixed},
        2,
        tasks=("t", "u", "v"),
        refill=refill,
        max_prompts_per_batch=4,
    )
    assert rollout.records[0].prompt_id == "t" and rollout.records[0].drop_reason == "zero_std"
    summary = rollout.summary()
    if not refill:
        assert out["attempt_id"] == ["", ""] and rollout.dropped_groups == 1 and summary["informative_groups"] == 0
        assert rollout._source.calls == ["t"]
        return
    assert rollout.replacements == 1 and rollout.dropped_groups == 0 and summary["replacement_groups"] == 1
    kept = [r for r in rollout.records if r.kept]
    assert [(r.prompt_id, r.replaces) for r in kept] == [("v", "t")] and summary["informative_groups"] == 1
    assert out["attempt_id"] == [a.attempt_id for a in mixed] and sorted(out["verified_reward"]) == [-1.0, 1.0]
    assert "t" not in rollout._source.calls[1:]  # the batch's own prompt is never its own replacement
