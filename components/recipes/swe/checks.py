"""Task checks in real sandboxes: the reference fix resolves a task and the unfixed repo does not."""

from __future__ import annotations

from components.core.episode.recipe_base import RecipeBase, TaskCheck
from components.core.data.schema import Task
from components.recipes.common import verify_fresh as verify_with_patch
from sandbox_service.client import SandboxClient

__all__ = ["check_task", "verify_with_patch"]


def check_task(recipe: RecipeBase, task: Task, client: SandboxClient) -> TaskCheck:
    return TaskCheck.of(
        task,
        verify_with_patch(recipe, task, client, task.reference_solution),
        verify_with_patch(recipe, task, client, None),
        unchanged_note="the unfixed repository already passes the hidden tests",
    )
