"""Our episodes as GRPOTrainer's rollout_func (`components/rl/rollout.py`): what reaches TRL's objective and
rewards. Tiny policy, real sandboxes, real verifier.

Tasks and starting policy: the `rl_inputs` fixture (tests/components/conftest.py), shared with test_rl_stage.
"""

from __future__ import annotations

import torch

from components.core.episode.harness import HarnessConfig
from components.core.policy.base import GenerationConfig
from components.core.data.parquet_store import TaskStore
from tests.components.rl.test_rl_stage import _config


def _trainer(rl_inputs, config, client, tmp_path):
    from datasets import Dataset
    from trl import GRPOTrainer

    from components.core.policy.modeling import load_policy
    from components.core.data.parquet_store import TaskStore
    from components.recipes import get_recipe
    from components.rl.stage import grpo_args, reward_functions
    from components.rl.rollout import TRLRollout

    model, tokenizer = load_policy(rl_inputs / "sft")
    tasks = {t.id: t for t in TaskStore(rl_inputs / "tasks").read(split="train")}
    rollout = TRLRollout(tasks, get_recipe("swe"), client, config, tokenizer)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward_functions(),
        args=grpo_args(config, tmp_path),
        train_dataset=Dataset.from_list(rollout.dataset_rows()),
        rollout_func=rollout,
    )
    return trainer, rollout


def _coin_pair(rl_inputs, sandbox_service, tmp_path, max_steps: int):
    """One group of N = 2 of the coin task through TRL's own `_generate_and_score_completions` (trainer, rollout,
    TRL's batch). Up to 16 coin flips for one mixed pair (a group of one reward has odds 2^-15, not 2^-7), in
    waves of 4, so the pool always holds more attempts than the group."""
    from components.rl.sampling import RolloutConfig

    config = _config(
        sandbox_service,
        harness=HarnessConfig(max_steps=max_steps, generation=GenerationConfig(max_new_tokens=10)),
        rollout=RolloutConfig(
            group_size=2, max_rollouts_per_prompt=16, stride=4, rho_min=0.5, rho_max=0.5, batch_prompts=1
        ),
    )
    with config.sandbox.client() as client:
        trainer, rollout = _trainer(rl_inputs, config, client, tmp_path)
        coin = next(r for r in rollout.dataset_rows() if r["task_id"] == "coin")
        batch = trainer._generate_and_score_completions([dict(coin), dict(coin)])  # TRL writes into each row
        rollout.close()
    return trainer, rollout, batch


def test_tool_tokens_carry_no_loss_in_trls_objective(rl_inputs, sandbox_service, tmp_path):
    """Perturbing the model's output (final hidden state, hence logits) wherever env_mask is 0 (tool observations,
    chat markup) leaves
    TRL's loss and its gradient unchanged; perturbing one sampled token's logits changes the gradient."""
    trainer, rollout, batch = _coin_pair(rl_inputs, sandbox_service, tmp_path, max_steps=2)
    assert rollout.records[0].kept and batch["advantages"].abs().sum() > 0
    keep = batch["completion_mask"] * batch["tool_mask"]
    assert (keep == 0).any() and (keep == 1).any()  # both tool/markup and sampled tokens in the completions
    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call compute_loss directly
    completion_len = batch["completion_ids"].shape[1]

    calls: list = []

    def loss_and_grads(rows_to_perturb):
        def hook(_module, _args, logits):
            first = logits.shape[1] - completion_len - 1  # logit row predicting completion token 0
            noise = torch.zeros_like(logits)
            gen = torch.Generator().manual_seed(0)
            for b, j in rows_to_perturb(first, logits.shape[1]):
                noise[b, j] = 5 * torch.randn(logits.shape[-1], generator=gen)
            calls[-1] += 1
            return logits + noise

        calls.append(0)
        # TRL's fused head computes logprobs from the final hidden states without materialising logits, so
        # the probe perturbs those rows: each one feeds exactly the logits at its own position.
        handle = model.model.norm.register_forward_hook(hook)
        try:
            model.zero_grad()
            loss = trainer.compute_loss(model, batch)
            loss.backward()
        finally:
            handle.remove()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def masked(first, length):  # every prompt row and every completion row whose token has env_mask 0
        rows = [(b, j) for b in range(keep.shape[0]) for j in range(first)]
        return rows + [(b, first + j) for b in range(keep.shape[0]) for j in range(completion_len) if keep[b, j] == 0]

    base_loss, base_grads = loss_and_grads(lambda first, length: [])
    loss, grads = loss_and_grads(masked)
    assert torch.isfinite(base_loss) and base_grads and len(calls) == 2 and all(calls)
    assert torch.allclose(loss, base_loss, atol=1e-7, rtol=0)
    for name, g in base_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-7, rtol=0), name
    sampled = [(b, j) for b in range(keep.shape[0]) for j in range(completion_len) if keep[b, j] == 1][:1]
    _, control = loss_and_grads(lambda first, length: [(b, first + j) for b, j in sampled])
    # The probe does reach the objective (its value is ratio 1 on-policy, so the gradient shows it).
    assert any(not torch.allclose(control[n], g, atol=1e-7, rtol=0) for n, g in base_grads.items())


