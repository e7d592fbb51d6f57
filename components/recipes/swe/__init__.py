"""The SWE recipe: generated bug-fix repositories (and SWE-bench imports), tools, verifier, teacher."""

from components.recipes.swe.recipe import SWERecipe

__all__ = ["SWERecipe"]
