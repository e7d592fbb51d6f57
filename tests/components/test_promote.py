"""The promotion gate: the rule on scorecards, then the alias in a real MLflow registry (sqlite)."""

from __future__ import annotations

import pytest

from components.promote import (PromotionConfig, Scorecard, current_champion, decide, download_champion, log_policy_model,
                               promote)

TASKS = [f"t{i:03d}" for i in range(60)]


def card(rates: list[float], trained: bool = True, infra: float = 0.0, valid: int = 120) -> Scorecard:
    return Scorecard(policy="p", per_task_pass_at_1=dict(zip(TASKS, rates)), valid_attempts=valid,
                     infra_error_rate=infra, trained=trained)


CHAMPION = card([1.0] * 20 + [0.5] * 20 + [0.0] * 20)


def test_first_trained_candidate_is_promoted_after_the_checks():
    config = PromotionConfig()
    assert decide(card([0.0] * 60), None, config).promoted  # nothing to beat
    untrained = decide(card([1.0] * 60, trained=False), None, config)
    assert not untrained.promoted and "not trained" in untrained.reason
    flood = decide(card([1.0] * 60, infra=0.9), None, config)
    assert not flood.promoted and "infrastructure" in flood.reason
    assert not decide(card([float("nan")] * 60, valid=0), None, config).promoted


def test_only_a_candidate_better_by_the_paired_interval_is_promoted():
    config = PromotionConfig()
    better = card([1.0] * 20 + [0.75] * 20 + [0.25] * 20)  # +0.17 on average, on the same tasks
    up = decide(better, CHAMPION, config, champion_version="3")
    assert up.promoted and up.ci_low > 0 and up.tasks == 60 and up.difference == pytest.approx(1 / 6)
    same = decide(card(list(CHAMPION.per_task_pass_at_1.values())), CHAMPION, config, champion_version="3")
    assert not same.promoted and "not better than champion v3" in same.reason
    worse = decide(card([0.0] * 60), CHAMPION, config, champion_version="3")
    assert not worse.promoted and worse.ci_high < 0
    # a small, noisy gain: the interval straddles zero; a margin below the gain lets it through
    noisy = card([1.0] * 19 + [0.0] + [0.5] * 17 + [1.0] * 3 + [0.0] * 20)  # +0.5 over 60 tasks
    assert not decide(noisy, CHAMPION, config).promoted
    assert decide(noisy, CHAMPION, PromotionConfig(margin=0.008)).promoted
    assert not decide(noisy, CHAMPION, PromotionConfig(margin=0.2)).promoted


def test_the_alias_moves_only_on_promotion_and_old_versions_stay(tmp_path):
    import mlflow

    from components.core.modeling import ModelConfig, TokenizerConfig, build_policy, save_policy

    uri = f"sqlite:///{tmp_path}/registry.db"
    config = PromotionConfig(model_name="gate-test")
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("gate-test")  # not whatever experiment an earlier test left active
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    save_policy(model, tokenizer, tmp_path / "m")

    def logged() -> str:
        with mlflow.start_run():
            return log_policy_model(tmp_path / "m")

    assert current_champion(uri, config) is None
    v1 = promote(uri, config, logged(), {"orchard.parent_model": "base", "orchard.git_commit": "abc"}, "first")
    champion = current_champion(uri, config)
    assert str(champion.version) == v1 and champion.tags["orchard.git_commit"] == "abc"
    assert champion.description == "first"
    v2 = promote(uri, config, logged(), {"orchard.parent_model": f"gate-test/{v1}"}, "second")
    assert str(current_champion(uri, config).version) == v2 != v1
    client = mlflow.MlflowClient(uri)
    assert {str(v.version) for v in client.search_model_versions("name='gate-test'")} == {v1, v2}  # v1 kept
    registered = client.get_registered_model("gate-test")
    assert "promotion gate" in registered.description and registered.tags["orchard.kind"] == "agent-policy"
    assert registered.tags["orchard.latest_version"] == v2
    local = download_champion(uri, current_champion(uri, config), tmp_path / "download")
    assert (local / "config.json").exists() and (local / "tokenizer_config.json").exists()