def test_trl_trains_on_the_samplers_pool_advantages_unchanged(rl_inputs, sandbox_service, tmp_path):
    """Under the pool rule (the default) the advantages in TRL's batch are exactly the ones the sampler gave the
    group (GRPO over the prompt's whole pool of >= 4, weighted: sampling/sampler.py deviation 2, at least +-1.73
    for a mixed pool), not TRL's own (r - mean) [/ std] of the pair's verified rewards (+-1 or +-0.707)."""
    import pytest

    _, rollout, batch = _coin_pair(rl_inputs, sandbox_service, tmp_path, max_steps=1)
    (record,) = rollout.records
    assert record.kept and record.group_positives == 1
    positives, negatives = record.pool_positives, record.pool_negatives
    mean = (positives - negatives) / (positives + negatives)
    std = (1 - mean**2) ** 0.5
    expected = sorted([(1 - mean) / std * positives, (-1 - mean) / std * negatives])  # one member stands for its side
    assert sorted(record.group_advantages) == pytest.approx(expected)
    assert batch["advantages"].tolist() == pytest.approx(record.group_advantages, abs=1e-6)
    assert record.generated >= 4 and min(abs(a) for a in batch["advantages"].tolist()) > 1.7


class _FlakyClient:
    """The real client, but sandbox creation crashes on every 3rd episode and the first verification to start
    times out (both infrastructure failures the harness must attribute, never rewards). The timeout is counted
    per verification, not per create: episodes are created concurrently, so a sandbox picked by its create's
    number could share its group with a crash and be cancelled before it ever verified."""

    def __init__(self, client):
        import itertools

        self._client, self.created, self.verifications = client, 0, itertools.count()

    def __getattr__(self, name):
        return getattr(self._client, name)

    def create(self, spec, **kw):
        import httpx

        self.created += 1
        if self.created % 3 == 0:
            raise httpx.ConnectError("injected: sandbox service crashed")
        return _TimingOut(self._client.create(spec, **kw), self.verifications)


class _TimingOut:
    def __init__(self, sandbox, verifications):
        self._sandbox, self._verifications = sandbox, verifications

    def __getattr__(self, name):
        return getattr(self._sandbox, name)

    def verifying(self):
        import httpx

        if next(self._verifications) == 0:
            raise httpx.ReadTimeout("injected: verification timed out")
        return self._sandbox.verifying()


