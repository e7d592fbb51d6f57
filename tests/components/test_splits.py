"""A held-out set that is held out: no train seed can produce a held-out (or validation) task, or a task of
a held-out repository; no split holds a task twice; every recipe, by construction (components/core/data/splits.py)."""

from __future__ import annotations

import json

import pytest

from components.recipes import get_recipe
from pipelines.config import PipelineConfig


def _content(task) -> str:
    """What the issue calls the same task: the same repository files and issue text."""
    return json.dumps([task.environment.files, task.prompt], sort_keys=True)


def _repository(task) -> str:
    return json.dumps(task.environment.files, sort_keys=True)


def _preset_recipe(preset: str):
    config = PipelineConfig.preset_config(preset).provision
    return config, get_recipe(config.recipe, difficulty=config.difficulty, **config.recipe_options)


@pytest.mark.parametrize(("preset", "train_seeds"), [("demo", range(10)), ("smol", range(3))])
def test_no_train_seed_repeats_a_heldout_task_or_repository_and_the_set_repeats_nothing(preset, train_seeds):
    """Measured before: 2-3 of the demo's 16 held-out tasks and 21-24 of smol's 100 were exact copies of training
    tasks of seeds 0-2, and smol's held-out set held the same task twice."""
    config, recipe = _preset_recipe(preset)
    held = recipe.tasks("heldout", config.n_heldout, config.heldout_seed)
    assert len({_content(t) for t in held}) == len(held) == config.n_heldout
    for seed in train_seeds:
        train = recipe.tasks("train", config.n_train, seed)
        copies = {_content(t) for t in train} & {_content(t) for t in held}
        assert not copies, f"train seed {seed}: {len(copies)} held-out tasks are training tasks"
        assert not {_repository(t) for t in train} & {_repository(t) for t in held}, f"train seed {seed}"


@pytest.mark.parametrize("recipe_name", ["swe", "gui", "claw"])
def test_every_recipe_draws_each_split_from_its_own_share_of_units(recipe_name):
    """GUI and Claw drew held-out tasks from seeds 1_000_000 + i: train seed 100 gave exactly held-out seed 0's
    tasks. Now a task's unit decides its split, so no seed of one split reaches another's tasks."""
    from components.core.data.splits import split_of

    recipe = get_recipe(recipe_name)
    held, validation = recipe.tasks("heldout", 6, 0), recipe.tasks("validation", 6, 0)
    for seed in (0, 1, 100, 200):
        train = recipe.tasks("train", 6, seed)
        units = {t.unit for t in train}
        assert not units & {t.unit for t in held} and not units & {t.unit for t in validation}, seed
        contents = {json.dumps(recipe.task_content(t), sort_keys=True) for t in train}
        assert not contents & {json.dumps(recipe.task_content(t), sort_keys=True) for t in held + validation}, seed
    for task in held + validation + train:
        assert split_of(task.unit) == task.split, task.id
    assert recipe.tasks("heldout", 6, 0) == held  # still a pure function of (split, n, seed)


def test_a_suite_too_small_for_the_asked_split_fails_loudly_instead_of_repeating_tasks():
    from components.core.data.splits import SplitExhausted
    from components.recipes.swe.generator import generate_tasks

    with pytest.raises(SplitExhausted, match="only .* distinct heldout tasks"):
        generate_tasks("heldout", 20, 0, families=("off_by_one",), packages=("mathkit",))


def test_the_heldout_set_prefers_new_repositories_and_repeats_no_task_when_it_must_repeat_one():
    """Where a repository comes with several issue texts, the set takes a new repository while one is left: as
    many independent units as the suite holds (smol's 100 held-out tasks came from 80 repositories). Past the
    suite's held-out repositories (37 at the demo's settings) repositories repeat, tasks never do."""
    config, recipe = _preset_recipe("smol")
    held = recipe.tasks("heldout", config.n_heldout, config.heldout_seed)
    assert len({t.unit for t in held}) == len({_repository(t) for t in held}) == config.n_heldout
    config, recipe = _preset_recipe("demo")
    more = recipe.tasks("heldout", 42, config.heldout_seed)
    assert len({_content(t) for t in more}) == 42 and len({t.unit for t in more}) == 37


@pytest.mark.parametrize("recipe_name", ["swe", "claw"])
def test_heldout_families_are_a_provision_option_for_claims_about_generalisation(recipe_name, tmp_path):
    from components.core.data.parquet_store import TaskStore
    from components.provision import ProvisionConfig, ProvisionError, provision_environment

    held = {"swe": ["wrong_return"], "claw": ["calendar_answer"]}[recipe_name]
    config = ProvisionConfig(
        recipe=recipe_name,
        n_train=8,
        n_validation=4,
        n_heldout=4,
        heldout_families=held,
        difficulty=None if recipe_name == "claw" else 1,
        check_sandbox=False,
    )
    result = provision_environment(config, tmp_path / "tasks")
    tasks = TaskStore(tmp_path / "tasks").read()
    assert {t.family for t in tasks if t.split == "heldout"} == set(held)
    assert not {t.family for t in tasks if t.split != "heldout"} & set(held)  # validation tunes on trained families
    assert result.counts == {"train": 8, "validation": 4, "heldout": 4} == result.units
    assert result.validation_digest and result.heldout_digest != result.validation_digest
    with pytest.raises(ProvisionError, match="set twice"):
        provision_environment(
            config.model_copy(update={"recipe_options": {"heldout_families": held}}), tmp_path / "again"
        )
