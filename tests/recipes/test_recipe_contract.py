"""The recipe contract, for every registered recipe: provision draws its splits, the gold check holds (the reference
solution resolves a task, the unchanged task does not), the scripted teacher's episode is verified resolved; and a
recipe from another package (tests/recipes/plugin, registered only by its entry point) is found everywhere a recipe
name is used, with no edit of the project."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import recipes
from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.parquet_store import TaskStore
from components.provision import ProvisionConfig, ProvisionError, provision_environment

PLUGIN_DIR = Path(__file__).parent / "plugin"


@pytest.fixture
def plugin_installed(monkeypatch):
    """The test package on the path as an installed distribution (its .dist-info holds the entry point)."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    recipes.refresh()
    yield
    monkeypatch.undo()
    recipes.refresh()


def _registered_with_plugin() -> list[str]:
    import sys

    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        recipes.refresh()
        return recipes.recipe_names()
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        recipes.refresh()


def test_the_registry_lists_the_built_ins_and_nothing_else_by_default():
    assert recipes.recipe_names() == ["claw", "gui", "swe"]
    with pytest.raises(recipes.RecipeRegistryError, match="unknown recipe 'greeter'.*orchard.recipes"):
        recipes.get_recipe("greeter")


def test_a_recipe_from_another_package_is_registered_by_its_entry_point(plugin_installed, capsys):
    assert "greeter" in recipes.recipe_names()
    assert recipes.get_recipe("greeter").name == "greeter"
    # the config's type, the environment CLI's choices and the TRL wrappers all derive from the registry
    from pipelines.config import resolve

    config = resolve("tiny", ["recipe=greeter"])
    assert (config.provision.recipe, config.rl.recipe, config.evaluate.recipe) == ("greeter",) * 3
    assert config.model.tiny.tokenizer.corpus_recipes == ["greeter"]  # its tokenizer learns its own tasks
    from components.envs import cli

    with pytest.raises(SystemExit):  # argparse's choices come from the registry
        cli.main(["serve", "--recipe", "nope"])
    assert "choose from claw, greeter, gui, swe" in capsys.readouterr().err.replace("'", "")


def test_an_unknown_recipe_is_refused_with_the_registered_names():
    from pipelines.config import ConfigError, resolve

    with pytest.raises(ConfigError, match="unknown recipe 'chess'; registered: claw, gui, swe"):
        resolve("tiny", ["recipe=chess"])


def test_two_packages_claiming_one_name_are_refused(tmp_path, monkeypatch):
    dist = tmp_path / "other_swe-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: other-swe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchard.recipes]\nswe = other_swe:Recipe\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recipes.refresh()
    try:
        with pytest.raises(recipes.RecipeRegistryError, match="registered twice"):
            recipes.recipe_names()
    finally:
        monkeypatch.undo()
        recipes.refresh()


def test_a_recipe_without_file_import_says_so(plugin_installed, tmp_path):
    config = ProvisionConfig(
        recipe="greeter",
        n_train=1,
        n_heldout=1,
        n_validation=0,
        check_sandbox=False,
        source={"kind": "swebench", "path": str(tmp_path / "x.jsonl"), "repos_dir": str(tmp_path)},
    )
    with pytest.raises(ProvisionError, match="recipe 'greeter' imports no task files"):
        provision_environment(config, tmp_path / "tasks")


@pytest.mark.parametrize("name", _registered_with_plugin())
def test_every_registered_recipe_keeps_the_contract(name, plugin_installed, sandbox_service, tmp_path):
    """provision (with the gold check on a training task) -> an episode of the recipe's scripted teacher -> verify."""
    config = ProvisionConfig(
        recipe=name,
        n_train=2,
        n_heldout=1,
        n_validation=1,
        check_sandbox=False,
        validate_tasks=1,
        sandbox=sandbox_service.connection(),
    )
    result = provision_environment(config, tmp_path / "tasks")
    assert result.counts == {"train": 2, "validation": 1, "heldout": 1}
    assert result.metrics["tasks_validated"] == 1.0  # the gold check passed (provision raises otherwise)

    recipe = recipes.get_recipe(name)
    task = TaskStore(tmp_path / "tasks").read(split="train")[1]
    assert task.recipe == name
    with sandbox_service.client() as client:
        check = recipes.check_task(recipe, client, task)
        assert check.ok, check.reason
        episode = run_episode(
            task,
            recipe,
            recipes.get_scripted_teacher(name, error_rate=0.0, seed=0),
            client,
            HarnessConfig(max_steps=40),
        )
    assert episode.resolved, episode.outcome_reason


def test_the_gold_check_fails_a_task_that_passes_unchanged_or_that_its_reference_cannot_solve(
    plugin_installed, sandbox_service
):
    from components.core.episode.recipe_base import VerifyResult

    greeter = recipes.recipe_class("greeter")

    class PassesAnything(greeter):
        def judge(self, sandbox, task, final_answer):
            return VerifyResult(resolved=True)

    class PassesNothing(greeter):
        def judge(self, sandbox, task, final_answer):
            return VerifyResult(resolved=False, reason="never")

    task = greeter().tasks("train", 1)[0]
    with sandbox_service.client() as client:
        lax = recipes.check_task(PassesAnything(), client, task)
        strict = recipes.check_task(PassesNothing(), client, task)
    assert (lax.ok, lax.unfixed_fails, lax.reason) == (False, False, "the unchanged task already passes its verifier")
    assert (strict.ok, strict.reference_resolves) == (False, False) and strict.reason.startswith("reference:")


def test_a_name_registered_anew_gets_its_new_recipes_environment(tmp_path, monkeypatch):
    """`recipes.refresh()` reaches the TRL environments: they are kept per recipe class, not per name."""
    import sys

    from components.envs.trl_env import environment_class

    package = tmp_path / "greeter_two"
    package.mkdir()
    (package / "__init__.py").write_text(  # imports the first package from sys.modules (loaded below)
        "from orchard_greeter import GreeterRecipe, ToolSpec\n\n\n"
        "class GreeterTwo(GreeterRecipe):\n"
        "    def tools(self):\n"
        "        return [*super().tools(), ToolSpec(name='wave', description='Wave.')]\n"
    )
    dist = tmp_path / "greeter_two-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: greeter-two\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchard.recipes]\ngreeter = greeter_two:GreeterTwo\n")
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        recipes.refresh()
        assert not hasattr(environment_class("greeter"), "wave")
        sys.path.remove(str(PLUGIN_DIR))  # the first package is uninstalled, the second registers the name
        sys.path.insert(0, str(tmp_path))
        recipes.refresh()
        assert hasattr(environment_class("greeter"), "wave")
    finally:
        for entry in (str(PLUGIN_DIR), str(tmp_path)):
            while entry in sys.path:
                sys.path.remove(entry)
        sys.modules.pop("greeter_two", None)
        recipes.refresh()
