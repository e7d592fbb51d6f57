"""Task checks in real sandboxes: the reference fix resolves a task and the unfixed repo does not."""

from __future__ import annotations

from components.core.recipe_base import RecipeBase, TaskCheck, VerifyResult
from components.core.schema import Task
from sandbox_service.client import SandboxClient


def verify_with_patch(recipe: RecipeBase, task: Task, client: SandboxClient, patch: str | None) -> VerifyResult:
    """Set the task up in a fresh sandbox, apply `patch` (if any) and run the recipe's verifier."""
    with client.create(recipe.sandbox_spec(task)) as sandbox:
        try:
            recipe.setup(sandbox, task)
            if patch:
                applied = sandbox.apply_patch(patch, cwd=task.environment.workdir)
                if not applied.applied:
                    return VerifyResult(resolved=False, reason=f"reference patch does not apply: {applied.stderr[-300:]}")
            return recipe.verify(sandbox.verifying(), task, patch)
        finally:
            recipe.release(sandbox)


def check_task(recipe: RecipeBase, task: Task, client: SandboxClient) -> TaskCheck:
    fixed = verify_with_patch(recipe, task, client, task.reference_solution)
    unfixed = verify_with_patch(recipe, task, client, None)
    for verdict in (fixed, unfixed):
        if verdict.infra_error:
            raise RuntimeError(f"{task.id}: verification could not run: {verdict.infra_error}")
    reason = None if fixed.resolved else f"reference: {fixed.reason}"
    if unfixed.resolved:
        reason = "the unfixed repository already passes the hidden tests"
    return TaskCheck(task_id=task.id, reference_resolves=fixed.resolved, unfixed_fails=not unfixed.resolved,
                     reason=reason)
