"""Fixtures shared by the RL tests (the stage end to end, its rollout_func, its distributed launch)."""

from __future__ import annotations

import pytest

from components.core.data.schema import EnvironmentSpec, Task, VerifierSpec
from components.core.data.parquet_store import TaskStore

COIN = "python3 -c 'import os, sys; sys.exit(os.urandom(1)[0] % 2)'"


@pytest.fixture(scope="module")
def rl_inputs(tmp_path_factory):
    """`tasks/`: a coin task the verifier resolves with probability 1/2 whatever the agent does (mixed
    groups for an untrained policy) and a task whose sandbox cannot be created (every attempt is an infra
    error, which must never reach a reward); `sft/`: a fresh tiny policy to start RL from."""
    from components.core.policy.modeling import ModelConfig, TokenizerConfig, save_policy
    from components.tiny_model import build_tiny_model, build_tokenizer

    root = tmp_path_factory.mktemp("rl")
    coin = Task(
        id="coin",
        recipe="swe",
        split="train",
        prompt="Flip the coin, then submit.",
        environment=EnvironmentSpec(files={"README.md": "a coin\n"}),
        verifier=VerifierSpec(kind="command", command=COIN),
    )
    broken = Task(
        id="broken",
        recipe="swe",
        split="train",
        prompt="Unreachable.",
        environment=EnvironmentSpec(image="nonexistent-task-image"),
    )
    TaskStore(root / "tasks").write([coin, broken])
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=8))
    save_policy(build_tiny_model(ModelConfig(), tokenizer), tokenizer, root / "sft")
    return root
