"""One episode of a recipe, driven from outside: the core every trainer-facing adapter wraps.

`RecipeSession.reset()` creates the task's sandbox (or forks a snapshot of an earlier setup of the same
task), `step(tool, arguments)` runs one tool call, and the episode ends when the policy submits or the
step limit is reached; the recipe's own verifier (`RecipeBase.verify`, its public interface) then gives the
reward. The OpenEnv server (`openenv_env.py`) and the TRL environment class (`trl_env.py`) are thin
wrappers around this, so the three agree on rewards and failures.

Failure attribution is the harness's one rule (components/core/episode/blame.py), applied here to every
tool call and (through `RecipeBase.verify`) to the verification: bad arguments, an unknown tool, or a
tool that fails on what the policy asked or left are the policy's error (an observation; the episode
goes on); only a sandbox the service reports lost or a health check that fails in a fresh sandbox is
infrastructure: the episode ends with `outcome="infra_error"`, `reward=None` and the reason.
"""

from __future__ import annotations

import base64
import logging
import random
import threading
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.connection import SandboxConnection
from components.core.rendering.protocol import tools_prompt
from components.core.episode.recipe_base import RecipeBase, ToolResult
from components.core.data.schema import Split, Task, ToolCall
from components.core.episode.blame import FreshSandbox, InfrastructureFailure, tool_result
from components.recipes import RecipeName, get_recipe
from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import SandboxServiceError

log = logging.getLogger(__name__)

Outcome = Literal["running", "resolved", "unresolved", "infra_error"]


class EnvConfig(BaseModel):
    """What a served environment offers: one recipe's task suite on one sandbox service."""

    model_config = ConfigDict(extra="forbid")
    recipe: RecipeName = Field(description="Which recipe's tasks, tools and verifier (a registered recipe).")
    recipe_options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the recipe (e.g. difficulty)."
    )
    split: Split = Field("train", description="Task split episodes are drawn from.")
    num_tasks: int = Field(64, ge=1, description="Size of the generated task suite.")
    task_seed: int = Field(0, description="Seed of the task generator (same seed, same suite).")
    max_steps: int = Field(16, ge=1, description="Tool calls per episode; the last one ends it (then verified).")
    fork_setup: bool = Field(
        True,
        description="Snapshot a task's sandbox after its first setup; later episodes "
        "of that task fork the snapshot instead of setting up again.",
    )
    sandbox_wait_seconds: float = Field(120.0, gt=0, description="How long a new sandbox may take to be ready.")
    heartbeat_every_seconds: float | None = Field(
        30.0,
        gt=0,
        description="Heartbeat live episodes' sandboxes this often, so a trainer that generates for "
        "minutes between steps does not lose them to the service's idle reaper; None: off.",
    )
    sandbox_heartbeat_ttl_seconds: float | None = Field(
        None, gt=0, description="Override the recipe's sandbox idle TTL (the service caps it at its own)."
    )
    service: SandboxConnection = Field(
        default_factory=SandboxConnection, description="The sandbox service (URL and token)."
    )


class StepOutcome(BaseModel):
    """What the policy sees after reset or a step, plus the episode's end state."""

    model_config = ConfigDict(extra="forbid")
    output: str = Field(description="Observation text (the task prompt after reset).")
    done: bool = False
    reward: float | None = Field(
        None,
        description="1.0 resolved / 0.0 unresolved, set once verified; "
        "None while running and on infrastructure failures.",
    )
    outcome: Outcome = "running"
    policy_error: str | None = Field(None, description="The policy's mistake in this step (bad call).")
    infra_error: str | None = Field(None, description="Infrastructure failure that ended the episode.")
    reason: str | None = Field(None, description="Why the verifier did not resolve the task.")
    image_png_b64: str | None = Field(None, description="Screenshot (GUI), base64 PNG.")


