"""The promotion gate stage against a real sqlite registry, real evaluations and a real sandbox service.

Candidates are real model directories; what makes one 'better' is its evaluation, built at the stage
boundary by evaluating the scripted teacher (resolves everything) in its place. The champion is always
downloaded from the registry and evaluated for real; registrations and alias moves are real.
"""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest

from components.core.episode.harness import HarnessConfig
from components.core.policy.modeling import InitPolicyConfig, ModelConfig, TokenizerConfig, save_policy
from components.tiny_model import build_policy
from components.core.policy.base import GenerationConfig
from components.core.tracking import TrackingConfig, open_pipeline_run
from components.evaluate import EvalConfig, evaluate
from components.promote import PromotionConfig, current_champion
from components.provision import ProvisionConfig, provision_environment
from components.promote.stage import GateConfig, run_gate

NAME = "gate-stage-test"


@pytest.fixture
def world(sandbox_service, tmp_path):
    """Held-out tasks, an untrained model, its real evaluation, and an evaluation that resolves all tasks."""
    provision_environment(
        ProvisionConfig(n_train=1, n_heldout=3, difficulty=[1], sandbox=sandbox_service.connection()),
        tmp_path / "tasks",
    )
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    save_policy(model, tokenizer, tmp_path / "model")
    harness = HarnessConfig(max_steps=2, generation=GenerationConfig(max_new_tokens=16))
    eval_config = EvalConfig(k=1, harness=harness, sandbox=sandbox_service.connection())
    evaluate(eval_config, tmp_path / "tasks", tmp_path / "model", tmp_path / "eval-weak")
    evaluate(
        eval_config.model_copy(
            update={"policy": "scripted", "scripted_error_rate": 0.0, "harness": HarnessConfig(max_steps=10)}
        ),
        tmp_path / "tasks",
        None,
        tmp_path / "eval-strong",
    )
    (tmp_path / "credited").mkdir()
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "credited" / "part-00000.parquet")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # three tasks: all three improved is p = 1/8 by the exact sign test, so the test gate is a one-off gate at
    # alpha 0.3 (0.15 for each of two candidates when RL made updates)
    config = GateConfig(
        promotion=PromotionConfig(model_name=NAME, min_tasks=3, alpha=0.3, schedule_gates=1),
        evaluate=eval_config,
        sandbox=sandbox_service.connection(),
    )
    return tmp_path, uri, config


def _candidate(root, name: str, steps: int, stage: str = "sft"):
    """A model directory as the sft (rl) stage leaves it: the weights and the sft_result.json (rl_result.json)."""
    src = root / "model"
    dst = root / name
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    (dst / f"{stage}_result.json").write_text(json.dumps({"steps": steps} if stage == "sft" else {"steps_done": steps}))
    return dst


def _gate(root, uri, config, model, evaluation, n: int, start=None, rl=None):
    """One gate run; `rl`: (RL model dir, its evaluation) when RL made updates (else an RL dir without any)."""
    tracking = TrackingConfig(tracking_uri=uri, experiment="gate")
    parent = open_pipeline_run(tracking, f"pipeline-{n}")
    tracking = tracking.model_copy(update={"parent_run_id": parent, "run_name": "promote"})
    if rl is None:
        rl = (root / f"rl-{n}", root / "unused")
        rl[0].mkdir()
    result = run_gate(
        config,
        root / "tasks",
        root / "model",
        model,
        rl[0],
        evaluation,
        rl[1],
        root / "credited",
        root / f"gate-{n}",
        tracking,
        base_results=start,
    )
    mlflow.end_run()
    return result, parent


