"""One config: PipelineConfig embeds each stage's own config; presets, --set, files and `config show`."""

from __future__ import annotations

import json

import pytest

from components.core.policy.modeling import InitPolicyConfig, ModelConfig
from components.rl.config import RLConfig
from components.sft.stage import SFTConfig
from pipelines.cli import main
from pipelines.config import PRESETS, ConfigError, PipelineConfig, resolve, stage_sections
from pipelines.stages import STAGES


def test_stage_sections_are_the_stage_configs_themselves():
    config = PipelineConfig.preset_config("demo")
    assert type(config.sft) is SFTConfig and type(config.rl) is RLConfig and type(config.model) is InitPolicyConfig
    assert type(config.model.tiny) is ModelConfig
    assert {s.config for s in STAGES} <= set(stage_sections())
    # every field of a stage's own config is a pipeline setting, under its own name (nothing copied)
    assert set(PipelineConfig.model_fields["sft"].annotation.model_fields) == set(SFTConfig.model_fields)


def test_every_field_of_every_stage_config_is_a_pipeline_setting_under_its_own_name():
    """Embedding, not copying: whatever a stage config has (e.g. model.path from the model work) is settable."""
    base = PipelineConfig.preset_config("tiny")
    checked = 0
    for section in stage_sections():
        stage = getattr(base, section)
        for field in type(stage).model_fields:
            if (
                field in ("recipe", "seed", "sandbox", "load")
                or (field == "model" and section != "model")
                or (section, field) == ("provision", "data_store")
            ):
                continue  # run-wide: set at the top level (test below) or as retrain.data_store
            value = getattr(stage, field)
            raw = value.model_dump_json() if hasattr(value, "model_dump_json") else json.dumps(value)
            assert getattr(resolve("tiny", [f"{section}.{field}={raw}"]), section) == stage, (section, field)
            checked += 1
    assert checked > 60


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_round_trips_through_json_and_the_cli(preset, capsys, tmp_path):
    config = resolve(preset, ["sft.steps=7", "rl.rollout.group_size=2", "rl.rollout.stride=1", "recipe=gui", "seed=3"])
    assert PipelineConfig.model_validate_json(config.model_dump_json()) == config
    assert (
        main(
            [
                "config",
                "show",
                "--preset",
                preset,
                "--set",
                "sft.steps=7",
                "--set",
                "rl.rollout.group_size=2",
                "--set",
                "rl.rollout.stride=1",
                "--set",
                "recipe=gui",
                "--set",
                "seed=3",
            ]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert PipelineConfig.model_validate(shown) == config
    path = tmp_path / "run.yaml"
    path.write_text("sft:\n  steps: 7\nrl.rollout.group_size: 2\nrl.rollout.stride: 1\nrecipe: gui\nseed: 3\n")
    assert resolve(preset, config_file=path) == config


def test_presets_override_nested_fields_and_keep_the_rest():
    tiny, demo = PipelineConfig.preset_config("tiny"), PipelineConfig.preset_config("demo")
    assert tiny.rl.rollout.max_rollouts_per_prompt == 2 and demo.rl.rollout.max_rollouts_per_prompt == 4
    assert tiny.rl.rollout.rho_min == demo.rl.rollout.rho_min == RLConfig().rollout.rho_min  # untouched default
    assert tiny.sft.steps == 4 and resolve("tiny", ["sft.steps=400"]).sft.steps == 400
    assert resolve("tiny", ["sft.steps=400"]).sft.batch_size == tiny.sft.batch_size


def test_run_wide_fields_reach_every_stage_and_the_token_never_enters_the_config(monkeypatch):
    monkeypatch.setenv("ORCHARD_SANDBOX_TOKEN", "s3cret")
    config = resolve("tiny", ["recipe=claw", "seed=5", "sandbox_url=http://sandbox:1"])
    for name in ("provision", "distill", "credit", "rl", "evaluate", "evaluate_teacher"):
        assert getattr(config, name).recipe == "claw", name
    for name in ("provision", "distill", "sft", "rl", "evaluate"):
        assert getattr(config, name).seed == 5, name
    assert config.model.tiny.seed == 5 and config.sft.model == config.model.tiny
    assert config.distill.sandbox.url == "http://sandbox:1"
    assert "s3cret" not in config.model_dump_json()


def test_a_checkpoint_and_its_load_options_are_run_wide_settings(tmp_path):
    config = resolve(
        "tiny", [f"model.path={tmp_path}", "model.device=cpu", "model.dtype=bfloat16", "model.attn_implementation=sdpa"]
    )
    assert config.model.path == str(tmp_path)
    for name in ("sft", "rl", "evaluate", "evaluate_teacher"):  # every stage that loads a model loads it the same way
        load = getattr(config, name).load
        assert (load.device, load.dtype, load.attn_implementation) == ("cpu", "bfloat16", "sdpa"), name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "huge"], "unknown preset 'huge'; choose one of demo, quick, smol, tiny"),
        (["--set", "sft.stepz=4"], "sft.stepz: Extra inputs are not permitted"),
        (["--set", "sft.steps=-1"], "sft.steps: Input should be greater than or equal to 1"),
        (["--set", "recipe=chess"], "recipe: unknown recipe 'chess'; registered: claw, gui, swe"),
        (["--set", "sft.steps"], "--set expects KEY=VALUE"),
        (["--set", "distill.recipe=gui"], "recipe is one value for the whole run"),
        (["--config", "/nonexistent/run.yaml"], "config file /nonexistent/run.yaml does not exist"),
    ],
)
def test_a_bad_setting_is_one_clear_line(argv, message, capsys):
    assert main(["config", "show", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_run_refuses_a_bad_setting_before_doing_anything(capsys, tmp_path):
    assert main(["run", "--preset", "tiny", "--runs-dir", str(tmp_path), "--set", "rl.steps=0"]) == 2
    assert "rl.steps" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing is started for a config that does not validate"


def test_retraining_parameters_reach_the_config(tmp_path):
    """The schedule's parameters (strings from Argo) become retrain/promote/provision settings."""
    from pipelines.steps import start_pipeline

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config, _ = start_pipeline(
        preset="tiny",
        recipe="swe",
        seed=0,
        sandbox_url="",
        mlflow_uri=uri,
        experiment="e",
        start_from="champion",
        promotion_margin="0.05",
        train_tasks="7",
        data_store=str(tmp_path / "store"),
        window_runs="3",
    )
    assert (config.retrain.start_from, config.promote.margin, config.provision.n_train) == ("champion", 0.05, 7)
    assert (config.retrain.data_store, config.retrain.window_runs) == (str(tmp_path / "store"), 3)
    assert config.provision.data_store == str(tmp_path / "store"), "provision draws its new tasks from the store"
    default, _ = start_pipeline(
        preset="tiny",
        recipe="swe",
        seed=0,
        sandbox_url="",
        mlflow_uri=uri,
        experiment="e",
        start_from="base",
        promotion_margin="",
        train_tasks="0",
        data_store="",
        window_runs="0",
    )  # Argo's unset optional: ''
    assert (default.retrain.start_from, default.promote.margin, default.provision.n_train) == ("base", 0.0, 4)
    # a margin is a margin: a negative one is refused, not read as "use the config's" (the former -1.0 sentinel)
    with pytest.raises(ConfigError, match="promote.margin"):
        start_pipeline(
            preset="tiny", recipe="swe", seed=0, sandbox_url="", mlflow_uri=uri, experiment="e", promotion_margin=-1.0
        )
    assert (default.retrain.data_store, default.retrain.window_runs, default.provision.data_store) == (None, None, None)


def test_run_retrain_flag_starts_from_the_champion_unless_set_says_otherwise(tmp_path):
    import argparse

    from pipelines.cli import _config

    args = argparse.Namespace(preset="tiny", set=None, config=None, retrain=True, runs_dir=str(tmp_path))
    assert _config(args).retrain.start_from == "champion"
    assert _config(args).retrain.data_store == str(tmp_path / "data-store"), "--retrain grows the runs' data store"
    args.set = ["retrain.start_from=base", "retrain.data_store=null"]
    assert (_config(args).retrain.start_from, _config(args).retrain.data_store) == ("base", None)
    with pytest.raises(ConfigError, match="set retrain.data_store"):
        resolve("tiny", ["provision.data_store=/elsewhere"])
    plain = _config(argparse.Namespace(preset="tiny", set=None, config=None)).retrain
    assert (plain.start_from, plain.data_store) == ("base", None)


def test_the_smol_preset_has_an_evaluation_with_power_and_an_rl_budget_that_can_win():
    from components.provision import heldout_digest, recipe_options, split_tasks
    from components.recipes import get_recipe

    digests = set()
    for seed in (0, 1, 2):
        config = PipelineConfig.preset_config("smol", seed=seed)
        assert config.model.path == "smollm2-135m-instruct"
        assert config.provision.n_heldout >= 100 and config.evaluate.k >= 4
        assert config.evaluate.temperature == config.rl.temperature > 0  # k samples at the training temperature
        assert config.rl.rollout_budget >= 1000 and config.rl.rollout.batch_prompts >= 8
        assert config.rl.rollout.early_stop and config.rl.rollout.history  # never-solved prompts are abandoned
        recipe = get_recipe("swe", **recipe_options(config.provision))
        splits, _ = split_tasks(config.provision, recipe)
        digests.add(heldout_digest(splits["heldout"]))
        assert not {t.unit for t in splits["train"]} & {t.unit for t in splits["heldout"]}
        assert len({t.unit for t in splits["heldout"]}) == config.provision.n_heldout  # independent repositories
    assert len(digests) == 1  # the same held-out set for every seed


@pytest.mark.parametrize("preset", ["tiny", "demo"])
def test_every_seed_of_a_preset_is_evaluated_on_the_same_heldout_set(preset):
    """Cross-seed rates compare the same tests (the digests once differed between seeds)."""
    from components.provision import heldout_digest, recipe_options, split_tasks
    from components.recipes import get_recipe

    digests, trains = set(), set()
    for seed in (0, 1):
        config = PipelineConfig.preset_config(preset, seed=seed)
        recipe = get_recipe(config.provision.recipe, **recipe_options(config.provision))
        splits, _ = split_tasks(config.provision, recipe)
        digests.add((heldout_digest(splits["heldout"]), heldout_digest(splits["validation"])))
        trains.add(tuple(t.id for t in splits["train"]))
    assert len(digests) == 1 and len(trains) == 2  # training data follows the seed, the test sets do not


def test_a_presets_recipe_options_stay_with_its_recipe():
    """The tiny/demo presets' SWE options (bug families, package names) are not handed to another recipe:
    `--preset tiny --set recipe=claw`, as the docs write it, failed with 'Extra inputs ... packages'."""
    claw = resolve("tiny", ["recipe=claw"])
    assert claw.provision.recipe_options == {} and claw.recipe == "claw"
    assert resolve("tiny").provision.recipe_options["packages"] == ["mathkit", "listutil"]  # the preset untouched
    chosen = resolve("tiny", ["recipe=claw", 'provision.recipe_options={"harness": "shell"}'])
    assert chosen.provision.recipe_options == {"harness": "shell"}  # the user's own options are kept


def test_the_docs_table_says_exactly_what_each_preset_samples():
    """docs/concepts/stages.md lists every `rl.rollout` field in which some preset departs from the sampler's
    default, plus the ones that decide a group, with each preset's value: a preset change that the table does
    not follow fails here (the smol guide once described refill as used while every preset had it off)."""
    import re
    from pathlib import Path

    from components.rl.sampling import RolloutConfig

    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "stages.md").read_text()
    table = page.split("<!-- rl-rollout-presets -->")[1].split("<!-- /rl-rollout-presets -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]
    header, rows = rows[0], rows[2:]
    presets = header[1:]
    assert sorted(presets) == sorted(PRESETS)
    listed = {re.fullmatch(r"`(\w+)`", row[0]).group(1): dict(zip(presets, row[1:])) for row in rows}
    default = RolloutConfig()
    for name in presets:
        rollout = PipelineConfig.preset_config(name).rl.rollout
        for field, values in listed.items():
            assert values[name] == json.dumps(getattr(rollout, field)).strip('"'), (name, field)
        departed = {f for f in RolloutConfig.model_fields if getattr(rollout, f) != getattr(default, f)}
        assert departed <= set(listed), f"{name}: rl.rollout {sorted(departed - set(listed))} not in the docs table"