class SetupCache:
    """Snapshots of finished setups, by task id, shared by the sessions of one server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, str] = {}

    def get(self, task_id: str) -> str | None:
        with self._lock:
            return self._snapshots.get(task_id)

    def put(self, task_id: str, snapshot_id: str) -> bool:
        """Keep the first snapshot of a task; False if another session stored one first."""
        with self._lock:
            if task_id in self._snapshots:
                return False
            self._snapshots[task_id] = snapshot_id
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._snapshots)

    def drain(self) -> list[str]:
        with self._lock:
            ids, self._snapshots = list(self._snapshots.values()), {}
        return ids


def delete_snapshot(client: SandboxClient, snapshot_id: str) -> None:
    try:
        client.request("DELETE", f"/v1/snapshots/{snapshot_id}")
    except Exception as err:  # a leftover snapshot costs disk, not correctness
        log.warning("could not delete snapshot %s: %s", snapshot_id, err)


class Heartbeats:
    """One daemon thread that heartbeats every registered sandbox; sessions add theirs while an episode lives.
    Why a thread: between two steps the trainer is generating, and nothing else touches the sandbox."""

    def __init__(self, every_seconds: float):
        self.every = every_seconds
        self._lock = threading.Lock()
        self._live: dict[str, Sandbox] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-heartbeats", daemon=True)
        self._thread.start()

    def add(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._live[sandbox.id] = sandbox

    def discard(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._live.pop(sandbox.id, None)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                live = list(self._live.values())
            for sandbox in live:
                try:
                    sandbox.heartbeat()
                except Exception as err:  # the episode's next call reports the loss as an infra error
                    log.warning("heartbeat of %s failed: %s", sandbox.id, err)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Infra(Exception):
    """An infrastructure failure: the episode ends as infra_error with this reason."""


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:1000]


class RecipeSession:
    """One environment instance: at most one live episode (and sandbox) at a time. Not thread-safe; each
    concurrent session gets its own instance, all sharing one client, recipe, task list and cache."""

    def __init__(
        self,
        config: EnvConfig,
        *,
        client: SandboxClient,
        recipe: RecipeBase | None = None,
        tasks: list[Task] | None = None,
        cache: SetupCache | None = None,
        heartbeats: Heartbeats | None = None,
    ):
        self.config = config
        self.heartbeats = heartbeats
        self.client = client
        self.recipe = recipe or get_recipe(config.recipe, **config.recipe_options)
        self.tasks = tasks if tasks is not None else self.recipe.tasks(config.split, config.num_tasks, config.task_seed)
        self.cache = cache
        self.task: Task | None = None
        self.sandbox: Sandbox | None = None
        self.steps = 0
        self.last: StepOutcome | None = None
        self.final_answer: str | None = None

    # -- episode ------------------------------------------------------------------------------
    def pick(self, *, task_id: str | None = None, task_index: int | None = None, seed: int | None = None) -> Task:
        if task_id is not None:
            for task in self.tasks:
                if task.id == task_id:
                    return task
            raise ValueError(
                f"no task {task_id!r} in this {self.config.recipe} suite "
                f"({self.config.split}, {len(self.tasks)} tasks, seed {self.config.task_seed})"
            )
        if task_index is None:
            return self.tasks[random.Random(seed).randrange(len(self.tasks))]
        if not 0 <= task_index < len(self.tasks):
            raise ValueError(
                f"task_index {task_index} is out of range: this {self.config.recipe} suite "
                f"({self.config.split}, seed {self.config.task_seed}) has {len(self.tasks)} tasks, "
                f"0 to {len(self.tasks) - 1} (num_tasks sets the size)"
            )
        return self.tasks[task_index]

    def reset(
        self, *, task_id: str | None = None, task_index: int | None = None, seed: int | None = None
    ) -> StepOutcome:
        """Start an episode (ending any previous one). Infrastructure failures come back as a done
        observation with `outcome="infra_error"`; an unknown task id or an out-of-range task index raises
        ValueError (the caller's mistake)."""
        self.close()
        self.task = self.pick(task_id=task_id, task_index=task_index, seed=seed)
        self.steps, self.final_answer = 0, None
        try:
            self.sandbox = self._sandbox_for(self.task)
        except _Infra as err:
            return self._end_infra(str(err))
        if self.heartbeats is not None:
            self.heartbeats.add(self.sandbox)
        self.last = StepOutcome(output=self.task.prompt)
        return self.last

    def _sandbox_for(self, task: Task) -> Sandbox:
        spec = self.recipe.sandbox_spec(task)
        if self.config.sandbox_heartbeat_ttl_seconds is not None:
            spec = spec.model_copy(update={"heartbeat_ttl_seconds": self.config.sandbox_heartbeat_ttl_seconds})
        snapshot = self.cache.get(task.id) if self.cache is not None and self.config.fork_setup else None
        if snapshot is not None:
            spec = spec.model_copy(update={"from_snapshot": snapshot})
        try:
            sandbox = self.client.create(spec, wait_timeout=self.config.sandbox_wait_seconds)
        except (SandboxServiceError, httpx.HTTPError) as err:
            raise _Infra(f"sandbox create failed: {_describe(err)}") from err
        try:
            if snapshot is not None:  # setup's files, none of its processes: the recipe restarts those
                self.recipe.resume(sandbox, task)
                return sandbox
            self.recipe.setup(sandbox, task)
            if self.cache is not None and self.config.fork_setup:
                snap = sandbox.snapshot()
                if not self.cache.put(task.id, snap.id):
                    delete_snapshot(self.client, snap.id)
        except Exception as err:  # setup is the environment's job: any failure is infrastructure
            self._delete(sandbox)
            what = "resuming the forked setup" if snapshot is not None else "setup"
            raise _Infra(f"{what} of {task.id} failed: {_describe(err)}") from err
        return sandbox

    def step(self, tool: str, arguments: dict[str, Any] | None = None) -> StepOutcome:
        """Run one tool call. Raises RuntimeError when no episode is running (reset first)."""
        if self.task is None or self.sandbox is None or (self.last is not None and self.last.done):
            raise RuntimeError("no episode is running: call reset() first (the last one has ended)")
        call = ToolCall(name=tool, arguments=dict(arguments or {}))
        try:
            result = self._execute(call)
        except _Infra as err:
            return self._end_infra(str(err))
        self.steps += 1
        if result.submitted:
            self.final_answer = result.final_answer
        png = base64.b64encode(result.image_png).decode() if result.image_png else None
        if result.submitted or self.steps >= self.config.max_steps:
            return self._verify(result.output, result.policy_error, png)
        self.last = StepOutcome(output=result.output, policy_error=result.policy_error, image_png_b64=png)
        return self.last

    def _execute(self, call: ToolCall) -> ToolResult:
        assert self.sandbox is not None and self.task is not None
        spec = next((t for t in self.recipe.tools() if t.name == call.name), None)
        wrong = spec.argument_error(call.arguments) if spec is not None else None
        if wrong:  # checked against the tool's own schema and bounds before anything runs, as the harness does
            return ToolResult(output=f"Error: {wrong}", policy_error=wrong)
        outcome: ToolResult | BaseException
        try:
            outcome = self.recipe.execute_tool(self.sandbox, self.task, call)
        except Exception as err:  # noqa: BLE001 - the service, the transport or the recipe's code: the rule decides
            if not isinstance(err, (SandboxServiceError, httpx.HTTPError)):
                log.warning("tool %s raised %s", call.name, _describe(err))
            outcome = err
        fresh = FreshSandbox(
            self.client, self.recipe.sandbox_spec(self.task), self.recipe, self.task, self.config.sandbox_wait_seconds
        )
        try:
            return tool_result(outcome, call, self.sandbox, fresh)
        except InfrastructureFailure as err:
            raise _Infra(str(err)) from err

    def verify(self) -> StepOutcome:
        """End the episode now and verify the state as it stands (a trainer's own step budget ran out)."""
        if self.last is not None and self.last.done:
            return self.last
        if self.task is None or self.sandbox is None:
            raise RuntimeError("no episode is running: call reset() first")
        return self._verify("", None, None)

    def _verify(self, output: str, policy_error: str | None, png: str | None) -> StepOutcome:
        assert self.sandbox is not None and self.task is not None
        # a verification run: its OOM is the infrastructure's, never the policy's (see core/episode/harness.py);
        # `verify` attributes a verification that gives no verdict by the one rule (core/episode/blame.py)
        verdict = self.recipe.verify(self.sandbox.verifying(), self.task, self.final_answer)
        if verdict.infra_error:
            return self._end_infra(verdict.infra_error)
        self.last = StepOutcome(
            output=output,
            done=True,
            reward=1.0 if verdict.resolved else 0.0,
            outcome="resolved" if verdict.resolved else "unresolved",
            policy_error=policy_error,
            reason=None if verdict.resolved else verdict.reason,
            image_png_b64=png,
        )
        self._release()
        return self.last

    def _end_infra(self, reason: str) -> StepOutcome:
        self.last = StepOutcome(
            output=f"Environment error: {reason}", done=True, outcome="infra_error", infra_error=reason
        )
        self._release()
        return self.last

    # -- descriptions ---------------------------------------------------------------------------
    def tools_openai(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self.recipe.tools()]

    def system_prompt(self) -> str:
        """The recipe's system prompt with the tool list, as our own harness renders it."""
        assert self.task is not None
        return f"{self.recipe.system_prompt(self.task)}\n\n{tools_prompt(self.tools_openai())}"

    # -- cleanup ---------------------------------------------------------------------------------
    def _delete(self, sandbox: Sandbox) -> None:
        try:
            self.recipe.release(sandbox)  # what setup kept for the episode (SWE: the pristine snapshot)
        except Exception as err:  # noqa: BLE001 - freeing must go on; the service drops snapshots at exit
            log.warning("could not release what setup kept for sandbox %s: %s", sandbox.id, err)
        try:
            sandbox.delete()
        except Exception as err:  # the service's reaper collects it; the episode's result stands
            log.warning("could not delete sandbox %s: %s", sandbox.id, err)

    def _release(self) -> None:
        """The episode has ended: free its sandbox now rather than at the next reset."""
        if self.sandbox is not None:
            if self.heartbeats is not None:
                self.heartbeats.discard(self.sandbox)
            self._delete(self.sandbox)
            self.sandbox = None

    def close(self) -> None:
        self._release()


class SharedEnv:
    """What every session of one server (OpenEnv) or factory (TRL) shares: the client, the recipe, its tasks,
    the setup snapshots and the heartbeat thread. `close()` removes the setup snapshots."""

    def __init__(self, config: EnvConfig):
        self.config = config
        self.client = SandboxClient(config.service.url, config.service.token, timeout=config.service.timeout_seconds)
        self.recipe = get_recipe(config.recipe, **config.recipe_options)
        self.tasks = self.recipe.tasks(config.split, config.num_tasks, config.task_seed)
        self.cache = SetupCache()
        self.heartbeats = Heartbeats(config.heartbeat_every_seconds) if config.heartbeat_every_seconds else None

    def session(self) -> RecipeSession:
        return RecipeSession(
            self.config,
            client=self.client,
            recipe=self.recipe,
            tasks=self.tasks,
            cache=self.cache,
            heartbeats=self.heartbeats,
        )

    def close(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.close()
        for snapshot_id in self.cache.drain():
            delete_snapshot(self.client, snapshot_id)
        self.client.close()
