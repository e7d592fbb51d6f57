"""Claw (personal-assistant) recipe: mail, calendar, contacts, notes and files on sqlite, two harnesses."""

from components.recipes.claw.recipe import ClawOptions, ClawRecipe

__all__ = ["ClawOptions", "ClawRecipe"]