def test_first_promotes_worse_and_untrained_are_rejected_better_moves_the_alias(world):
    root, uri, config = world
    client = mlflow.MlflowClient(uri)

    # No champion yet: the first candidate must beat the model training started from (evaluate-untrained).
    level, _ = _gate(root, uri, config, _candidate(root, "c0", 2), root / "eval-weak", 0, start=root / "eval-weak")
    assert not level.promoted and "its start" in level.reason and current_champion(uri, config.promotion) is None
    first, parent = _gate(
        root, uri, config, _candidate(root, "c1", 2), root / "eval-strong", 1, start=root / "eval-weak"
    )
    assert first.promoted and first.candidate_version == "1" and "better than its start" in first.reason
    v1 = current_champion(uri, config.promotion)
    assert str(v1.version) == "1"
    assert v1.tags["orchard.parent_model"] == "base (init-policy)"
    assert v1.tags["orchard.pipeline_run_id"] == parent and v1.tags["orchard.git_commit"]
    assert v1.tags["orchard.trained_shards"] == "part-00000.parquet"
    assert v1.tags["orchard.evaluation_table"].endswith("promotion/comparison.json")
    # the version's card: training, data, evaluation with its interval, the gate's reason, limits
    card = v1.description
    assert card.startswith("# Agent policy trained by orchard") and "## Limits" in card
    assert f"pipeline run `{parent}`" in card and "1 credited teacher-trajectory shard(s)" in card
    assert f"held-out pass@1 {first.candidate_mean:.3f} on 3 tasks vs {first.champion_mean:.3f} for the start" in card
    assert f"95% interval [{first.ci_low:+.3f}, {first.ci_high:+.3f}]" in card and first.reason in card
    # and a signature: prompts in, completions out, max_new_tokens as a parameter
    signature = mlflow.models.get_model_info(v1.source).signature
    assert [c.name for c in signature.inputs.inputs] == ["prompt"]
    assert [(p.name, p.default) for p in signature.params.params] == [("max_new_tokens", 64)]
    assert client.get_run(parent).data.tags["orchard.promotion"] == "promoted"
    # the version is listed under the pipeline's parent run; its model (and the data it trained on) under promote
    assert v1.run_id == parent
    gate_run = client.get_run(mlflow.models.get_model_info(v1.source).run_id)
    assert gate_run.info.run_name == "promote"
    assert any(i.dataset.name == "training-shards" for i in gate_run.inputs.dataset_inputs)

    untrained, parent = _gate(
        root, uri, config, _candidate(root, "c2", 0), root / "eval-strong", 2, start=root / "eval-weak"
    )
    assert not untrained.promoted and "not trained" in untrained.reason
    assert client.get_run(parent).data.tags["orchard.promotion_reason"] == untrained.reason

    # The same weights as the champion, evaluated the same way: no better, so the champion stays.
    same, _ = _gate(root, uri, config, _candidate(root, "c3", 2), root / "eval-weak", 3)
    assert not same.promoted and "not better than champion v1" in same.reason and same.tasks == 3
    assert same.reference == "champion"
    assert (root / "gate-3" / "champion_eval" / "per_task.parquet").exists()  # the champion was evaluated
    assert str(current_champion(uri, config.promotion).version) == "1"
    assert len(client.search_model_versions(f"name='{NAME}'")) == 1  # rejected candidates are never registered

    better, parent = _gate(root, uri, config, _candidate(root, "c4", 2), root / "eval-strong", 4)
    assert better.promoted and better.candidate_version == "2" and better.p_value <= 0.125, better.reason
    v2 = current_champion(uri, config.promotion)
    assert str(v2.version) == "2" and v2.tags["orchard.parent_model"] == "base (init-policy)"
    assert {str(v.version) for v in client.search_model_versions(f"name='{NAME}'")} == {"1", "2"}
    artifacts = {a.path for a in client.list_artifacts(mlflow.models.get_model_info(v2.source).run_id, "promotion")}
    assert {"promotion/comparison.png", "promotion/comparison.json", "promotion/decision.json"} <= artifacts
    assert client.get_run(parent).data.tags["orchard.registered_model"] == f"{NAME}/2"
    # the parent's description links the version (the UI's model-version page)
    assert (
        client.get_run(parent).data.tags["mlflow.note.content"]
        == f"- registered: [{NAME} version 2](#/models/{NAME}/versions/2) (from sft)"
    )

    # retrain.start_from=champion: init-policy starts from the champion's weights, and says so
    from pipelines import stages
    from components.init_policy import STARTED_FROM, InitConfig

    init = InitConfig(
        model=InitPolicyConfig(tiny=ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[]))),
        start_from="champion",
        promotion=config.promotion,
    )
    out = stages.init_policy(
        stages.StageCall(
            config=init,
            inputs={},
            outputs={"model": root / "start"},
            tracking=TrackingConfig(tracking_uri=uri, experiment="gate"),
        )
    )
    assert out["started_from"] == f"models:/{NAME}/2"
    assert json.loads((root / "start" / STARTED_FROM).read_text())["model"] == f"models:/{NAME}/2"
    assert (root / "start" / "config.json").exists()


