"""The RL stage end to end: tiny policy, real sandboxes, real verifier, real updates, MLflow.

Two training tasks: a coin task whose verifier resolves with probability 1/2 whatever the agent does
(so groups have mixed rewards and training happens even for an untrained policy), and a task whose
sandbox cannot be created (every attempt ends in infra_error). The second must never give a reward.
"""

import json
import math

import torch

from components.core.harness import HarnessConfig
from components.core.policy_base import GenerationConfig
from components.core.schema import Outcome
from components.core.store import TrajectoryStore
from components.core.tracking import TrackingConfig
from components.rl import RLConfig, train_rl
from components.rl_sampler import PromptRecord, RolloutConfig



def test_rl_steps_train_the_policy_and_infra_errors_never_become_rewards(rl_inputs, sandbox_service, tmp_path,
                                                                         tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    root = rl_inputs
    config = RLConfig(
        # N=2 with exactly one positive: the smallest balanced group, so the test stays fast.
        rollout=RolloutConfig(group_size=2, max_rollouts_per_prompt=6, stride=2, rho_min=0.5, rho_max=0.5,
                              batch_prompts=1, max_prompts_per_batch=6),
        steps=2, learning_rate=1e-3, epochs_per_batch=2, kl_coef=0.05, save_rollouts=True,
        harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=8)),
        sandbox=sandbox_service.connection(), seed=3,
        num_threads=1,  # tiny tensors: a second thread only adds contention on a shared machine
    )
    # One sqlite store per session (basetemp is shared): creating its tables costs seconds.
    db = tmp_path_factory.getbasetemp() / "rl-eval-mlflow.db"
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{db}", experiment="rl-test")
    result = train_rl(config, root / "tasks", root / "sft", tmp_path / "rl", tracking=tracking)

    assert result.steps_done == 2 and result.informative_groups == 2
    assert math.isfinite(result.metrics["final_loss"])

    records = [PromptRecord.model_validate_json(line) for line in open(result.records_path)]
    episodes = {t.id: t for t in TrajectoryStore(tmp_path / "rl" / "rollouts").read()}
    assert sum(r.generated for r in records) == len(episodes) == result.trajectories
    broken = [r for r in records if r.prompt_id == "broken"]
    assert all(not r.kept and r.drop_reason == "aborted" and r.pool_aborted == r.generated for r in broken)
    assert result.infra_errors == sum(t.outcome is Outcome.infra_error for t in episodes.values()) > 0
    for r in records:
        if r.kept:
            group = [episodes[i] for i in r.group_attempt_ids]
            assert {t.outcome for t in group} == {Outcome.resolved, Outcome.unresolved}
            assert all(t.task_id == "coin" for t in group)

    # Every weight the loss reaches moved; the checkpoint loads like the SFT one.
    from components.core.modeling import load_policy_model

    before, after = load_policy_model(root / "sft").state_dict(), load_policy_model(tmp_path / "rl").state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > 0.5 * len(before)
    assert all(".experts." in k or "rotary" in k for k in before if k not in changed)

    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    (run,) = mlflow.search_runs(experiment_names=["rl-test"], output_format="list")
    assert run.data.params["rollout.sampler"] == "bar"
    assert run.data.metrics["final.informative_groups"] == 2
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"bar_group_statistics.png", "rollout_records.json", "rl_result.json"} <= artifacts
    # Per-step metrics are curves over the optimizer steps (what the notebook overlays), not one value.
    client = mlflow.MlflowClient()
    for name in ("loss", "reward_mean_all", "sampler.informative_groups"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == [0, 1], name
    assert json.loads((tmp_path / "rl" / "config.json").read_text())["model_type"] == "qwen3_moe"
