"""SFT: which tokens train under each mode, and real Trainer steps on the tiny Qwen3-MoE policy."""

from __future__ import annotations

import pytest
import torch

from components.core.policy.modeling import ModelConfig, TokenizerConfig, load_policy
from components.tiny_model import build_tokenizer
from components.core.rendering.tokens import render_trajectory
from components.core.data.schema import EpisodeStatus, Outcome, Step, TokenRole, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore
from components.core.tracking import TrackingConfig
from components.sft.stage import SFTConfig, train_sft
from components.sft.data import SampleDataset, build_samples
from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import Generation
from components.sft.tokens import trajectory_to_tokens
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import generate_tasks
from components.recipes.swe.teacher import ScriptedTeacher

TINY = ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[]))


def _trajectory(outcome: Outcome, credited: list[bool | None], tag: str) -> Trajectory:
    steps = [
        Step(index=0, role="system", content="You fix bugs."),
        Step(index=1, role="user", content=f"Bug in `mathkit/core.py`: fix `add_{tag}`."),
    ]
    for k, flag in enumerate(credited):
        call = ToolCall(name="read_file", arguments={"path": f"mathkit/core_{k}.py"})
        steps.append(
            Step(
                index=len(steps),
                role="assistant",
                tool_call=call,
                credited=flag,
                content=f'<tool_call>{{"name": "read_file", "arguments": {{"path": "mathkit/core_{k}.py"}}}}</tool_call>',  # noqa: E501
            )
        )
        steps.append(
            Step(
                index=len(steps), role="tool", content=f"def add_{tag}(a, b):\n    return a - b\n", tool_call_id=call.id
            )
        )
    return Trajectory(task_id=f"t-{tag}", recipe="swe", policy_id="teacher", steps=steps, outcome=outcome)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TINY.tokenizer)


@pytest.fixture()
def store(tmp_path):
    trajs = [
        _trajectory(Outcome.resolved, [True, True, True], "r1"),
        _trajectory(Outcome.resolved, [None, None], "r2"),  # resolved, never labelled: still whole
        _trajectory(Outcome.unresolved, [False, True, False], "u1"),
        _trajectory(Outcome.unresolved, [False, False], "u2"),  # no credited step: dropped in 'credited'
        _trajectory(Outcome.infra_error, [None], "i1").model_copy(update={"status": EpisodeStatus.aborted}),
    ]
    TrajectoryStore(tmp_path / "trajs").append(trajs)
    return tmp_path / "trajs", trajs


def _loss_steps(sample) -> set[int]:
    return {i for i, m in zip(sample.step_index, sample.loss_mask) if m}


def test_modes_select_the_right_tokens_token_by_token(store, tokenizer):
    _, trajs = store
    by_tag = {t.task_id: t for t in trajs}
    for mode, expected in {
        "resolved_only": {"t-r1": {2, 4, 6}, "t-r2": {2, 4}},
        "whole": {"t-r1": {2, 4, 6}, "t-r2": {2, 4}, "t-u1": {2, 4, 6}, "t-u2": {2, 4}},
        "credited": {"t-r1": {2, 4, 6}, "t-r2": {2, 4}, "t-u1": {4}},
    }.items():
        samples, stats = build_samples(trajs, tokenizer, mode, max_len=4096)
        got = {s.trajectory_id: _loss_steps(s) for s in samples}
        assert got == {by_tag[k].id: v for k, v in expected.items()}, mode
        assert stats.skipped_infra_error == 1
        for s in samples:
            traj = next(t for t in trajs if t.id == s.trajectory_id)
            assert s.input_ids == render_trajectory(traj, tokenizer, loss_on="none").input_ids  # full context kept
            for role, m in zip(s.roles, s.loss_mask):
                assert not (m and role != TokenRole.assistant)  # never tool, system or user tokens
    # labels follow the mask exactly (-100 elsewhere)
    samples, _ = build_samples(trajs, tokenizer, "credited", max_len=4096)
    item = SampleDataset(samples)[0]
    assert [lab != -100 for lab in item["labels"]] == [bool(m) for m in samples[0].loss_mask]


