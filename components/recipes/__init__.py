"""Task suites on the one environment layer, and the registry that names them.

Only tasks, tools and verifiers differ between recipes (`components/core/episode/recipe_base.py`). The registry is
the one source of recipe names: the config's `recipe` type (`RecipeName`), the CLI's choices and the OpenEnv / TRL
wrappers all derive from it. The built-in recipes are listed here; a recipe in another package registers itself
under the entry-point group `orchard.recipes` (name = "module:Class"), with no edit of this project
(docs/guides/add-a-recipe.md).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from typing import Annotated

from pydantic import AfterValidator

from components.core.episode.recipe_base import RecipeBase, TaskCheck, VerifyResult
from components.core.data.schema import Outcome, Task

ENTRY_POINT_GROUP = "orchard.recipes"

BUILT_IN = {
    "swe": "components.recipes.swe:SWERecipe",
    "gui": "components.recipes.gui:GUIRecipe",
    "claw": "components.recipes.claw:ClawRecipe",
}


class RecipeRegistryError(ValueError):
    """A recipe name nobody registered, two packages claiming one name, or an entry point that is not a recipe."""


@functools.cache
def _registry() -> dict[str, str]:
    """Recipe name -> "module:Class": the built-ins, then every installed `orchard.recipes` entry point."""
    found = dict(BUILT_IN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in found and found[entry.name] != entry.value:
            raise RecipeRegistryError(
                f"recipe {entry.name!r} is registered twice: {found[entry.name]} and {entry.value} (entry point "
                f"group {ENTRY_POINT_GROUP!r} of {entry.dist.name if entry.dist else 'an installed package'}); "
                "rename one of them"
            )
        found[entry.name] = entry.value
    return found


def refresh() -> None:
    """Read the entry points again (after installing a recipe package into the running interpreter)."""
    _registry.cache_clear()
    recipe_class.cache_clear()


def recipe_names() -> list[str]:
    """Every registered recipe name, sorted."""
    return sorted(_registry())


def _unknown(name: str) -> RecipeRegistryError:
    return RecipeRegistryError(
        f"unknown recipe {name!r}; registered: {', '.join(recipe_names())} (a recipe in another package registers "
        f"under the entry-point group {ENTRY_POINT_GROUP!r}: docs/guides/add-a-recipe.md)"
    )


@functools.cache
def recipe_class(name: str) -> type[RecipeBase]:
    """The class of recipe `name`; its module is imported on first use (GUI's browser, SWE's generator)."""
    target = _registry().get(name)
    if target is None:
        raise _unknown(name)
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise RecipeRegistryError(f"recipe {name!r} points at {target}, which cannot be loaded: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, RecipeBase)):
        raise RecipeRegistryError(f"recipe {name!r} points at {target}, which is not a RecipeBase subclass")
    if getattr(cls, "name", None) != name:
        raise RecipeRegistryError(
            f"recipe {name!r} points at {target}, whose `name` is {getattr(cls, 'name', None)!r}: "
            "the registered name and the class's name must agree (tasks carry it)"
        )
    return cls


def get_recipe(name: str, **options) -> RecipeBase:
    """Recipe `name` built with its options (`provision.recipe_options`)."""
    return recipe_class(name)(**options)


def get_scripted_teacher(name: str, error_rate: float, seed: int):
    """Recipe `name`'s scripted expert teacher (`RecipeBase.scripted_teacher`)."""
    return recipe_class(name).scripted_teacher(error_rate=error_rate, seed=seed)


def check_task(recipe: RecipeBase, client, task: Task) -> TaskCheck:
    """A task's gold check (`provision.validate_tasks`, the recipe contract test): the reference solution scores 1
    and the unchanged task 0. The recipe's own check (`RecipeBase.check_task`) when it has one; else its scripted
    teacher at error rate 0 is the reference solution, run by the harness in a fresh sandbox, and a second fresh
    sandbox is verified untouched."""
    own = recipe.check_task(client, task)
    if own is not None:
        return own
    from components.core.episode.harness import HarnessConfig, run_episode

    from components.recipes.common import verify_fresh

    solved = run_episode(
        task, recipe, type(recipe).scripted_teacher(error_rate=0.0, seed=0), client, HarnessConfig(max_steps=40)
    )
    reference = VerifyResult(
        resolved=solved.resolved,
        reason=solved.outcome_reason,
        infra_error=solved.outcome_reason if solved.outcome is Outcome.infra_error else None,
    )
    return TaskCheck.of(
        task,
        reference,
        verify_fresh(recipe, task, client),
        unchanged_note="the unchanged task already passes its verifier",
    )


def _known(name: str) -> str:
    if name not in _registry():
        raise _unknown(name)
    return name


# The config type of a recipe name: any registered recipe, checked when the config is validated.
RecipeName = Annotated[str, AfterValidator(_known)]
