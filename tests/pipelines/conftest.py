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
        tasks={"n_train": 2, "n_heldout": 1},
        distill={"teacher_error_rate": 0.5},
        model={"tokenizer_corpus_tasks": 4, "vocab_size": 512},
        credit={"continuations": 1, "stride": 4, "max_trajectories": 1, "max_steps": 4},
        sft={"steps": 2, "batch_size": 2, "max_len": 1024},
        rl={"steps": 1, "rollout_budget": 2, "max_steps": 2, "max_new_tokens": 32},
        eval={"max_steps": 2, "max_new_tokens": 32},
        register_model_name="orchard-test-policy",
    )
