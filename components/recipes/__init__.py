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
