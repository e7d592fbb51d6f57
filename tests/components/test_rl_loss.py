"""Group advantages, the clipped token-level loss, and real update steps on the tiny policy."""

import math

import pytest
import torch

from components.core.schema import EpisodeStatus, Outcome, Trajectory
from components.rl_sampler import Attempt, RolloutBudget, RolloutConfig, sample_prompt
from components.rl_loss import collate, group_advantages, outcome_reward, policy_loss, rl_update, token_logprobs


def traj(outcome: Outcome) -> Trajectory:
    return Trajectory(task_id="t", recipe="swe", policy_id="p", outcome=outcome)


def test_rewards_come_only_from_verified_outcomes():
    assert outcome_reward(traj(Outcome.resolved)) == 1.0
    assert outcome_reward(traj(Outcome.unresolved)) == -1.0
    assert outcome_reward(traj(Outcome.infra_error)) is None


def test_group_advantages():
    assert group_advantages([1, 1, -1, -1]) == pytest.approx([1, 1, -1, -1])
    mean, std = -0.5, math.sqrt(0.75)
    assert group_advantages([1, -1, -1, -1]) == pytest.approx([(1 - mean) / std] + [(-1 - mean) / std] * 3)
    assert group_advantages([-1, -1, -1]) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("sampler", ["fixed", "bar"])
def test_infra_failures_never_enter_a_group_mean_or_std(sampler):
    verified = [traj(Outcome.resolved), traj(Outcome.unresolved), traj(Outcome.unresolved)]
    crashed = traj(Outcome.infra_error).model_copy(update={"status": EpisodeStatus.aborted})
    with pytest.raises(ValueError, match="infra_error"):
        group_advantages([outcome_reward(t) for t in verified + [crashed]])

    # The RL stage's path: episodes -> attempts (as EpisodeSource builds them) -> the sampler's group and
    # advantages. The crash must leave the group and the baseline, so the siblings get exactly the
    # verified-only advantages, not the ones counting it as a failure.
    def source(prompt_id, n):
        return [Attempt(reward=outcome_reward(t), status=t.status, attempt_id=t.id, payload=t)
                for t in (verified + [crashed])[:n]]

    config = RolloutConfig(sampler=sampler, group_size=3 if sampler == "bar" else 4, max_rollouts_per_prompt=4,
                           stride=4, rho_min=0.0, rho_max=0.5, advantage_baseline="group")
    result = sample_prompt("p", source, config, RolloutBudget())
    assert result.record.kept and [a.payload for a in result.group] == verified
    advantages = [a.advantage for a in result.group]
    assert advantages == pytest.approx(group_advantages([1, -1, -1]))
    assert advantages != pytest.approx(group_advantages([1, -1, -1, -1])[:3])  # what counting it would give
    assert result.record.pool_aborted == 1


def test_loss_is_token_level_masked_and_clipped():
    old = torch.zeros(2, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    new = torch.zeros(2, 4, requires_grad=True)
    loss, stats = policy_loss(new, old, adv, mask)
    # ratio 1: loss = -mean over the 6 loss tokens of A = -(2*1 + 4*(-1)) / 6
    assert loss.item() == pytest.approx(2 / 6)
    loss.backward()
    assert torch.equal(new.grad[0, 2:], torch.zeros(2))  # masked tokens get no gradient
    assert (new.grad[0, :2] < 0).all() and (new.grad[1] > 0).all()  # raise good tokens, lower bad ones
    # A ratio beyond 1 + eps with a positive advantage is clipped: no gradient pushes it further.
    new = torch.full((2, 4), 0.5, requires_grad=True)
    loss, stats = policy_loss(new, old, torch.tensor([1.0, 1.0]), mask, clip_eps=0.2)
    loss.backward()
    assert torch.count_nonzero(new.grad) == 0 and stats["clip_fraction"] == pytest.approx(1.0)


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it():
    mask = torch.ones(1, 3)
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    _, stats = policy_loss(lp, lp, torch.tensor([1.0]), mask, ref_logprobs=lp.clone(), kl_coef=0.1)
    assert stats["kl"] == pytest.approx(0.0)
    _, stats = policy_loss(lp, lp, torch.tensor([1.0]), mask, ref_logprobs=lp - 0.3, kl_coef=0.1)
    assert stats["kl"] > 0 and stats["loss"] == pytest.approx(stats["pg_loss"] + 0.1 * stats["kl"])


def test_micro_batches_give_the_batch_loss():
    torch.manual_seed(0)
    new, old = torch.randn(4, 5), torch.randn(4, 5)
    mask, adv = (torch.rand(4, 5) > 0.3).long(), torch.randn(4)
    whole, _ = policy_loss(new, old, adv, mask)
    n = int(mask.sum())
    parts = sum(policy_loss(new[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2],
                            num_loss_tokens=n)[0] for i in (0, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_collate_aligns_the_mask_with_predicted_tokens():
    ids, attn, mask = collate([([5, 6, 7], [0, 1, 1]), ([5, 6], [0, 1])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert attn.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mask.tolist() == [[1, 1], [1, 0]]


@pytest.fixture(scope="module")
def tiny_policy():
    from components.core.modeling import ModelConfig, TokenizerConfig, build_tiny_model, build_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds contention on a shared machine
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=8))
    yield build_tiny_model(ModelConfig(), tokenizer), tokenizer
    torch.set_num_threads(threads)


def test_real_updates_move_the_tiny_policy_toward_positive_advantages(tiny_policy):
    model, tokenizer = tiny_policy
    torch.manual_seed(0)
    good = tokenizer.encode("<|user|>fix it<|end|><|assistant|>I will run the tests.<|end|>")
    bad = tokenizer.encode("<|user|>fix it<|end|><|assistant|>rm -rf everything now<|end|>")
    start = len(tokenizer.encode("<|user|>fix it<|end|><|assistant|>"))
    mask = lambda ids: [0] * start + [1] * (len(ids) - start)  # noqa: E731
    samples = [(good, mask(good), 1.0), (bad, mask(bad), -1.0)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def mean_logprob(ids):
        with torch.no_grad():
            t = torch.tensor([ids])
            return token_logprobs(model, t, torch.ones_like(t))[0, start - 1 :].mean().item()

    gap0 = mean_logprob(good) - mean_logprob(bad)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(3):
        stats = rl_update(model, opt, samples, pad_id=tokenizer.pad_token_id, epochs=2, micro_batch=1)
        assert all(math.isfinite(v) for v in stats.values())
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    # Experts a token never routes to get no gradient; everything else must have moved.
    unchanged = [n for n, _ in model.named_parameters() if n not in changed]
    assert all(".experts." in n for n in unchanged), unchanged
    assert len(changed) > 0.5 * len(before)
    assert mean_logprob(good) - mean_logprob(bad) > gap0 + 0.5
