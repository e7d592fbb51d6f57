"""GUI (browser) recipe: generated local websites and a headless Chromium inside the sandbox."""

from components.recipes.gui.recipe import GUIOptions, GUIRecipe

__all__ = ["GUIOptions", "GUIRecipe"]