def test_injected_crashes_and_timeouts_never_reach_a_reward(rl_inputs, sandbox_service, tmp_path):
    from types import SimpleNamespace

    from components.core.policy.modeling import load_policy
    from components.core.data.schema import Outcome
    from components.core.data.parquet_store import TrajectoryStore
    from components.recipes import get_recipe
    from components.rl.rollout import TRLRollout

    config = _config(sandbox_service)
    model, tokenizer = load_policy(rl_inputs / "sft")
    tasks = {t.id: t for t in TaskStore(rl_inputs / "tasks").read(split="train")}
    store = TrajectoryStore(tmp_path / "episodes")
    trainer = SimpleNamespace(num_generations=2, model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    with config.sandbox.client() as client:
        flaky = _FlakyClient(client)
        rollout = TRLRollout(tasks, get_recipe("swe"), flaky, config, tokenizer, store)
        coin = next(r["prompt"] for r in rollout.dataset_rows() if r["task_id"] == "coin")
        out = rollout([coin] * 6, trainer)  # three groups of N=2
        rollout.close()
    episodes = {t.id: t for t in store.read()}
    infra = {i for i, t in episodes.items() if t.outcome is Outcome.infra_error}
    reasons = " ".join(t.outcome_reason or "" for t in episodes.values())
    assert "injected: sandbox service crashed" in reasons and "injected: verification timed out" in reasons
    assert len(out["verified_reward"]) == 6 and not infra & set(out["attempt_id"])
    for i in range(0, 6, 2):
        ids, rewards = out["attempt_id"][i : i + 2], out["verified_reward"][i : i + 2]
        if ids == ["", ""]:  # a dropped group: equal rewards and no loss-bearing token
            assert rewards == [None, None] and all(not any(m) for m in out["env_mask"][i : i + 2])
        else:
            assert sorted(rewards) == [-1.0, 1.0] and all(episodes[a].outcome is not Outcome.infra_error for a in ids)
    assert sum(r.pool_aborted for r in rollout.records) == len(infra) > 0
    assert rollout.dropped_groups == sum(not r.kept for r in rollout.records)


def test_a_prompt_the_history_skips_spends_no_episode_and_sends_placeholders(rl_inputs, sandbox_service, tmp_path):
    """`rollout.history` under TRL: a prompt whose recent groups were all one reward is skipped (no sandbox, no
    episode, the record says so) and TRL gets its group as placeholder rows that carry no loss."""
    from types import SimpleNamespace

    from components.core.policy.modeling import load_policy
    from components.core.data.parquet_store import TrajectoryStore
    from components.recipes import get_recipe
    from components.rl.rollout import TRLRollout
    from components.rl.sampling import RolloutConfig

    config = _config(
        sandbox_service,
        rollout=RolloutConfig(
            group_size=2,
            max_rollouts_per_prompt=8,
            stride=2,
            rho_min=0.5,
            rho_max=0.5,
            batch_prompts=1,
            history=True,
            skip_explore=0.0,
        ),
    )
    model, tokenizer = load_policy(rl_inputs / "sft")
    tasks = {t.id: t for t in TaskStore(rl_inputs / "tasks").read(split="train")}
    store = TrajectoryStore(tmp_path / "episodes")
    trainer = SimpleNamespace(num_generations=2, model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    with config.sandbox.client() as client:
        rollout = TRLRollout(tasks, get_recipe("swe"), client, config, tokenizer, store)
        rollout.history.get("coin").uniform_streak = config.rollout.skip_after_uniform_visits  # all-one-reward so far
        coin = next(r["prompt"] for r in rollout.dataset_rows() if r["task_id"] == "coin")
        out = rollout([coin] * 2, trainer)
        rollout.close()
    assert [(r.rule, r.generated, r.kept) for r in rollout.records] == [("skipped", 0, False)]
    assert not (tmp_path / "episodes").exists() and rollout.budget.spent == 0  # no episode ran
    assert (
        out["attempt_id"] == ["", ""] and out["verified_reward"] == [None, None] and not any(sum(out["env_mask"], []))
    )
    assert rollout.dropped_groups == 1


def test_lookahead_is_refused_in_the_rl_stage():
    import pytest
    from pydantic import ValidationError

    from components.rl.config import RLConfig
    from components.rl.sampling import RolloutConfig

    with pytest.raises(ValidationError, match="lookahead cannot apply"):
        RLConfig(rollout=RolloutConfig(history=True, lookahead=4))


def test_the_prompts_of_a_batch_share_each_batched_forward(rl_inputs, sandbox_service, tmp_path):
    """Two prompts per generation batch: their waves run at once, so one batched forward serves rows of both
    (more rows than one prompt's stride); one prompt after another never fills a batch beyond a stride."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from components.core.policy.modeling import load_policy
    from components.recipes import get_recipe
    from components.rl.rollout import TRLRollout
    from components.rl.sampling import RolloutConfig
    from components.rl.stage import grpo_args, reward_functions

    config = _config(
        sandbox_service,
        harness=HarnessConfig(max_steps=2, generation=GenerationConfig(max_new_tokens=6)),
        rollout=RolloutConfig(
            sampler="fixed", group_size=2, max_rollouts_per_prompt=2, stride=2, batch_prompts=2, refill=False
        ),
    )
    coin = next(t for t in TaskStore(rl_inputs / "tasks").read() if t.id == "coin")
    tasks = {t.id: t for t in (coin, coin.model_copy(update={"id": "coin2", "prompt": "Flip another coin."}))}
    model, tokenizer = load_policy(rl_inputs / "sft")
    with config.sandbox.client() as client:
        rollout = TRLRollout(tasks, get_recipe("swe"), client, config, tokenizer)
        rows = rollout.dataset_rows()
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=reward_functions(),
            args=grpo_args(config, tmp_path),
            train_dataset=Dataset.from_list(rows),
            rollout_func=rollout,
        )
        trainer._generate_and_score_completions([dict(rows[0]), dict(rows[0]), dict(rows[1]), dict(rows[1])])
        sizes = list(rollout._source.policy.batch_sizes)
        rollout.close()
    assert {r.prompt_id for r in rollout.records} == {"coin", "coin2"}
    assert max(sizes) > config.rollout.stride, sizes
