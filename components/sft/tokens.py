"""Token-level trajectory export: the record trainers have converged on, beside the OpenAI-messages export.

A row per trajectory (parquet, loadable by `datasets.load_dataset("parquet", ...)` and pandas):
  `trajectory_id`      our trajectory id;
  `prompt_ids`         the conversation up to and including the first assistant turn's generation prompt;
  `response_ids`       everything after it: assistant tokens and the environment's (tool) tokens between turns;
  `loss_mask`          one per response token: 1 where the trainer puts loss (assistant tokens), 0 elsewhere;
  `response_logprobs`  one per response token under the rollout policy, or null when not computed;
  `reward`             1.0 / 0.0 verified, null for infrastructure failures (never train on those as 0);
  `failure_reason`     null when resolved, else "<outcome>: <why>" (unresolved or infra_error);
  `metadata`           JSON: task, recipe, split, policy, outcome, status, step count, the loss rule.

The ids and the mask come from `rendering.render_trajectory` under `sft.data.loss_rule`, the same functions
SFT and RL train with, so `prompt_ids + response_ids` and the mask are exactly what our trainer sees;
assistant steps sampled locally keep their sampled ids (never re-tokenized). Our trajectories do not store
sampling logprobs (the RL stage takes them from the sampler or recomputes them from the rollout weights); pass that
`model` to `export_tokens` to fill `response_logprobs` the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.rendering.tokens import render_prompt, steps_as_messages
from components.core.data.schema import Outcome, Trajectory
from components.core.policy.logprobs import token_logprobs
from components.core.data.parquet_store import write_table_atomic
from components.sft.data import SFTMode, loss_rule, render_for_sft

TOKEN_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("failure_reason", pa.string()),
        ("metadata", pa.string()),
    ]
)


def _prompt_length(traj: Trajectory, input_ids: list[int], tokenizer) -> int:
    """Tokens up to and including the generation prompt of the first assistant turn (the chat template's own
    header, e.g. `<|im_start|>assistant\n`); all of them when nothing was generated."""
    first = next((i for i, s in enumerate(traj.steps) if s.role == "assistant"), None)
    if first is None:
        return len(input_ids)
    prompt = render_prompt(
        steps_as_messages(traj.steps[:first]), tokenizer, tools=traj.tools, add_generation_prompt=True
    )
    if input_ids[: len(prompt)] != list(prompt):  # rendering is append-only; anything else is a bug
        raise ValueError(f"{traj.id}: the rendered episode does not start with its own prompt")
    return len(prompt)


def trajectory_to_tokens(
    traj: Trajectory, tokenizer, mode: SFTMode = "whole", logprobs: list[float] | None = None
) -> dict[str, Any]:
    """One row. `mode` is the SFT arm whose loss rule sets the mask ("whole": every assistant step of every
    verified trajectory, malformed calls excepted: SFT's rule, `sft.data`); infrastructure failures get an
    all-zero mask."""
    rule = loss_rule(traj, mode)
    sample = render_for_sft(traj, tokenizer, rule)
    cut = _prompt_length(traj, sample.input_ids, tokenizer)
    response = sample.input_ids[cut:]
    if logprobs is not None and len(logprobs) != len(response):
        raise ValueError(f"{traj.id}: {len(logprobs)} logprobs for {len(response)} response tokens")
    failure = None
    if traj.outcome is not Outcome.resolved:
        failure = f"{traj.outcome.value}: {traj.outcome_reason or 'no reason recorded'}"
    metadata = {
        "task_id": traj.task_id,
        "recipe": traj.recipe,
        "split": traj.split,
        "policy_id": traj.policy_id,
        "outcome": traj.outcome.value,
        "status": traj.status.value,
        "loss_rule": rule,
        "mode": mode,
        "assistant_steps": traj.num_assistant_steps,
        "attempt": traj.attempt,
        "extra": traj.metadata,
    }
    return {
        "trajectory_id": traj.id,
        "prompt_ids": sample.input_ids[:cut],
        "response_ids": response,
        "loss_mask": sample.loss_mask[cut:],
        "response_logprobs": logprobs,
        "reward": traj.reward if traj.outcome is not Outcome.infra_error else None,
        "failure_reason": failure,
        "metadata": json.dumps(metadata, default=str),
    }


def response_logprobs(model, row: dict[str, Any], temperature: float = 1.0) -> list[float]:
    """log p(token) of every response token under `model` (the rollout policy) at the sampling temperature."""
    import torch

    ids = row["prompt_ids"] + row["response_ids"]
    if not row["response_ids"]:
        return []
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    with torch.no_grad():
        out = token_logprobs(model, input_ids, torch.ones_like(input_ids), temperature)[0]
    # out[j] scores token j + 1, so the response (from position len(prompt)) starts at len(prompt) - 1.
    return out[len(row["prompt_ids"]) - 1 :].tolist()


def export_tokens(
    trajectories: list[Trajectory],
    tokenizer,
    path: str | Path,
    *,
    mode: SFTMode = "whole",
    model=None,
    temperature: float = 1.0,
) -> Path:
    """Write one parquet file of token-level rows (atomically); with `model`, fill `response_logprobs`."""
    rows = []
    for traj in trajectories:
        row = trajectory_to_tokens(traj, tokenizer, mode)
        if model is not None:
            row["response_logprobs"] = response_logprobs(model, row, temperature)
        rows.append(row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_table_atomic(pa.Table.from_pylist(rows, schema=TOKEN_SCHEMA), path)


def read_tokens(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a token-level parquet file, `metadata` decoded."""
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        row["metadata"] = json.loads(row["metadata"])
    return rows
