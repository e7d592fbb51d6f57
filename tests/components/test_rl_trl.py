"""The RL stage on TRL's GRPOTrainer (`engine="trl"`): tiny policy, real sandboxes, real verifier.

Tasks as in test_rl_stage: a coin task the verifier resolves with probability 1/2 whatever the agent does
(mixed groups for an untrained policy) and a task whose sandbox cannot be created (every attempt is an
infra error, which must never reach a reward).
"""

from __future__ import annotations

import math

import pytest
import torch

from components.core.harness import HarnessConfig
from components.core.policy_base import GenerationConfig
from components.core.schema import EnvironmentSpec, Task, VerifierSpec
from components.core.store import TaskStore
from components.rl import RLConfig, train_rl
from components.rl_sampler import PromptRecord, RolloutConfig

COIN = "python3 -c 'import os, sys; sys.exit(os.urandom(1)[0] % 2)'"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from components.core.modeling import ModelConfig, TokenizerConfig, build_tiny_model, build_tokenizer, save_policy

    root = tmp_path_factory.mktemp("rl-trl")
    coin = Task(id="coin", recipe="swe", split="train", prompt="Flip the coin, then submit.",
                environment=EnvironmentSpec(files={"README.md": "a coin\n"}),
                verifier=VerifierSpec(kind="command", command=COIN))
    broken = Task(id="broken", recipe="swe", split="train", prompt="Unreachable.",
                  environment=EnvironmentSpec(image="/nonexistent/task-image"))
    TaskStore(root / "tasks").write([coin, broken])
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=8))
    save_policy(build_tiny_model(ModelConfig(), tokenizer), tokenizer, root / "sft")
    return root


def _config(sandbox_service, **update) -> RLConfig:
    base = dict(
        engine="trl",
        # BAR, N=2 from up to 6 attempts, exactly one positive: the smallest balanced group.
        rollout=RolloutConfig(group_size=2, max_rollouts_per_prompt=6, stride=2, rho_min=0.5, rho_max=0.5,
                              batch_prompts=1),
        steps=3, learning_rate=1e-3, harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=12)),
        sandbox=sandbox_service.connection(), seed=3, num_threads=1,
    )
    return RLConfig(**(base | update))


def test_trl_grpo_steps_train_every_parameter_and_infra_errors_never_reach_rewards(inputs, sandbox_service,
                                                                                   tmp_path, monkeypatch):
    import components.rl_trl as rl_trl
    from components.core.modeling import load_policy

    seen: list[tuple[list[str], list[float]]] = []
    real = rl_trl.verified_reward

    def spy(prompts, completions, verified_reward, attempt_id, **kw):  # what reaches TRL's advantages
        seen.append((list(attempt_id), list(verified_reward)))
        return real(prompts, completions, verified_reward, **kw)

    spy.__name__ = "verified_reward"
    monkeypatch.setattr(rl_trl, "verified_reward", spy)
    before = {k: v.clone() for k, v in load_policy(inputs / "sft")[0].state_dict().items()}
    config = _config(sandbox_service, trl_args={"weight_decay": 0.0})
    result = train_rl(config, inputs / "tasks", inputs / "sft", tmp_path / "rl")

    assert result.steps_done == 3 and math.isfinite(result.metrics["final_loss"])
    records = [PromptRecord.model_validate_json(line) for line in open(result.records_path)]
    assert len(records) == 3  # one prompt per step (batch_prompts=1)
    broken = [r for r in records if r.prompt_id == "broken"]
    assert all(not r.kept and r.pool_aborted == r.generated > 0 for r in broken)
    assert result.metrics["dropped_groups"] == sum(not r.kept for r in records)
    # BAR groups reach TRL's advantage computation as N consecutive completions of one prompt: the
    # group the sampler chose, or N placeholders with equal rewards (no gradient) for a dropped one.
    assert len(seen) == 3
    for record, (ids, rewards) in zip(records, seen):
        assert len(ids) == len(rewards) == 2
        if record.kept:
            assert ids == record.group_attempt_ids and sorted(rewards) == [-1.0, 1.0]
        else:
            assert ids == ["", ""] and rewards == [0.0, 0.0]
    model, _ = load_policy(tmp_path / "rl")
    after = model.state_dict()
    if any(r.kept for r in records):
        changed = [n for n, _ in model.named_parameters() if not torch.equal(before[n], after[n])]
        assert changed, "no parameter changed"