class OneMalformedCall(ScriptedTeacher):
    """The scripted teacher, except that its second turn is a tool call that does not parse."""

    def generate(self, messages, config):
        if sum(m.role == "assistant" for m in messages) == 1:
            return Generation(text='<tool_call>{"name": "bash", "arguments": {"command": ', completion_tokens=9)
        return super().generate(messages, config)


@pytest.mark.parametrize("mode", ["resolved_only", "whole", "credited"])
def test_a_malformed_call_carries_no_loss_in_any_mode(sandbox_client, tokenizer, mode):
    task = generate_tasks("train", 1, 5, difficulty=1)[0]
    traj = run_episode(task, SWERecipe(), OneMalformedCall(error_rate=0.0), sandbox_client, HarnessConfig())
    assert traj.outcome is Outcome.resolved, traj.outcome_reason
    bad = next(s.index for s in traj.steps if s.role == "assistant" and s.policy_error)
    assert traj.steps[bad + 1].content.startswith("Error:")  # the harness's protocol-error observation
    before, after = bad - 2, bad + 2  # the assistant turns either side of it
    assert traj.steps[before].role == traj.steps[after].role == "assistant" and traj.steps[after].tool_call
    if mode == "credited":  # the credited arm's unresolved case: every turn credited, the malformed one too
        traj = traj.model_copy(
            update={
                "outcome": Outcome.unresolved,
                "steps": [s.model_copy(update={"credited": True}) if s.role == "assistant" else s for s in traj.steps],
            }
        )
    samples, stats = build_samples([traj], tokenizer, mode, max_len=1 << 16)
    assert stats.malformed_steps_masked == 1
    assert stats.hidden_pass_fraction_n == 1 and stats.hidden_pass_fraction_mean == 1.0  # the real verdict's
    sample = samples[0]
    labels = SampleDataset(samples)[0]["labels"]
    by_step: dict[int, list[int]] = {}
    for i, step in enumerate(sample.step_index):
        by_step.setdefault(step, []).append(labels[i])
    assert by_step[bad] and all(lab == -100 for lab in by_step[bad])
    for neighbour in (before, after):
        assert any(lab != -100 for lab in by_step[neighbour]), neighbour
    # The export for other trainers applies the same rule.
    row = trajectory_to_tokens(traj, tokenizer, mode=mode)
    assert sum(row["loss_mask"]) == sum(sample.loss_mask)


def test_long_samples_are_cut_at_the_end_and_dropped_without_loss(store, tokenizer):
    _, trajs = store
    samples, stats = build_samples(trajs, tokenizer, "credited", max_len=40)
    assert all(len(s.input_ids) <= 40 for s in samples)
    assert stats.truncated >= 1 and stats.skipped_no_loss >= 1


