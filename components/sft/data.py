"""Which tokens SFT trains on, per mode, and the batches it trains with.

Modes (the ablation's three arms):
- resolved_only: resolved trajectories, loss on every assistant step; unresolved ones are dropped.
- whole: resolved + unresolved trajectories, loss on every assistant step of both.
- credited: resolved trajectories whole + unresolved ones with loss only on credited steps
  (`Step.credited`, filled by components/credit/stage.py); earlier steps stay as context.
In every mode an assistant turn whose tool call did not parse (`rendering.malformed_call`: the harness
answered it with a protocol error) carries no loss, even in a resolved or credited trajectory: SFT
imitates, and a malformed call is never worth imitating; it stays as context, with the error observation
that follows it. Infrastructure failures never train. A sample longer than `max_len` is cut at the end (the task
statement at the start is what makes the rest learnable), and is dropped if no loss token survives.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from components.core.rendering.tokens import malformed_call, render_trajectory
from components.core.data.schema import Outcome, TokenizedSample, Trajectory, hidden_pass_metrics
from components.core.rendering.tool_formats import ToolFormat

SFTMode = Literal["resolved_only", "whole", "credited"]


class DataStats(BaseModel):
    """What the selected training set holds (logged with the run)."""

    model_config = ConfigDict(extra="forbid")
    trajectories_in: int = 0
    resolved_used: int = 0
    unresolved_used: int = 0
    skipped_infra_error: int = 0
    skipped_no_loss: int = 0
    malformed_steps_masked: int = 0  # assistant turns with an unparsable tool call in used trajectories
    truncated: int = 0
    loss_tokens_truncated: int = 0  # loss-bearing tokens cut off at max_len (what truncation took from training)
    tokens: int = 0
    loss_tokens: int = 0
    mean_length: float = 0.0
    max_length: int = 0
    hidden_pass_fraction_mean: float | None = None  # over the used trajectories that have one (analysis only)
    hidden_pass_fraction_unresolved_mean: float | None = None  # partial progress the unresolved ones hold
    hidden_pass_fraction_n: int = 0

    @property
    def loss_token_fraction(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    @property
    def truncated_loss_fraction(self) -> float:
        """Share of the loss-bearing tokens that truncation at max_len cut away."""
        total = self.loss_tokens + self.loss_tokens_truncated
        return self.loss_tokens_truncated / total if total else 0.0


def loss_rule(trajectory: Trajectory, mode: SFTMode) -> Literal["assistant", "credited"] | None:
    """How a trajectory trains under a mode; None = not used."""
    if trajectory.outcome is Outcome.infra_error:
        return None
    if trajectory.outcome is Outcome.resolved:
        return "assistant"
    if mode == "resolved_only":
        return None
    return "assistant" if mode == "whole" else "credited"


def render_for_sft(
    trajectory: Trajectory,
    tokenizer,
    rule: Literal["assistant", "credited"] | None,
    tool_format: ToolFormat | None = None,
) -> TokenizedSample:
    """The trajectory rendered with SFT's loss mask: `rule` (from `loss_rule`; None = context only), never
    on a malformed call. `tool_format` is the format the trained model will be sampled in (the evaluation
    and RL harness's `tool_format`; None = the template's own): SFT must train on that context, whatever
    format the teacher wrote its calls in (the calls are re-rendered in it)."""
    return render_trajectory(
        trajectory, tokenizer, loss_on=rule or "none", tool_format=tool_format, malformed_loss=False
    )


def build_samples(
    trajectories: list[Trajectory], tokenizer, mode: SFTMode, max_len: int, tool_format: ToolFormat | None = None
) -> tuple[list[TokenizedSample], DataStats]:
    stats = DataStats(trajectories_in=len(trajectories))
    samples = []
    used: list[Trajectory] = []
    for traj in trajectories:
        if traj.outcome is Outcome.infra_error:
            stats.skipped_infra_error += 1
            continue
        rule = loss_rule(traj, mode)
        if rule is None:
            continue
        sample = render_for_sft(traj, tokenizer, rule, tool_format)
        if len(sample.input_ids) > max_len:
            stats.truncated += 1
            stats.loss_tokens_truncated += sum(sample.loss_mask[max_len:])
            sample = sample.model_copy(
                update={
                    "input_ids": sample.input_ids[:max_len],
                    "roles": sample.roles[:max_len],
                    "loss_mask": sample.loss_mask[:max_len],
                    "step_index": sample.step_index[:max_len],
                }
            )
        if not any(sample.loss_mask):
            stats.skipped_no_loss += 1
            continue
        samples.append(sample)
        used.append(traj)
        stats.malformed_steps_masked += sum(malformed_call(s) for s in traj.steps)
        if traj.outcome is Outcome.resolved:
            stats.resolved_used += 1
        else:
            stats.unresolved_used += 1
        stats.tokens += len(sample.input_ids)
        stats.loss_tokens += sum(sample.loss_mask)
        stats.max_length = max(stats.max_length, len(sample.input_ids))
    stats.mean_length = stats.tokens / len(samples) if samples else 0.0
    hidden = hidden_pass_metrics(used)
    stats.hidden_pass_fraction_n = int(hidden["hidden_pass_fraction_n"])
    if stats.hidden_pass_fraction_n:
        stats.hidden_pass_fraction_mean = hidden["hidden_pass_fraction_mean"]
    if hidden["hidden_pass_fraction_unresolved_n"]:
        stats.hidden_pass_fraction_unresolved_mean = hidden["hidden_pass_fraction_unresolved_mean"]
    return samples, stats


class SampleDataset:
    """A torch-style map dataset of rendered samples (labels = ids where loss, else -100)."""

    def __init__(self, samples: list[TokenizedSample]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        labels = [t if m else -100 for t, m in zip(s.input_ids, s.loss_mask)]
        return {"input_ids": s.input_ids, "labels": labels}

    @property
    def lengths(self) -> list[int]:
        return [len(s.input_ids) for s in self.samples]


class PadCollator:
    """Pads to the longest sample of the batch (bucketing keeps that close to every sample's length)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[dict]) -> dict:
        import torch

        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n] = torch.tensor(b["input_ids"])
            labels[i, :n] = torch.tensor(b["labels"])
            attn[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": attn}
