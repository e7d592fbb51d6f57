"""The Claw (personal-assistant) recipe: mail, calendar, contacts, notes and files on a sqlite
database inside the sandbox, reached through one of two harnesses over the same environment:

- `harness="tools"`: one function tool per API (`mail_search`, `calendar_create`, ...), as an
  OpenAI-style tool list; each call is one exec of `claw.py call NAME` with the arguments on stdin.
- `harness="shell"`: a single `bash` tool and the `./claw` CLI documented in the system prompt.

Setup, tasks and verifiers are identical in both, so a difference in results is the harness's.
The verifier rebuilds the state on the host from the tools' journal (rule in `verify.py`).
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.core.episode.recipe_base import RecipeBase, ToolResult, ToolSpec, VerifyResult
from components.core.data.schema import Split, Task, ToolCall
from components.recipes.claw.sandbox import claw as claw_api
from components.recipes.common import families_for_split
from components.recipes.claw.tasks import FAMILIES, content, families_at, generate_tasks
from components.core.data.schema import Verification
from components.recipes.claw.verify import NAME as VERIFIER_NAME
from components.recipes.claw.verify import VERSION as VERIFIER_VERSION
from components.recipes.claw.verify import ReplayError, replay_journal, state_divergence, verify_db
from sandbox_service.client import Sandbox
from sandbox_service.errors import FileNotFoundInSandboxError, InvalidRequestError, ValidationFailedError
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

CLAW_DIR = "/workspace/.claw"
CLAW_PY = f"{CLAW_DIR}/claw.py"
DB_PATH = f"{CLAW_DIR}/state.db"
JOURNAL_PATH = f"{CLAW_DIR}/journal.jsonl"  # claw.py's default: beside the database
MAX_OUTPUT = 4000
MAX_JOURNAL_BYTES = 8_000_000  # a longer journal is the policy's failure, never replayed

Harness = Literal["tools", "shell"]


class ClawOptions(BaseModel):
    """Recipe options (`get_recipe("claw", harness="shell")`)."""

    model_config = ConfigDict(extra="forbid")
    harness: Harness = Field("tools", description="tools: one function per API; shell: bash + the ./claw CLI.")
    families: tuple[str, ...] = Field(FAMILIES, description="Task families to generate (cycled in order).")
    difficulty: int | list[int] | None = Field(
        None, description="Keep only families at these difficulty level(s) (see tasks.DIFFICULTY); None = all."
    )
    heldout_families: tuple[str, ...] = Field(
        (),
        description="Families only the held-out split draws from (train and validation never do): what a "
        "claim about generalising to unseen kinds of task needs.",
    )
    command_timeout_seconds: float = Field(30.0, gt=0, description="Limit for one tool call's exec.")


ANSWER = ToolSpec(
    name="answer",
    description="Finish: report what you did; if the task asks a question, the text "
    "is only the answer (one value), not a list of candidates.",
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 10_000}},
        "required": ["text"],
    },
)
BASH = ToolSpec(
    name="bash",
    description="Run a shell command in /workspace (the ./claw CLI is there).",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "maxLength": 100_000}},
        "required": ["command"],
    },
)


def _schema(p: claw_api.Param) -> dict[str, Any]:
    """A parameter's JSON schema, with the bounds claw.py itself checks (one definition: its `Param`)."""
    if p.kind == "list":
        return {
            "type": "array",
            "items": {"type": "string", "maxLength": p.max_len},
            "maxItems": claw_api.MAX_ITEMS,
            "description": p.help,
        }
    if p.kind == "int":
        low, high = claw_api.INT_RANGE
        return {"type": "integer", "minimum": low, "maximum": high, "description": p.help}
    return {"type": "string", "maxLength": p.max_len, "description": p.help}


def api_tools() -> list[ToolSpec]:
    out = []
    for name, (_, doc, params) in claw_api.API.items():
        out.append(
            ToolSpec(
                name=name,
                description=doc,
                parameters={
                    "type": "object",
                    "properties": {p.name: _schema(p) for p in params},
                    "required": [p.name for p in params if p.required],
                },
            )
        )
    return out


