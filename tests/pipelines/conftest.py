"""Fixtures of the pipeline tests."""

from __future__ import annotations

import pytest

from pipelines.config import PipelineConfig


@pytest.fixture
def micro_config() -> PipelineConfig:
    """Smaller than the 'tiny' preset: the whole DAG, every stage for real, in the default suite's budget.

    Seed and teacher error rate are chosen so that distillation yields both outcomes (tasks and the
    scripted teacher are deterministic given the seed), so credit labelling has work to do.
    """
    return PipelineConfig.preset_config(
        "tiny",
        seed=0,
        provision={"n_train": 2, "n_heldout": 1},
        distill={"error_rate": 0.5},
        model={"tiny": {"tokenizer": {"corpus_tasks": 4, "vocab_size": 512}}},
        credit={"max_trajectories": 1, "monte_carlo": {"k": 1, "stride": 4, "max_steps": 4}},
        sft={"steps": 2, "batch_size": 2, "max_len": 1024},
        # A budget of 1 episode cannot fill a group of 2: RL makes no update, deterministically, so the
        # run shows the untrained-model path (reported, never registered); RL updates: tests/components.
        rl={"steps": 1, "rollout_budget": 1, "harness": {"max_steps": 2, "generation": {"max_new_tokens": 32}}},
        evaluate={"harness": {"max_steps": 2, "generation": {"max_new_tokens": 32}}},
        evaluate_teacher={"harness": {"max_steps": 2}},
        register_model_name="orchard-test-policy",
    )


@pytest.fixture
def external_service(sandbox_service, monkeypatch):
    """The session's real sandbox service, reached the way a cluster reaches it: URL in the config,
    token from ORCHARD_SANDBOX_TOKEN (a Secret there)."""
    monkeypatch.setenv("ORCHARD_SANDBOX_TOKEN", sandbox_service.token)
    return sandbox_service