def test_truncation_warns_above_one_share_and_refuses_to_train_above_another(store, tokenizer, tmp_path, capsys):
    from components.sft.stage import TruncationError, check_truncation

    data, trajs = store
    whole, _ = build_samples(trajs, tokenizer, "credited", max_len=1 << 16)
    longest = max(len(s.input_ids) for s in whole)
    _, full = build_samples(trajs, tokenizer, "credited", max_len=longest)
    assert full.truncated == full.loss_tokens_truncated == 0 and full.truncated_loss_fraction == 0.0
    cut_at = longest // 2
    _, cut = build_samples(trajs, tokenizer, "credited", max_len=cut_at)
    assert cut.truncated >= 1 and 0 < cut.truncated_loss_fraction < 1
    assert cut.loss_tokens + cut.loss_tokens_truncated == full.loss_tokens  # what training lost, exactly

    check_truncation(SFTConfig(max_len=cut_at, truncation_warning=1.0, truncation_limit=1.0), cut)  # tolerated
    assert capsys.readouterr().err == ""
    check_truncation(SFTConfig(max_len=cut_at, truncation_warning=0.0, truncation_limit=1.0), cut)
    warning = capsys.readouterr().err
    assert (
        warning.startswith(f"warning: sft: cutting samples at max_len={cut_at} drops ")
        and "raise sft.max_len" in warning
    )
    with pytest.raises(TruncationError, match=r"above truncation_limit 0%: raise sft.max_len"):
        check_truncation(SFTConfig(max_len=cut_at, truncation_limit=0.0), cut)
    # train_sft checks before it builds a model: a run that would train on scraps fails in seconds
    with pytest.raises(TruncationError):
        train_sft(SFTConfig(mode="credited", steps=1, max_len=40, model=TINY), data, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_few_sft_steps_reduce_loss_and_change_every_parameter(store, tmp_path):
    from components.tiny_model import build_tiny_model

    trajectories_dir, _ = store
    tokenizer = build_tokenizer(TINY.tokenizer)
    before = {k: v.clone() for k, v in build_tiny_model(TINY, tokenizer).state_dict().items()}
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="sft-test")
    config = SFTConfig(mode="credited", steps=12, batch_size=2, learning_rate=3e-3, warmup_steps=2, model=TINY)
    result = train_sft(config, trajectories_dir, tmp_path / "model", tracking=tracking)
    assert result.final_loss < result.first_loss * 0.8
    assert result.data.resolved_used == 2 and result.data.unresolved_used == 1
    model, _ = load_policy(tmp_path / "model")
    after = model.state_dict()
    for name, param in model.named_parameters():
        assert not torch.equal(before[name], after[name]), f"{name} did not change"

    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    run = mlflow.search_runs(experiment_names=["sft-test"], output_format="list")[0]
    assert run.data.params["mode"] == "credited" and run.data.params["model.num_experts"] == "4"
    history = mlflow.MlflowClient(tracking.tracking_uri).get_metric_history(run.info.run_id, "learning/1_loss")
    assert len(history) == 12
    for key in ("tokens_per_s", "masked_token_fraction", "learning/2_grad_norm", "learning/3_learning_rate"):
        assert key in run.data.metrics
    # The loss curve is the first chart of the run page: the first section by name holds it first.
    curves = sorted(k for k in run.data.metrics if "/" in k)
    assert curves[0] == "learning/1_loss" and all(k.startswith("learning/") for k in curves)
    assert 0.0 < run.data.metrics["masked_token_fraction"] < 1.0
    # the exact training data is an MLflow dataset input: the trajectories the mode used, no others
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "sft-credited" and inp.tags[0].value == "training"
    import json

    rows = json.loads(inp.dataset.profile)["num_rows"]
    assert rows == 3  # credited: two resolved + the unresolved one with a credited step


def test_sft_continues_from_a_saved_model_and_rejects_empty_data(store, tmp_path):
    trajectories_dir, trajs = store
    first = train_sft(SFTConfig(mode="whole", steps=3, batch_size=4, model=TINY), trajectories_dir, tmp_path / "a")
    second = train_sft(
        SFTConfig(mode="whole", steps=3, batch_size=4), trajectories_dir, tmp_path / "b", base_model_dir=first.model_dir
    )
    assert second.first_loss < first.first_loss  # it started where the first run ended
    TrajectoryStore(tmp_path / "only-unresolved").append([t for t in trajs if t.outcome is Outcome.unresolved])
    with pytest.raises(ValueError, match="no trainable samples"):
        train_sft(SFTConfig(mode="resolved_only", steps=1, model=TINY), tmp_path / "only-unresolved", tmp_path / "c")


