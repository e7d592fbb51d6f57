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


def test_the_first_trained_candidate_must_beat_the_model_it_started_from():
    config = PromotionConfig()
    start = card([0.0] * 30 + [0.5] * 30)
    better = decide(card([0.5] * 30 + [1.0] * 30), None, config, start=start)
    assert better.promoted and better.reference == "start" and "its start" in better.reason
    worse = decide(card([0.0] * 60), None, config, start=start)
    assert not worse.promoted  # once "nothing to beat" promoted this
    nothing = decide(card([1.0] * 60), None, config)
    assert not nothing.promoted and "nothing shows" in nothing.reason
    untrained = decide(card([1.0] * 60, trained=False), None, config, start=start)
    assert not untrained.promoted and "not trained" in untrained.reason
    flood = decide(card([1.0] * 60, infra=0.9), None, config, start=start)
    assert not flood.promoted and "infrastructure" in flood.reason
    assert not decide(card([float("nan")] * 60, valid=0), None, config, start=start).promoted


def test_only_a_candidate_better_by_the_exact_paired_test_is_promoted():
    config = PromotionConfig()
    better = card([1.0] * 20 + [0.75] * 20 + [0.25] * 20)  # +0.17 on average, on the same tasks
    up = decide(better, CHAMPION, config, champion_version="3")
    assert up.promoted and up.p_value < 0.05 and up.tasks == 60 and up.difference == pytest.approx(1 / 6)
    same = decide(card(list(CHAMPION.per_task_pass_at_1.values())), CHAMPION, config, champion_version="3")
    assert not same.promoted and "champion v3" in same.reason
    worse = decide(card([0.0] * 60), CHAMPION, config, champion_version="3")
    assert not worse.promoted and worse.ci_high < 0
    noisy = card([1.0] * 19 + [0.0] + [0.5] * 17 + [1.0] * 3 + [0.0] * 20)  # +0.008 over 60 tasks
    assert not decide(noisy, CHAMPION, config).promoted
    assert not decide(noisy, CHAMPION, PromotionConfig(margin=0.008)).promoted  # a margin is to be exceeded


def _binary(wins: int, losses: int, ties: int) -> tuple[Scorecard, Scorecard]:
    """One attempt per task: `wins` tasks only the candidate solves, `losses` only the reference, ties both fail."""
    tasks = [f"t{i:03d}" for i in range(wins + losses + ties)]
    cand = [1.0] * wins + [0.0] * losses + [0.0] * ties
    ref = [0.0] * wins + [1.0] * losses + [0.0] * ties
    return (Scorecard(policy="c", per_task_pass_at_1=dict(zip(tasks, cand)), valid_attempts=len(tasks),
                      infra_error_rate=0.0),
            Scorecard(policy="r", per_task_pass_at_1=dict(zip(tasks, ref)), valid_attempts=len(tasks),
                      infra_error_rate=0.0))


@pytest.mark.parametrize(("wins", "losses", "ties", "promoted"), [
    (1, 0, 0, False), (2, 0, 0, False), (3, 0, 0, False),  # 1-3 tasks all improved: sign-test p 0.5 / 0.25 / 0.125
    (4, 0, 12, False),  # 4-of-16 flips, none against: exact McNemar p = 0.0625
    (5, 0, 11, True),  # p = 1/32
    (6, 1, 9, False),  # p = 8/128
    (0, 0, 16, False),  # an equal candidate, margin 0
])
def test_the_known_false_promotions_are_gone(wins, losses, ties, promoted):
    cand, ref = _binary(wins, losses, ties)
    decision = decide(cand, ref, PromotionConfig(min_tasks=1), champion_version="1")
    assert decision.promoted is promoted, decision.reason
    if wins + losses + ties < 10:
        assert not decide(cand, ref, PromotionConfig(), champion_version="1").promoted  # min_tasks


@pytest.mark.parametrize("alpha", [0.05, 0.10])
def test_the_false_promotion_rate_per_gate_is_at_most_alpha(alpha):
    """Candidate and champion are the same policy: per-task pass rates spread out, k attempts each, both
    evaluated independently. The share of promotions is the gate's false-promotion rate."""
    import numpy as np

    rng = np.random.default_rng(3)
    runs, promoted = 600, 0
    config = PromotionConfig(alpha=alpha, resamples=200)
    for run in range(runs):
        tasks, k = (16, 1) if run % 2 else (40, 4)
        rates = rng.beta(0.6, 0.9, size=tasks)
        names = [f"t{i}" for i in range(tasks)]

        def evaluated() -> Scorecard:
            return Scorecard(policy="p", valid_attempts=tasks * k, infra_error_rate=0.0,
                             per_task_pass_at_1=dict(zip(names, rng.binomial(k, rates) / k)))

        promoted += decide(evaluated(), evaluated(), config, champion_version="1").promoted
    rate = promoted / runs
    assert rate <= alpha + 2 * np.sqrt(alpha * (1 - alpha) / runs), rate


def test_the_alias_moves_only_on_promotion_and_old_versions_stay(tmp_path):
    import mlflow

    from components.core.modeling import ModelConfig, TokenizerConfig, save_policy
    from components.tiny_model import build_policy

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
    client = mlflow.MlflowClient(uri)
    parent = client.create_run(mlflow.get_experiment_by_name("gate-test").experiment_id).info.run_id
    v2 = promote(uri, config, logged(), {"orchard.parent_model": f"gate-test/{v1}", "orchard.pipeline_run_id": parent},
                 "second")
    assert str(current_champion(uri, config).version) == v2 != v1
    # the version belongs to the pipeline's parent run: that run's page lists it under "Registered models"
    (mine,) = client.search_model_versions(f"run_id = '{parent}'")
    assert str(mine.version) == v2 and mine.source.startswith("models:/")
    assert {str(v.version) for v in client.search_model_versions("name='gate-test'")} == {v1, v2}  # v1 kept
    registered = client.get_registered_model("gate-test")
    assert "promotion gate" in registered.description and registered.tags["orchard.kind"] == "agent-policy"
    assert registered.tags["orchard.latest_version"] == v2
    local = download_champion(uri, current_champion(uri, config), tmp_path / "download")
    assert (local / "config.json").exists() and (local / "tokenizer_config.json").exists()
