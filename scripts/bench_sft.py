"""SFT throughput: our Trainer path (components.sft.stage.train_on_samples) beside a bare torch loop.

Same model config, same samples, same batch size, same collator and optimizer settings, measured in
the same process, alternating the two paths `--repeats` times. Reports the median tokens/s per step
(after `--warmup` steps) of each path and their ratio.

    .venv/bin/python scripts/bench_sft.py [--steps 30] [--batch-size 8] [--trajectories DIR]

Without --trajectories the samples are teacher-like SWE episodes (difficulty 1) built without a
sandbox: the task's system prompt and issue, the file read, the edit and the submit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from components.core.episode.harness import initial_steps
from components.core.policy.modeling import ModelConfig
from components.tiny_model import build_tiny_model, build_tokenizer
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore
from components.recipes import get_recipe
from components.sft.stage import SFTConfig, train_on_samples
from components.sft.data import PadCollator, SampleDataset, build_samples


def synthetic_trajectories(n: int, split: str = "train") -> list[Trajectory]:
    recipe = get_recipe("swe")
    out = []
    for task in recipe.tasks(split, n, seed=0):
        fix = task.metadata["fix"]
        steps = initial_steps(task, recipe)
        actions = [
            (
                ToolCall(name="bash", arguments={"command": "find . -name '*.py' | sort"}),
                "\n".join(sorted(task.environment.files)),
            ),
            (ToolCall(name="read_file", arguments={"path": fix["path"]}), task.environment.files[fix["path"]]),
            (
                ToolCall(
                    name="str_replace", arguments={"path": fix["path"], "old_str": fix["old"], "new_str": fix["new"]}
                ),
                "Edited.",
            ),
            (ToolCall(name="bash", arguments={"command": "python -m pytest -q"}), "1 passed in 0.01s"),
            (ToolCall(name="submit", arguments={}), "Submitted."),
        ]
        for call, obs in actions:
            steps.append(Step(index=len(steps), role="assistant", content=format_tool_call(call), tool_call=call))
            steps.append(Step(index=len(steps), role="tool", content=obs, tool_call_id=call.id))
        out.append(
            Trajectory(task_id=task.id, recipe="swe", policy_id="synthetic", steps=steps, outcome=Outcome.resolved)
        )
    return out


def bare_loop(config: SFTConfig, model, tokenizer, dataset: SampleDataset) -> list[float]:
    """The same training as the Trainer path, as plain torch: tokens/s of every step."""
    collate = PadCollator(tokenizer.pad_token_id)
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    model.train()
    rates = []
    for _ in range(config.steps):
        t0 = time.perf_counter()  # the step includes batching, as the Trainer's does
        idx = torch.randint(len(dataset), (config.batch_size,), generator=gen).tolist()
        batch = collate([dataset[i] for i in idx])
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rates.append(int(batch["attention_mask"].sum()) / (time.perf_counter() - t0))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trajectories", type=Path, default=None)
    args = parser.parse_args()

    model_config = ModelConfig()
    tokenizer = build_tokenizer(model_config.tokenizer)
    trajs = TrajectoryStore(args.trajectories).read() if args.trajectories else synthetic_trajectories(64)
    samples, stats = build_samples(trajs, tokenizer, "whole", max_len=2048)
    dataset = SampleDataset(samples)
    # No bucketing in the Trainer run either: both paths see random batches of the same samples.
    config = SFTConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        warmup_steps=0,
        lr_scheduler="constant",
        bucketing=False,
        model=model_config,
    )
    print(
        f"{len(samples)} samples, mean {stats.mean_length:.0f} tokens, batch {args.batch_size}, "
        f"{args.steps} steps x {args.repeats} repeats, torch threads {torch.get_num_threads()}"
    )
    trainer_rates, bare_rates = [], []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            history = train_on_samples(
                config, build_tiny_model(model_config, tokenizer), tokenizer, dataset, Path(tmp)
            ).history
        # The Trainer's per-step rate includes its data loading, scheduler and logging: the real cost.
        trainer_rates += [h["tokens_per_s"] for h in history[args.warmup :]]
        bare_rates += bare_loop(config, build_tiny_model(model_config, tokenizer), tokenizer, dataset)[args.warmup :]
        print(
            f"repeat {r + 1}: trainer {statistics.median(trainer_rates):,.0f} tok/s, "
            f"bare {statistics.median(bare_rates):,.0f} tok/s"
        )
    t, b = statistics.median(trainer_rates), statistics.median(bare_rates)
    print(f"\nmedian tokens/s  trainer path: {t:,.0f}   bare torch loop: {b:,.0f}   ratio trainer/bare: {t / b:.2f}")


if __name__ == "__main__":
    main()