@pytest.mark.slow
@pytest.mark.timeout(900)  # the demo's 200 SFT steps alone take ~4-6 min on 2 cores
def test_trained_tiny_policy_resolves_more_heldout_tasks_than_untrained(sandbox_service, tmp_path):
    """End to end on the demo's task suite and schedule (pipelines/config.py `_DEMO`): teacher trajectories
    -> SFT -> greedy evaluation on held-out tasks (new instances of the training templates); 8 held-out tasks
    instead of the demo's 16 to fit the timeout."""
    from components.core.policy.modeling import save_policy
    from components.tiny_model import build_tiny_model
    from components.core.data.parquet_store import TaskStore
    from components.distill import DistillConfig, distill
    from components.evaluate import evaluate
    from components.recipes import get_recipe
    from pipelines.config import PipelineConfig

    demo = PipelineConfig.preset_config("demo")
    recipe = get_recipe("swe", difficulty=demo.provision.difficulty, **demo.provision.recipe_options)
    TaskStore(tmp_path / "tasks").write(
        recipe.tasks("train", demo.provision.n_train, seed=0) + recipe.tasks("heldout", 8, seed=0)
    )
    connection = sandbox_service.connection()
    distill(
        DistillConfig(error_rate=demo.distill.error_rate, max_parallel=2, sandbox=connection, progress=False),
        tmp_path / "tasks",
        tmp_path / "trajs",
    )
    model_config = demo.model.tiny
    result = train_sft(
        demo.sft.model_copy(update={"mode": "resolved_only", "model": model_config}),
        tmp_path / "trajs",
        tmp_path / "sft",
    )
    tokenizer = build_tokenizer(model_config.tokenizer)
    save_policy(build_tiny_model(model_config, tokenizer), tokenizer, tmp_path / "untrained")
    eval_config = demo.evaluate.model_copy(update={"sandbox": connection})
    assert eval_config.temperature == 0.0  # greedy: the comparison is not sampling luck
    trained = evaluate(eval_config, tmp_path / "tasks", tmp_path / "sft", tmp_path / "eval-sft")
    untrained = evaluate(eval_config, tmp_path / "tasks", tmp_path / "untrained", tmp_path / "eval-untrained")
    print(
        f"held-out resolved rate: trained {trained.resolved_rate:.3f} vs untrained {untrained.resolved_rate:.3f} "
        f"(final SFT loss {result.final_loss:.3f})"
    )
    assert trained.infra_errors == 0 and untrained.infra_errors == 0
    assert trained.resolved_rate > untrained.resolved_rate


def test_t_interval_over_seeds():
    from components.sft.ablation import t_interval

    mean, lo, hi = t_interval([0.4, 0.5, 0.6])  # sd 0.1, n 3, t(0.975, 2 dof) = 4.303
    assert mean == pytest.approx(0.5)
    assert (lo, hi) == pytest.approx((0.5 - 4.303 * 0.1 / 3**0.5, 0.5 + 4.303 * 0.1 / 3**0.5))
    assert t_interval([0.0, 1.0])[1:] == (0.0, 1.0)  # clipped to probabilities
    single = t_interval([0.3])
    assert single[0] == 0.3 and single[1] != single[1]  # NaN: one seed has no interval


def test_lora_trains_adapters_only_and_saves_an_ordinary_merged_checkpoint(store, tmp_path):
    """`sft.lora`: peft adapters train, every base weight stays frozen, and the saved model is a plain
    checkpoint (no adapter keys) whose targeted linear layers moved and whose embeddings did not."""
    from components.core.policy.modeling import save_policy
    from components.tiny_model import build_tiny_model
    from components.sft.stage import LoraOptions

    trajectories_dir, _ = store
    tokenizer = build_tokenizer(TINY.tokenizer)
    save_policy(build_tiny_model(TINY, tokenizer), tokenizer, tmp_path / "base")
    before = load_policy(tmp_path / "base")[0].state_dict()
    config = SFTConfig(
        mode="credited",
        steps=8,
        batch_size=2,
        learning_rate=1e-2,
        warmup_steps=0,
        model=TINY,
        lora=LoraOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    result = train_sft(config, trajectories_dir, tmp_path / "lora", base_model_dir=tmp_path / "base")
    assert result.final_loss < result.first_loss
    merged, _ = load_policy(tmp_path / "lora")
    after = merged.state_dict()
    assert set(after) == set(before)  # merged: no lora_A / lora_B keys, loads like any checkpoint
    changed = {k for k in after if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
