"""The recipe contract: what changes between SWE, GUI and Claw. The sandbox service, harness loop,
stages and pipeline stay the same; a recipe supplies tasks, tools, environment setup and a verifier.
"""

from __future__ import annotations

import abc
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.episode import blame as step_blame
from components.core.data.schema import Split, Task, ToolCall
from components.core.episode.results import ToolResult, VerifyResult
from sandbox_service.client import Sandbox
from sandbox_service.models import SandboxCreate


class ToolSpec(BaseModel):
    """An OpenAI-style function tool offered to the policy."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump()}

    def argument_error(self, arguments: Any) -> str | None:
        """Why `arguments` do not fit this tool's JSON schema (None when they do). The subset our tools
        use: object/string/integer/number/boolean/array types, `properties`, `required`, `items`,
        `enum`, and the bounds `maxLength` (characters), `maxItems`, `minimum`, `maximum`; integers must
        fit in 64 bits. Iterative and bounded, so no argument can crash the check."""
        return schema_error(self.parameters, arguments, self.name)


_JSON_TYPES = {
    "object": (dict,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "null": (type(None),),
}


def schema_error(schema: dict[str, Any], value: Any, where: str = "arguments", max_nodes: int = 10_000) -> str | None:
    """The first way `value` breaks `schema` (a JSON-schema subset, see `ToolSpec.argument_error`), or None."""
    stack = [(schema, value, where)]
    while stack:
        max_nodes -= 1
        if max_nodes < 0:
            return f"{where}: too many values"
        sch, val, path = stack.pop()
        kind = sch.get("type")
        if kind is not None:
            ok = type(val) in _JSON_TYPES.get(kind, (object,)) or (kind == "number" and type(val) is int)
            if kind in ("integer", "number") and type(val) is bool:
                ok = False
            if not ok:
                return f"{path} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {type(val).__name__}"
            if kind == "integer" and not -(1 << 63) <= val < (1 << 63):
                return f"{path} must be a 64-bit integer"
        if "enum" in sch and val not in sch["enum"]:
            return f"{path} must be one of {sch['enum']}"
        bound = _bound_error(sch, val, path)
        if bound:
            return bound
        if isinstance(val, dict):
            missing = [k for k in sch.get("required", []) if k not in val]
            if missing:
                return f"{path} needs {missing}"
            props = sch.get("properties", {})
            stack += [(props[k], v, f"{path}.{k}") for k, v in val.items() if k in props]
        elif isinstance(val, list) and "items" in sch:
            stack += [(sch["items"], v, f"{path}[{i}]") for i, v in enumerate(val)]
    return None


def _bound_error(sch: dict[str, Any], val: Any, path: str) -> str | None:
    """The `maxLength` / `maxItems` / `minimum` / `maximum` bound `val` breaks, if any."""
    if type(val) is str and len(val) > sch.get("maxLength", len(val)):
        return f"{path} must be at most {sch['maxLength']} characters (got {len(val)})"
    if type(val) is list and len(val) > sch.get("maxItems", len(val)):
        return f"{path} must have at most {sch['maxItems']} items (got {len(val)})"
    if type(val) in (int, float):
        if val < sch.get("minimum", val) or val > sch.get("maximum", val):
            return f"{path} must be between {sch.get('minimum', '-inf')} and {sch.get('maximum', 'inf')} (got {val})"
    return None


class TaskCheck(BaseModel):
    """A task's gold check in real sandboxes: its reference solution resolves it and the unchanged task does not
    (a task that fails either teaches nothing, or rewards doing nothing)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str
    reference_resolves: bool = Field(description="The verifier passes once the reference solution is applied.")
    unfixed_fails: bool = Field(description="The verifier fails on the task as given.")
    reason: str | None = Field(None, description="Why a check failed.")

    @property
    def ok(self) -> bool:
        return self.reference_resolves and self.unfixed_fails

    @classmethod
    def of(cls, task: Task, reference: VerifyResult, unchanged: VerifyResult, *, unchanged_note: str) -> TaskCheck:
        """The check from the reference solution's verdict and the unchanged task's; a verdict that could not be
        given is the infrastructure's (RuntimeError), never a failed check. `unchanged_note` says what passing
        unchanged means for the recipe."""
        for verdict in (reference, unchanged):
            if verdict.infra_error:
                raise RuntimeError(f"{task.id}: verification could not run: {verdict.infra_error}")
        reason = None if reference.resolved else f"reference: {reference.reason}"
        if unchanged.resolved:
            reason = unchanged_note
        return cls(
            task_id=task.id, reference_resolves=reference.resolved, unfixed_fails=not unchanged.resolved, reason=reason
        )


