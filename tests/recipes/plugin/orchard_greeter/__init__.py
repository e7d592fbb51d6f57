"""A recipe that lives in its own package: write a greeting file, then submit (docs/guides/add-a-recipe.md).

Nothing in the project names it: its distribution's entry point (group `orchard.recipes`, in
`orchard_greeter-0.1.dist-info/entry_points.txt`) registers it, and every stage, config and wrapper finds it by name.
"""

from __future__ import annotations

import random
import re

from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.protocol import format_tool_call
from components.core.episode.recipe_base import RecipeBase, ToolResult, ToolSpec, VerifyResult
from components.core.data.schema import EnvironmentSpec, Split, Task, ToolCall, VerifierSpec
from components.core.data.splits import draw
from sandbox_service.client import Sandbox
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

FILE = "greeting.txt"
NAMES = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Niklaus"]
_SPLIT_BASE = {"train": 0, "validation": 1_000_000, "heldout": 2_000_000}


class GreeterRecipe(RecipeBase):
    name = "greeter"

    def __init__(self, difficulty: int | list[int] = 1, heldout_families: list[str] | tuple[str, ...] = ()):
        # provision passes every recipe its difficulty and held-out families; one level, one family here
        if difficulty not in (1, [1]) or heldout_families:
            raise ValueError("the greeter recipe has one difficulty (1) and one task family")

    @classmethod
    def scripted_teacher(cls, error_rate: float = 0.0, seed: int = 0) -> "GreeterTeacher":
        return GreeterTeacher(error_rate=error_rate, seed=seed)

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        def candidate(i: int, attempt: int) -> Task:
            task_seed = _SPLIT_BASE[split] + seed * 10_000 + i
            rng = random.Random(f"greeter:{task_seed}:{attempt}")
            who = f"{rng.choice(NAMES)} {rng.randrange(1000)}"
            return Task(
                id=f"greeter-{split}-{task_seed}-{attempt}",
                recipe=self.name,
                split=split,
                seed=task_seed,
                prompt=f"Write the file {FILE} holding exactly the line: Hello, {who}! Then submit.",
                environment=EnvironmentSpec(workdir="/workspace", network="none", memory_mb=256, cpu=0.5),
                verifier=VerifierSpec(kind="python", expected={"text": f"Hello, {who}!"}),
            )

        return draw(candidate, split, n, content=self.task_content)

    def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name="write_file",
                description="Write a text file in the working directory.",
                parameters={
                    "type": "object",
                    "required": ["path", "content"],
                    "properties": {
                        "path": {"type": "string", "maxLength": 64},
                        "content": {"type": "string", "maxLength": 1000},
                    },
                },
            ),
            ToolSpec(name="submit", description="End the episode."),
        ]

    def sandbox_spec(self, task: Task) -> SandboxCreate:
        return SandboxCreate(
            labels={"recipe": self.name, "task": task.id[:63]},
            workdir=task.environment.workdir,
            resources=Resources(cpu=task.environment.cpu, memory_mb=task.environment.memory_mb),
            network=NetworkPolicy(mode="none"),
        )

    def setup(self, sandbox: Sandbox, task: Task) -> None:
        pass  # the task starts from an empty working directory

    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        if call.name == "submit":
            return ToolResult(output="submitted", submitted=True)
        if call.name != "write_file":
            return ToolResult(output=f"unknown tool {call.name}", policy_error=f"unknown tool {call.name}")
        path = call.arguments["path"]
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", path) or path in (".", ".."):
            return ToolResult(output=f"bad path {path!r}", policy_error="a plain file name is required")
        sandbox.write_file(path, call.arguments["content"])
        return ToolResult(output=f"wrote {path}")

    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        result = sandbox.exec(["cat", FILE], timeout=10)
        if result.infra_error:  # no verdict: whose failure that is, `verify` decides
            return VerifyResult(resolved=False, infra_error=result.message or str(result.infra_error))
        written = result.stdout.strip() if result.exit_code == 0 else None
        resolved = written == task.verifier.expected["text"]
        return VerifyResult(resolved=resolved, reason=None if resolved else f"{FILE} holds {written!r}")


class GreeterTeacher:
    """The scripted expert: writes the greeting (with probability `error_rate` a wrong one), then submits."""

    def __init__(self, error_rate: float = 0.0, seed: int = 0):
        self.policy_id = f"greeter-teacher-e{error_rate:g}"
        self.error_rate, self.seed = error_rate, seed
        self._task: Task | None = None
        self._rng = random.Random(seed)

    def reset(self, task: Task) -> None:
        self._task = task
        self._rng = random.Random(f"{self.seed}:{task.id}")

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        assert self._task is not None, "the harness resets the teacher before an episode"
        wrote = any(m.role == "tool" and m.content.startswith("wrote ") for m in messages)
        if wrote:
            call = ToolCall(name="submit", arguments={})
        else:
            text = self._task.verifier.expected["text"]
            if self._rng.random() < self.error_rate:
                text = text.upper()
            call = ToolCall(name="write_file", arguments={"path": FILE, "content": text + "\n"})
        out = format_tool_call(call)
        return Generation(text=out, completion_tokens=len(out) // 4, finish_reason="stop")
