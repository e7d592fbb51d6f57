"""The RL stage end to end on TRL's GRPOTrainer: tiny policy, real sandboxes, real verifier, real updates, MLflow.

Tasks and starting policy: the `rl_inputs` fixture (tests/components/conftest.py): a coin task whose verifier
resolves with probability 1/2 whatever the agent does (mixed groups even for an untrained policy) and a task
whose sandbox cannot be created (every attempt ends in infra_error, which must never give a reward).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from components.core.data.episode_traces import TraceConfig, sampled
from components.core.episode.harness import HarnessConfig
from components.core.policy.base import GenerationConfig
from components.core.data.schema import Outcome
from components.core.data.parquet_store import TrajectoryStore
from components.core.tracking import TrackingConfig
from components.rl.stage import RLConfig, train_rl
from components.rl.sampling import PromptRecord, RolloutConfig


def _config(sandbox_service, **update) -> RLConfig:
    base = dict(
        # BAR, N=2 from up to 8 attempts, exactly one positive: the smallest balanced group.
        rollout=RolloutConfig(
            group_size=2, max_rollouts_per_prompt=8, stride=2, rho_min=0.5, rho_max=0.5, batch_prompts=1
        ),
        steps=3,
        learning_rate=1e-3,
        harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=12)),
        sandbox=sandbox_service.connection(),
        seed=3,
        num_threads=1,  # tiny tensors: a second thread only adds contention on a shared machine
    )
    return RLConfig(**(base | update))


def test_grpo_steps_train_every_parameter_count_informative_steps_and_never_reward_infra_errors(
    rl_inputs, sandbox_service, tmp_path, tmp_path_factory, monkeypatch
):
    import components.rl.stage as rl
    from components.core.policy.modeling import load_policy

    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    seen: list[tuple[list[str], list[float]]] = []
    real = rl.verified_reward

    def spy(prompts, completions, verified_reward, attempt_id, **kw):  # what reaches TRL's advantages
        seen.append((list(attempt_id), list(verified_reward)))
        return real(prompts, completions, verified_reward, **kw)

    spy.__name__ = "verified_reward"
    monkeypatch.setattr(rl, "verified_reward", spy)
    before = {k: v.clone() for k, v in load_policy(rl_inputs / "sft")[0].state_dict().items()}
    # No weight decay and no router loss: only the policy-gradient loss can move a weight.
    config = _config(
        sandbox_service,
        save_rollouts=True,
        trl_args={"weight_decay": 0.0, "router_aux_loss_coef": 0.0},
        traces=TraceConfig(sample_rate=0.5),
    )
    db = tmp_path_factory.getbasetemp() / "rl-eval-mlflow.db"  # one sqlite store per session: its tables cost seconds
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{db}", experiment="rl-test")
    result = train_rl(config, rl_inputs / "tasks", rl_inputs / "sft", tmp_path / "rl", tracking=tracking)

    records = [PromptRecord.model_validate_json(line) for line in open(result.records_path)]
    assert len(records) == 3  # one prompt per step (batch_prompts=1)
    # Two tasks, three steps: TRL deals both in the first pass, so `broken` (never a group) takes a step of its own.
    # That optimizer step trained on nothing and is no update for the promotion gate.
    assert result.steps_done + result.steps_without_update == 3 and math.isfinite(result.metrics["final_loss"])
    assert result.steps_done == sum(r.kept for r in records) == result.informative_groups
    assert result.steps_done > 0 and result.steps_without_update > 0
    episodes = {t.id: t for t in TrajectoryStore(tmp_path / "rl" / "rollouts").read()}
    assert sum(r.generated for r in records) == len(episodes) == result.trajectories
    broken = [r for r in records if r.prompt_id == "broken"]
    assert broken and all(
        not r.kept and r.drop_reason == "aborted" and r.pool_aborted == r.generated > 0 for r in broken
    )
    assert result.infra_errors == sum(t.outcome is Outcome.infra_error for t in episodes.values()) > 0
    assert result.metrics["dropped_groups"] == sum(not r.kept for r in records)
    # BAR groups reach TRL's advantage computation as N consecutive completions of one prompt: the
    # group the sampler chose, or N placeholders without a reward (no gradient) for a dropped one.
    assert len(seen) == 3
    for record, (ids, rewards) in zip(records, seen):
        assert len(ids) == len(rewards) == 2
        if record.kept:
            assert ids == record.group_attempt_ids and sorted(rewards) == [-1.0, 1.0]
            assert {episodes[i].task_id for i in ids} == {"coin"}
        else:
            assert ids == ["", ""] and rewards == [None, None]  # no reward: out of every mean and std
    model, _ = load_policy(tmp_path / "rl")
    after = model.state_dict()
    unchanged = [n for n, _ in model.named_parameters() if torch.equal(before[n], after[n])]
    assert not unchanged, f"{len(unchanged)} parameters did not change: {unchanged[:5]}"
    assert result.weight_change and result.weight_change > 0  # the result says how far the weights moved
    assert json.loads((tmp_path / "rl" / "config.json").read_text())["model_type"] == "qwen3_moe"

    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    (run,) = mlflow.search_runs(experiment_names=["rl-test"], output_format="list")
    assert run.data.params["rollout.sampler"] == "bar"
    assert run.data.metrics["final.steps_done"] == result.steps_done
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"bar_group_statistics.png", "rollout_records.json", "rl_result.json"} <= artifacts
    # Per-step metrics are curves over the optimizer steps (what the notebook overlays), not one value.
    client = mlflow.MlflowClient()
    for name in ("learning/2_loss", "sampler.informative_groups"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == [1, 2, 3], name
    # The rollout's rates exist for the steps that had a verified episode (the broken task's steps had none).
    verified_steps = {r.step + 1 for r in records if r.pool_positives + r.pool_negatives}
    assert {m.step for m in client.get_metric_history(run.info.run_id, "learning/3_entropy")} <= {1, 2, 3}
    for name in ("learning/1_resolved_rate", "learning/5_uniform_group_share"):
        history = client.get_metric_history(run.info.run_id, name)
        assert {m.step for m in history} == verified_steps and all(0 <= m.value <= 1 for m in history), name
    # The headline curves are the run page's first charts: the first section by name, in position order.
    sections = sorted(k for k in run.data.metrics if "/" in k)
    assert sections[:5] == [
        "learning/1_resolved_rate",
        "learning/2_loss",
        "learning/3_entropy",
        "learning/5_uniform_group_share",
        "learning/6_reward",
    ]
    assert all(k.startswith(("learning/", "trl/")) for k in sections)
    # A sample of the rollout episodes as traces of this run, chosen by trajectory id across the rollout calls.
    traces = client.search_traces(experiment_ids=[run.info.experiment_id], run_id=run.info.run_id)
    sample = sampled(list(episodes.values()), config.traces)
    assert 0 < len(sample) < len(episodes)
    assert (
        sum(m.value for m in client.get_metric_history(run.info.run_id, "traces_logged")) == len(traces) == len(sample)
    )
    assert {t.info.tags["orchard.stage"] for t in traces} <= {"rl"}
    assert sorted(
        next(s for s in t.data.spans if s.parent_id is None).attributes["trajectory_id"] for t in traces
    ) == sorted(t.id for t in sample)


def test_steps_with_only_dropped_groups_leave_every_weight_as_it_was(rl_inputs, sandbox_service, tmp_path):
    """A batch of placeholders (every attempt an infra error) is an optimizer step that changes nothing: no
    router loss of the MoE policy, no weight decay, no AdamW momentum step (`rl.signal_only`)."""
    from components.core.policy.modeling import load_policy
    from components.core.data.parquet_store import TaskStore

    broken_only = TaskStore(tmp_path / "tasks")
    broken_only.write([t for t in TaskStore(rl_inputs / "tasks").read() if t.id == "broken"])
    before = {k: v.clone() for k, v in load_policy(rl_inputs / "sft")[0].state_dict().items()}
    config = _config(sandbox_service, steps=2, weight_decay=0.1)
    result = train_rl(config, tmp_path / "tasks", rl_inputs / "sft", tmp_path / "rl")

    assert (result.steps_without_update, result.steps_done, result.informative_groups) == (2, 0, 0)
    after = load_policy(tmp_path / "rl")[0].state_dict()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert not changed, f"{len(changed)} tensors moved without a reward signal: {changed[:5]}"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"engine": "builtin"}, "builtin RL engine .* was removed"),
        ({"engine": "trl"}, "rl.engine was removed"),
        ({"trl_args": {"scale_rewards": "group"}}, "would rescale them"),
        ({"trl_args": {"scale_rewards": True}}, "would rescale them"),
        ({"trl_args": {"multi_objective_aggregation": "normalize_then_sum"}}, "would rescale them"),
        (
            {"trl_args": {"reward_weights": [1.0, 1.0]}, "rollout": {"advantage_baseline": "group"}},
            "reward_weights is set by the RL stage",
        ),
        ({"rollout": {"lookahead": 4, "history": True}}, "lookahead cannot apply"),
    ],
)
def test_settings_trl_cannot_honour_are_refused(setting, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        RLConfig.model_validate(setting)
    config = RLConfig.model_validate({"rollout": {"sampler": "fixed"}})  # left out: the pool rule, drawn, no refill
    assert (config.rollout.advantage_baseline, config.rollout.group_choice, config.rollout.refill) == (
        "pool",
        "random",
        False,
    )
    assert RLConfig.model_validate(config.model_dump()) == config  # a dumped config (pipelines) loads back
    assert RLConfig.model_validate({"rollout": {"refill": True}}).rollout.refill  # BAR's refill inside rollout_func
    # TRL's own scaling stays open to the group rule, and "none" to the pool rule.
    assert RLConfig(trl_args={"scale_rewards": "batch"}, rollout=RolloutConfig(advantage_baseline="group"))
    assert RLConfig(trl_args={"scale_rewards": False})


def test_grpo_args_map_our_fields_one_to_one(tmp_path):
    from components.rl.stage import grpo_args

    config = RLConfig(
        steps=5,
        learning_rate=1e-4,
        epochs_per_batch=2,
        clip_eps=0.1,
        clip_eps_high=0.3,
        kl_coef=0.05,
        temperature=0.7,
        rollout=RolloutConfig(group_size=4, max_rollouts_per_prompt=8, batch_prompts=3),
        trl_args={"loss_type": "dapo", "epsilon": 0.15},
    )
    args = grpo_args(config, tmp_path)
    assert (args.max_steps, args.learning_rate, args.num_iterations, args.epsilon_high, args.beta) == (
        5,
        1e-4,
        2,
        0.3,
        0.05,
    )
    assert (args.num_generations, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 4, 3)
    assert args.temperature == 0.7 and args.loss_type == "dapo" and args.epsilon == 0.15  # trl_args override
    # reward_functions() = [verified reward, sampler's advantage]: the pool rule trains on the second as it is,
    # the group rule lets TRL compute group advantages from the first.
    from components.rl.stage import reward_functions

    assert [f.__name__ for f in reward_functions()] == ["verified_reward", "sampler_advantage"]
    assert (args.reward_weights, args.scale_rewards) == ([0.0, 1.0], "none")
    group = grpo_args(
        config.model_copy(update={"rollout": config.rollout.model_copy(update={"advantage_baseline": "group"})}),
        tmp_path,
    )
    assert (group.reward_weights, group.scale_rewards) == ([1.0, 0.0], "group")