def test_rl_ships_only_when_it_beat_the_sft_model_it_started_from(world):
    """RL that made updates but scored what SFT scored is not the candidate (SFT is, and is judged at half the
    level: two models could have been promoted); RL that beat SFT on the same tasks is, and is registered as rl."""
    root, uri, config = world
    client = mlflow.MlflowClient(uri)
    same, _ = _gate(
        root,
        uri,
        config,
        _candidate(root, "s1", 2),
        root / "eval-strong",
        10,
        start=root / "eval-weak",
        rl=(_candidate(root, "r1", 3, "rl"), root / "eval-strong"),
    )
    assert same.candidate_stage == "sft" and same.rl_vs_sft.difference == 0.0 and not same.rl_vs_sft.passed
    assert "RL did not beat SFT" in same.reason and same.alpha == pytest.approx(0.15)
    assert (
        same.promoted
        and client.get_run(current_champion(uri, config.promotion).run_id).data.tags["orchard.registered_from"] == "sft"
    )
    # the champion now resolves nothing better than the tiny model: RL that beat SFT beats it too
    better, _ = _gate(
        root,
        uri,
        config,
        _candidate(root, "s2", 2),
        root / "eval-weak",
        11,
        rl=(_candidate(root, "r2", 3, "rl"), root / "eval-strong"),
    )
    assert better.candidate_stage == "rl" and better.rl_vs_sft.passed and better.reference == "champion", better.reason
    assert better.metrics["rl_beat_sft"] == 1.0 and better.promoted and better.candidate_version == "2"
    assert client.get_run(current_champion(uri, config.promotion).run_id).data.tags["orchard.registered_from"] == "rl"


def test_a_tuning_run_on_the_validation_split_never_promotes(tmp_path):
    """Settings chosen by looking at validation results: those results cannot also promote the model."""
    from components.evaluate import EvalConfig

    def evaluation(name: str, solved: int) -> object:
        path = tmp_path / name
        path.mkdir()
        pd.DataFrame(
            {
                "task_id": [f"t{i}" for i in range(12)],
                "unit": [f"u{i}" for i in range(12)],
                "pass_at_1": [float(i < solved) for i in range(12)],
            }
        ).to_parquet(path / "per_task.parquet")
        (path / "eval_result.json").write_text(json.dumps({"valid_attempts": 12, "infra_error_rate": 0.0}))
        return path

    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "sft_result.json").write_text(json.dumps({"steps": 5}))
    (tmp_path / "rl").mkdir()
    config = GateConfig(promotion=PromotionConfig(schedule_gates=1), evaluate=EvalConfig(split="validation"))
    result = run_gate(
        config,
        tmp_path,
        tmp_path / "base",
        sft,
        tmp_path / "rl",
        evaluation("sft-eval", 12),
        tmp_path / "none",
        tmp_path,
        tmp_path / "gate",
        tracking=None,
        base_results=evaluation("base-eval", 0),
    )
    assert not result.promoted and "only held-out results promote" in result.reason
    assert result.candidate_stage == "sft"