def _clip(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n... (output truncated)"


class ClawRecipe(RecipeBase):
    name = "claw"

    @classmethod
    def scripted_teacher(cls, error_rate: float = 0.0, seed: int = 0):
        from components.recipes.claw.teacher import ScriptedTeacher

        return ScriptedTeacher(error_rate=error_rate, seed=seed)

    def __init__(self, **options: Any):
        self.options = ClawOptions(**options)

    @property
    def harness(self) -> Harness:
        return self.options.harness

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        pool = families_at(self.options.families, self.options.difficulty)
        return generate_tasks(split, n, seed, families_for_split(pool, self.options.heldout_families, split))

    def task_content(self, task: Task) -> dict:
        return content(task)

    def tools(self) -> list[ToolSpec]:
        return [BASH, ANSWER] if self.harness == "shell" else [*api_tools(), ANSWER]

    def system_prompt(self, task: Task) -> str:
        world = task.metadata.get("world", {})
        base = (
            f"You are the personal assistant of Sam Rivera <{world.get('owner', 'sam.rivera@orchard.test')}>. "
            f"Now is {world.get('now', '')}. Use the tools to read and change Sam's mail, calendar, contacts, "
            "notes and files, then call answer."
        )
        if self.harness == "shell":
            return base + "\nSam's data is reachable only through this CLI:\n" + claw_api.cli_usage()
        return base

    # -- environment -----------------------------------------------------------------------------
    def sandbox_spec(self, task: Task) -> SandboxCreate:
        return SandboxCreate(
            labels={"recipe": "claw", "task": task.id[:63], "harness": self.harness},
            resources=Resources(cpu=task.environment.cpu, memory_mb=task.environment.memory_mb),
            network=NetworkPolicy(mode="none"),
            workdir="/workspace",
        )

    def setup(self, sandbox: Sandbox, task: Task) -> None:
        world = task.metadata.get("world")
        if not world:
            raise ValueError(f"Claw task {task.id} has no metadata['world']; generate tasks with ClawRecipe.tasks()")
        sandbox.exec(["mkdir", "-p", CLAW_DIR])
        sandbox.write_file(CLAW_PY, resources.files("components.recipes.claw.sandbox").joinpath("claw.py").read_text())
        sandbox.write_file(f"{CLAW_DIR}/seed.json", json.dumps(world))
        sandbox.write_file("/workspace/claw", f'#!/bin/sh\nexec python -S {CLAW_PY} "$@"\n', mode=0o755)
        res = sandbox.exec(f"python -S {CLAW_PY} init {CLAW_DIR}/seed.json && rm {CLAW_DIR}/seed.json", timeout=60)
        if not res.ok:
            raise RuntimeError(
                f"Claw world did not load (exit {res.exit_code}): {res.stdout[-500:]} {res.stderr[-500:]}"
            )

    # -- tools -----------------------------------------------------------------------------------
    def health_calls(self, task: Task) -> list[ToolCall]:
        if self.harness == "shell":
            return [ToolCall(name="bash", arguments={"command": "./claw mail search --limit 1"})]
        return [
            ToolCall(name="mail_search", arguments={"limit": 1}),
            ToolCall(name="notes_create", arguments={"title": "health check", "body": "ok"}),
        ]

    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        args = call.arguments or {}
        if call.name == "answer":
            return ToolResult(output="Answer recorded.", submitted=True, final_answer=str(args.get("text", "")))
        try:
            return self._execute(sandbox, call, args)
        except (InvalidRequestError, ValidationFailedError) as err:  # the service refused the request (a NUL byte...)
            return ToolResult(output=f"Error: {err.message}", policy_error=err.message[:300])

    def _execute(self, sandbox: Sandbox, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        timeout = self.options.command_timeout_seconds
        if self.harness == "shell":
            if call.name != "bash" or not isinstance(args.get("command"), str):
                return ToolResult(
                    output='Error: use bash {"command": "..."} or answer {"text": "..."}.',
                    policy_error=f"unknown tool or bad arguments: {call.name}",
                )
            res = sandbox.exec(["bash", "-c", args["command"]], cwd="/workspace", timeout=timeout)
            if res.is_infra_error:
                return ToolResult(output=f"Error: the sandbox failed: {res.message}", infra_error=str(res.infra_error))
            tail = (
                "[timed out]"
                if res.outcome.value == "command_timeout"
                else "[killed: out of memory]"
                if res.reason == "oom"
                else f"[could not run: {res.message}]"
                if res.exit_code is None
                else f"[exit {res.exit_code}]"
            )
            return ToolResult(output=_clip(f"{res.stdout}{res.stderr}{tail}"))
        if call.name not in claw_api.API:
            return ToolResult(
                output=f"Error: unknown tool {call.name!r}; use one of {sorted(claw_api.API)} or answer.",
                policy_error=f"unknown tool {call.name!r}",
            )
        # The arguments go on stdin: one argv string is limited to 128 KiB, a JSON body is not.
        res = sandbox.exec(["python", "-S", CLAW_PY, "call", call.name], stdin=json.dumps(args), timeout=timeout)
        if res.is_infra_error:
            return ToolResult(output=f"Error: the sandbox failed: {res.message}", infra_error=str(res.infra_error))
        if res.exit_code == 2:
            return ToolResult(output=_clip(res.stdout), policy_error=res.stdout.strip()[:300])
        if res.reason == "oom":  # the policy's arguments ran the sandbox out of memory: its outcome
            return ToolResult(output="Error: the tool ran out of memory", policy_error="tool call ran out of memory")
        if res.exit_code != 0:  # claw.py failed (3: the database refused; else it crashed): the one rule decides
            why = res.stdout.strip() if res.exit_code == 3 else res.stderr or res.message or ""
            return ToolResult(
                output=f"Error: the tool failed: {why[-500:]}",
                infra_error=f"claw.py {call.name} exited {res.exit_code}: {why[-300:]}",
            )
        return ToolResult(output=_clip(res.stdout))

    # -- verification ----------------------------------------------------------------------------
    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        """The world rebuilt from the tools' journal, never the sandbox's state.db (see verify.py)."""
        record = Verification(verifier=VERIFIER_NAME, version=VERIFIER_VERSION)
        journal = _read_or_none(sandbox, JOURNAL_PATH)
        if journal is None:
            journal = b""  # no state-changing call was made (or the policy removed the record of them)
        sandbox_db = _read_or_none(sandbox, DB_PATH)
        if len(journal) > MAX_JOURNAL_BYTES:  # read whole by the file API, replayed only up to this size
            return VerifyResult(
                resolved=False,
                verification=record,
                reason=f"the tools' journal is {len(journal)} bytes (at most {MAX_JOURNAL_BYTES})",
            )
        with tempfile.TemporaryDirectory() as tmp:
            copy = None
            if sandbox_db is not None:
                copy = os.path.join(tmp, "sandbox-state.db")
                with open(copy, "wb") as f:
                    f.write(sandbox_db)
            verdict = _replay_and_judge(task, journal, copy, final_answer, record, tmp)
        verdict.verification = record
        return verdict


def _replay_and_judge(
    task: Task, journal: bytes, agent_db: str | None, final_answer: str | None, record: Verification, tmp: str
) -> VerifyResult:
    try:
        replayed = replay_journal(task.metadata["world"], journal, tmp, agent_db)
    except (ReplayError, OSError) as err:  # no verdict: whose failure, the one rule decides (RecipeBase.verify)
        return VerifyResult(resolved=False, infra_error=f"rebuilding the Claw state failed: {err}")
    record.ignored = replayed.rejected + state_divergence(replayed, agent_db is not None)
    return verify_db(replayed.db, task.verifier.expected, final_answer)


def _read_or_none(sandbox: Sandbox, path: str) -> bytes | None:
    """The file, or None when the policy removed it or put something unreadable there."""
    try:
        return sandbox.read_file(path)
    except (FileNotFoundInSandboxError, InvalidRequestError):
        return None