class TaskImportError(ValueError):
    """A task file a recipe cannot import (a missing field, an absent checkout, a format it does not read)."""


class RecipeBase(abc.ABC):
    """A task suite. A subclass is registered by name in `components/recipes` (built in, or through the
    `orchard.recipes` entry-point group from another package: docs/guides/add-a-recipe.md). Its constructor takes
    the recipe's options as keywords (`provision.recipe_options`, plus `difficulty` and `heldout_families`)."""

    name: str

    @classmethod
    def scripted_teacher(cls, error_rate: float = 0.0, seed: int = 0) -> Any:
        """The recipe's scripted expert (a `Policy` that solves its tasks, making a recoverable mistake per
        decision with probability `error_rate`): the demo's teacher, the reference row and the default gold
        check. A recipe without one can still distill from an endpoint teacher (`distill.teacher=openai`)."""
        raise NotImplementedError(
            f"recipe {cls.name!r} has no scripted teacher: use an endpoint teacher "
            "(distill.teacher=openai, evaluate_teacher.policy=openai)"
        )

    def import_tasks(self, kind: str, path: str, repos_dir: str | None = None) -> list[Task]:
        """Tasks from a file of format `kind` (`provision.source`), all in split "heldout" until provision
        splits them. Raises TaskImportError naming what is wrong (default: the recipe imports no files)."""
        raise TaskImportError(
            f"recipe {self.name!r} imports no task files (source.kind={kind!r}); generate its "
            "tasks instead (provision.source.kind=generator)"
        )

    def check_task(self, client: Any, task: Task) -> TaskCheck | None:
        """The recipe's own gold check, when it has one cheaper than an episode (SWE: apply the task's patch, verify;
        verify the repository as given): its reference solution resolves the task, the unchanged task does not.
        None (the default): the generic check, with the scripted teacher at error rate 0 as the reference
        (`components.recipes.check_task`, which callers use)."""
        return None

    @abc.abstractmethod
    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        """Deterministic task generation from a seed, through `components.core.data.splits.draw`: the splits share
        no unit and no split holds the same content twice, whatever the seeds."""

    def task_content(self, task: Task) -> Any:
        """What the agent is given (two tasks with equal content are the same task to a policy): the prompt and
        the environment (for SWE the repository's files and the issue text). Recipes whose world lives
        elsewhere (a GUI site, a Claw world in `metadata`) add it."""
        from components.core.data.splits import task_content

        return task_content(task)

    @abc.abstractmethod
    def tools(self) -> list[ToolSpec]:
        """Tools offered to the policy."""

    @abc.abstractmethod
    def sandbox_spec(self, task: Task) -> SandboxCreate:
        """Resources, network and image of the task's sandbox."""

    @abc.abstractmethod
    def setup(self, sandbox: Sandbox, task: Task) -> None:
        """Place the task's files and start its services inside the sandbox (no hidden files)."""

    def resume(self, sandbox: Sandbox, task: Task) -> None:
        """`sandbox` was forked from a snapshot of this task's sandbox (right after `setup`, or after any later
        step of an episode: a prefix fork): it holds the files but none of the processes setup started. Start
        them again (the default: nothing, for recipes whose state is files)."""

    @abc.abstractmethod
    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        """Run one tool call in the sandbox."""

    @abc.abstractmethod
    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        """The recipe's own verdict on the final state (hidden tests / site state / assistant state). When it
        cannot give one it returns `infra_error` (or raises): whose failure that is, `verify` decides."""

    def verify(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        """The verdict every caller uses (the harness, served environments, task checks, benchmarks): `judge`,
        with a failure to give a verdict attributed by the one rule (`core/episode/blame.py`), so the same state
        gets the same verdict wherever it is verified. `infra_error` only when the infrastructure failed."""
        return step_blame.verdict(self, sandbox, task, final_answer)

    def health_calls(self, task: Task) -> list[ToolCall]:
        """Tool calls with arguments the harness chose (never a policy's) that must work in a fresh sandbox of
        the task just set up: the health check that decides whether a failed tool call is the
        infrastructure's (`core/episode/blame.py`). Default: none (creating, setting up and running a command in
        the fresh sandbox is the check)."""
        return []

    def system_prompt(self, task: Task) -> str:
        return "You are an agent acting in a sandbox through tools."

    def reference_calls(self, task: Task) -> list[ToolCall]:
        """The tool calls of a clean solution of a training task, without running it (the local tokenizer's
        corpus learns how tool calls are written from them); [] when the recipe cannot say."""
        return []

    def release(self, sandbox: Sandbox) -> None:
        """The episode on `sandbox` is over (verified or aborted): free what `setup` kept for it."""
