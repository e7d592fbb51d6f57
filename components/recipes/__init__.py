"""Task suites on the one environment layer. Only tasks, tools and verifiers differ between recipes."""

from __future__ import annotations

import importlib

from components.core.recipe_base import RecipeBase

_RECIPES = {
    "swe": "components.recipes.swe:SWERecipe",
    "gui": "components.recipes.gui:GUIRecipe",
    "claw": "components.recipes.claw:ClawRecipe",
}


def get_recipe(name: str, **kwargs) -> RecipeBase:
    """The recipe called `name` (swe, gui, claw); heavy modules are imported on first use."""
    try:
        target = _RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(_RECIPES)}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


def get_scripted_teacher(name: str, error_rate: float, seed: int):
    """The recipe's scripted expert teacher (`components.recipes.<name>.teacher.ScriptedTeacher`)."""
    if name not in _RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(_RECIPES)}")
    try:
        teacher_cls = importlib.import_module(f"components.recipes.{name}.teacher").ScriptedTeacher
    except (ImportError, AttributeError) as err:
        raise ValueError(f"recipe {name!r} has no scripted teacher "
                         f"(components.recipes.{name}.teacher.ScriptedTeacher): {err}") from None
    return teacher_cls(error_rate=error_rate, seed=seed)
