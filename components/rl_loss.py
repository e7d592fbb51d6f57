"""The RL objective: group-normalised advantages and a clipped token-level policy-gradient loss.

- Reward comes only from a verified outcome: resolved +1, unresolved -1. An `infra_error` attempt has
  no reward (None) and must never reach a group: `group_advantages` refuses it rather than let it
  shift its siblings' mean and std.
- Advantage A_i = (r_i - mean(r)) / std(r) over the group (population std, so a 4/4 split gives +-1).
- Loss on assistant-generated tokens only (tool and system tokens carry mask 0), PPO clipping of the
  ratio against the rollout policy's logprobs, optional KL (k3 estimator) to a frozen reference,
  averaged over all loss tokens of the whole batch (token-level, as DAPO), so micro-batching does not
  change the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from components.core.schema import Outcome, Trajectory


def outcome_reward(traj: Trajectory) -> float | None:
    """+1 resolved, -1 unresolved, None when the infrastructure failed (no verified outcome)."""
    if traj.outcome is Outcome.infra_error:
        return None
    return 1.0 if traj.outcome is Outcome.resolved else -1.0


def group_advantages(rewards: Sequence[float | None], eps: float = 1e-6) -> list[float]:
    """(r - mean) / std over one group; zeros when every reward is equal."""
    if any(r is None for r in rewards):
        raise ValueError("an attempt without a verified reward (infra_error) reached a group; "
                         "the sampler must drop or retry it before advantages are computed")
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)  # type: ignore[arg-type]
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))  # type: ignore[operator]
    return [0.0 if std < eps else (r - mean) / std for r in rewards]  # type: ignore[operator]


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1, shape [B, T-1], under logits / temperature (as sampled)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return -F.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                loss_mask: torch.Tensor, *, clip_eps: float = 0.2, clip_eps_high: float | None = None,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                num_loss_tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (+ kl_coef * KL to the reference) averaged over loss tokens.

    Shapes: logprobs and loss_mask [B, T-1] (aligned with the predicted tokens), advantages [B].
    `num_loss_tokens` is the token count of the whole batch when this is one micro-batch of it.
    """
    mask = loss_mask.float()
    denom = float(num_loss_tokens if num_loss_tokens is not None else mask.sum().clamp(min=1).item())
    ratio = torch.exp(new_logprobs - old_logprobs)
    adv = advantages.float().unsqueeze(1)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + (clip_eps_high if clip_eps_high is not None else clip_eps))
    pg = -torch.minimum(ratio * adv, clipped * adv)
    loss = (pg * mask).sum() / denom
    stats = {"pg_loss": loss.item(),
             "clip_fraction": (((ratio - clipped).abs() > 1e-8).float() * mask).sum().item() / denom}
    if ref_logprobs is not None and kl_coef > 0:
        log_ratio = ref_logprobs - new_logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1.0  # k3: unbiased, always >= 0
        kl_term = (kl * mask).sum() / denom
        loss = loss + kl_coef * kl_term
        stats["kl"] = kl_term.item()
    stats["loss"] = loss.item()
    return loss, stats


# --------------------------------------------------------------------------------------------------
# One optimisation step over a batch of rendered episodes
# --------------------------------------------------------------------------------------------------
def collate(samples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(input_ids, loss_mask) pairs -> padded input_ids, attention_mask, and the mask of predicted tokens."""
    width = max(len(ids) for ids, _ in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for i, (x, m) in enumerate(samples):
        ids[i, : len(x)], attn[i, : len(x)], mask[i, : len(m)] = torch.tensor(x), 1, torch.tensor(m)
    return ids, attn, mask[:, 1:]  # token t is predicted at position t-1


def rl_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              samples: Sequence[tuple[list[int], list[int], float]], *, pad_id: int, temperature: float = 1.0,
              clip_eps: float = 0.2, clip_eps_high: float | None = None, kl_coef: float = 0.0,
              ref_model: torch.nn.Module | None = None, epochs: int = 1, micro_batch: int = 4,
              max_grad_norm: float = 1.0) -> dict[str, float]:
    """`epochs` clipped policy-gradient passes over (input_ids, loss_mask, advantage) samples.

    The old logprobs are those of the weights that generated the rollouts (computed before the first
    update); later epochs are where clipping bites. Returns the last epoch's averaged stats.
    """
    chunks = [samples[i : i + micro_batch] for i in range(0, len(samples), micro_batch)]
    batches = []
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():  # rollout-policy and reference logprobs, once
        for chunk in chunks:
            ids, attn, mask = (t.to(device) for t in collate([(s[0], s[1]) for s in chunk], pad_id))
            old = token_logprobs(model, ids, attn, temperature)
            ref = token_logprobs(ref_model, ids, attn, temperature) if ref_model is not None and kl_coef > 0 else None
            batches.append((ids, attn, mask, torch.tensor([s[2] for s in chunk], device=device), old, ref))
    num_tokens = max(1, sum(int(b[2].sum()) for b in batches))
    model.train()
    stats: dict[str, float] = {}
    for _ in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for ids, attn, mask, adv, old, ref in batches:
            new = token_logprobs(model, ids, attn, temperature)
            loss, part = policy_loss(new, old, adv, mask, clip_eps=clip_eps, clip_eps_high=clip_eps_high,
                                     ref_logprobs=ref, kl_coef=kl_coef, num_loss_tokens=num_tokens)
            loss.backward()
            for k, v in part.items():  # each part is already divided by the batch's token count
                totals[k] = totals.get(k, 0.0) + v
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        stats = {**totals, "grad_norm": float(grad_norm), "loss_tokens": float(num_tokens)}
    return stats
