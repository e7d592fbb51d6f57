"""Train a policy with TRL's GRPOTrainer on one of our recipes through `environment_factory` (CPU, tiny policy).

    python scripts/trl_grpo_env.py --recipe swe --steps 2                      # embedded sandbox service (root)
    ORCHARD_SANDBOX_URL=... ORCHARD_SANDBOX_TOKEN=... python scripts/trl_grpo_env.py --recipe claw --external

Each rollout gets its own `SWEEnvironment` / `ClawEnvironment` instance (one sandbox), the policy calls the
recipe's tools, and the recipe's verifier gives the reward (`get_reward`). The embedded default policy is
our tiny untrained model, so its rewards are 0 and this shows the plumbing, not learning; pass
`--model DIR` (any `from_pretrained` directory with our chat format) for a real run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def train(
    recipe: str,
    steps: int,
    service,
    out_dir: str,
    model_dir: str | None = None,
    num_tasks: int = 4,
    max_completion_length: int = 24,
    max_tool_calls: int = 2,
):
    """Run `steps` GRPO steps; returns the trainer (its `state.log_history` holds the rewards)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from components.core.policy.modeling import ModelConfig, TokenizerConfig, load_policy
    from components.tiny_model import build_policy
    from components.envs.session import EnvConfig
    from components.envs.trl_env import ENVIRONMENTS, prepare_tokenizer

    if model_dir:
        model, tokenizer = load_policy(model_dir)
    else:
        model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[], vocab_size=512)))
    prepare_tokenizer(tokenizer)
    config = EnvConfig(recipe=recipe, num_tasks=num_tasks, max_steps=max_tool_calls + 1, service=service)
    rows = [
        {
            "prompt": [{"role": "user", "content": "Solve the task with the tools, then finish."}],
            "task_index": i % num_tasks,
        }
        for i in range(max(4, num_tasks))
    ]
    args = GRPOConfig(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=max_completion_length,
        max_tool_calling_iterations=max_tool_calls,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        environment_factory=ENVIRONMENTS[recipe].factory(config),
    )
    trainer.train()
    return trainer


def main(argv: list[str] | None = None) -> int:
    from components.recipes import recipe_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="swe", choices=recipe_names())
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", default=None, help="a from_pretrained directory (default: the tiny policy)")
    parser.add_argument("--external", action="store_true", help="use ORCHARD_SANDBOX_URL/TOKEN, not an embedded one")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from sandbox_service.connection import SandboxConnection

    with contextlib.ExitStack() as stack:
        if args.external:
            service = SandboxConnection()
        else:
            from sandbox_service.embedded import EmbeddedService

            service = stack.enter_context(EmbeddedService()).connection()
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory())
        trainer = train(args.recipe, args.steps, service, out, args.model)
        for entry in trainer.state.log_history:
            print({k: v for k, v in entry.items() if "reward" in k or k in ("step", "loss")}, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
