"""PipelineConfig -> each stage's own typed config.

The one place that knows both sides: the run's knobs (pipelines/config.py) and the stage configs
(components/*.py). Stage modules are imported lazily so compiling the pipelines needs none of them.
"""

from __future__ import annotations

from pydantic import BaseModel

from components.core.connection import SandboxConnection
from pipelines.config import PipelineConfig


def model_config(config: PipelineConfig):
    from components.core.modeling import ModelConfig, TokenizerConfig

    m = config.model
    return ModelConfig(hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers, num_experts=m.num_experts,
                       seed=config.seed,
                       tokenizer=TokenizerConfig(vocab_size=m.vocab_size, corpus_tasks=m.tokenizer_corpus_tasks))


def sft_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    from components.sft import SFTConfig

    s = config.sft
    return SFTConfig(mode=s.mode, steps=s.steps, learning_rate=s.learning_rate, batch_size=s.batch_size,
                     max_len=s.max_len, warmup_steps=min(10, max(0, s.steps // 10)), seed=config.seed,
                     model=model_config(config))


def provision_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    from components.provision import ProvisionConfig

    t = config.tasks
    difficulty = list(range(1, t.max_difficulty + 1)) if config.recipe == "swe" else None
    return ProvisionConfig(recipe=config.recipe, n_train=t.n_train, n_heldout=t.n_heldout, seed=config.seed,
                           difficulty=difficulty, sandbox=sandbox)


def distill_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    from components.distill import DistillConfig

    d = config.distill
    return DistillConfig(recipe=config.recipe, teacher="scripted", error_rate=d.teacher_error_rate,
                         attempts_per_task=d.attempts_per_task, max_parallel=d.parallelism,
                         harness=_harness(d.max_steps, 256), seed=config.seed, sandbox=sandbox)


def credit_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    from components.credit import CreditConfig
    from components.credit_mc import MonteCarloConfig
    from components.credit_segments import SegmentConfig

    c = config.credit
    return CreditConfig(
        recipe=config.recipe, sandbox=sandbox, estimator=c.estimator,
        monte_carlo=MonteCarloConfig(k=c.continuations, stride=c.stride, teacher_error_rate=c.teacher_error_rate,
                                     seed=config.seed, max_steps=c.max_steps, parallel=c.parallelism),
        segments=SegmentConfig(epsilon=c.min_rise), max_trajectories=c.max_trajectories,
    )


def _harness(max_steps: int, max_new_tokens: int):
    from components.core.harness import HarnessConfig
    from components.core.policy_base import GenerationConfig

    return HarnessConfig(max_steps=max_steps, generation=GenerationConfig(max_new_tokens=max_new_tokens))


def rl_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    from components.rl import RLConfig
    from components.rl_sampler import RolloutConfig

    r = config.rl
    rollout = RolloutConfig(sampler=r.sampler, group_size=r.group_size, max_rollouts_per_prompt=r.max_attempts_per_prompt,
                            stride=r.stride, batch_prompts=r.prompts_per_step,
                            max_prompts_per_batch=max(r.max_prompts_per_batch, r.prompts_per_step))
    return RLConfig(recipe=config.recipe, rollout=rollout, rollout_budget=r.rollout_budget, steps=r.steps,
                    learning_rate=r.learning_rate, temperature=r.temperature,
                    harness=_harness(r.max_steps, r.max_new_tokens), sandbox=sandbox, seed=config.seed)


def evaluate_config(config: PipelineConfig, sandbox: SandboxConnection, policy: str = "local") -> BaseModel:
    from components.evaluate import EvalConfig

    e = config.eval
    return EvalConfig(recipe=config.recipe, split="heldout", k=e.attempts, policy=policy,
                      scripted_error_rate=config.distill.teacher_error_rate, temperature=e.temperature,
                      harness=_harness(e.max_steps, e.max_new_tokens), sandbox=sandbox, workers=e.parallelism,
                      seed=config.seed)


def evaluate_teacher_config(config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    """The scripted teacher on the held-out tasks: the reference row of the results table."""
    cfg = evaluate_config(config, sandbox, policy="scripted")
    return cfg.model_copy(update={"harness": _harness(config.distill.max_steps, config.eval.max_new_tokens)})


BUILDERS = {"provision": provision_config, "distill": distill_config, "credit": credit_config, "sft": sft_config, "rl": rl_config, "evaluate": evaluate_config,
            "evaluate-teacher": evaluate_teacher_config}


def build(stage: str, config: PipelineConfig, sandbox: SandboxConnection) -> BaseModel:
    """The typed config of `stage` for this run."""
    if stage not in BUILDERS:
        raise NotImplementedError(f"no config builder for stage {stage!r} yet (have {sorted(BUILDERS)})")
    return BUILDERS[stage](config, sandbox)
