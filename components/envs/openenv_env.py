"""OpenEnv environments for our recipes (SWE, GUI, Claw), served by `openenv-core` (the `orchard[openenv]` extra).

An action is one tool call `{tool, arguments}`; an observation is the tool's output plus the episode's end
state: when the policy submits (or the step limit is reached) the recipe's verifier decides, and the
observation carries `done=True` and `reward` 1.0 / 0.0. An infrastructure failure ends the episode with
`reward=None` and `outcome="infra_error"` (never a reward of 0): trainers should drop such episodes and
retry. Each WebSocket session of the server is one `RecipeEnvironment`, i.e. one sandbox at a time.

    orchard-env serve --recipe swe --port 8000          # or: orchard env serve --recipe swe
    client = RecipeEnvClient(base_url="http://127.0.0.1:8000").sync()
    with client:
        obs = client.reset(task_index=0).observation      # obs.output: the task, obs.tools: OpenAI tools
        obs = client.step(RecipeAction(tool="bash", arguments={"command": "ls"})).observation
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastmcp import FastMCP
from fastmcp.tools import FunctionTool
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from components.envs import session as session_module
from components.envs.session import EnvConfig, StepOutcome

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection


class RecipeAction(Action):
    """One tool call of the recipe's tool set."""

    tool: str = Field(description="Tool name, one of the observation's `tools`.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments (JSON object).")


class RecipeObservation(Observation):
    """Tool output and episode status; `reward` is set only when `done` and verified."""

    output: str = Field("", description="Tool output, or the task prompt after reset.")
    outcome: str = Field("running", description="running | resolved | unresolved | infra_error.")
    policy_error: str | None = Field(None, description="The policy's mistake in this step (bad call).")
    infra_error: str | None = Field(None, description="Infrastructure failure that ended the episode.")
    reason: str | None = Field(None, description="Why the verifier did not resolve the task.")
    image_png_b64: str | None = Field(None, description="Screenshot (GUI), base64 PNG.")
    task_id: str | None = None
    system_prompt: str | None = Field(None, description="After reset: the recipe's system prompt with tools.")
    tools: list[dict[str, Any]] | None = Field(None, description="After reset: OpenAI-format tool schemas.")


class RecipeState(State):
    recipe: str = ""
    task_id: str | None = None
    sandbox_id: str | None = None
    outcome: str = "running"


def _observation(out: StepOutcome, **extra: Any) -> RecipeObservation:
    return RecipeObservation(
        done=out.done,
        reward=out.reward,
        output=out.output,
        outcome=out.outcome,
        policy_error=out.policy_error,
        infra_error=out.infra_error,
        reason=out.reason,
        image_png_b64=out.image_png_b64,
        **extra,
    )


class RecipeEnvironment(Environment[RecipeAction, RecipeObservation, RecipeState]):
    """One session: a `RecipeSession` (one sandbox at a time). Sessions share the server's client,
    recipe, task list and setup snapshots, so many run at once."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, shared: "SharedEnv"):
        super().__init__()
        self.shared = shared
        self.session = shared.session()
        self._state = RecipeState(recipe=shared.config.recipe)
        self._mcp: FastMCP | None = None

    @property
    def mcp_server(self) -> FastMCP:
        """The recipe's tools over MCP (the server's `/mcp` route and the WebSocket's `mcp` messages):
        `tools/list` lists them with their JSON schemas; `tools/call` is one step of this session's episode
        (reset first), answered with the step's observation."""
        if self._mcp is None:
            self._mcp = FastMCP(f"orchard-{self.shared.config.recipe}")
            for spec in self.session.recipe.tools():
                self._mcp.add_tool(
                    FunctionTool(
                        name=spec.name,
                        description=spec.description,
                        parameters=spec.parameters,
                        fn=self._mcp_call(spec.name),
                    )
                )
        return self._mcp

    def _mcp_call(self, tool: str) -> Callable[..., Awaitable[dict[str, Any]]]:
        async def call(**arguments: Any) -> dict[str, Any]:  # off the event loop: a step runs a sandbox command
            obs = await asyncio.to_thread(self.step, RecipeAction(tool=tool, arguments=arguments))
            return obs.model_dump(exclude={"metadata"})

        return call

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        task_index: int | None = None,
        **_: Any,
    ) -> RecipeObservation:
        out = self.session.reset(task_id=task_id, task_index=task_index, seed=seed)
        task = self.session.task
        sandbox = self.session.sandbox
        self._state = RecipeState(
            episode_id=episode_id or uuid.uuid4().hex,
            step_count=0,
            recipe=self.shared.config.recipe,
            task_id=task.id if task else None,
            sandbox_id=sandbox.id if sandbox else None,
            outcome=out.outcome,
        )
        return _observation(
            out,
            task_id=self._state.task_id,
            system_prompt=self.session.system_prompt() if task else None,
            tools=self.session.tools_openai(),
        )

    def step(self, action: RecipeAction, timeout_s: float | None = None, **_: Any) -> RecipeObservation:
        try:
            out = self.session.step(action.tool, action.arguments)
        except RuntimeError as err:  # stepping an ended episode: the caller's mistake, said plainly
            return RecipeObservation(
                done=True,
                output=str(err),
                outcome=self._state.outcome,
                policy_error=str(err),
                task_id=self._state.task_id,
            )
        self._state.step_count += 1
        self._state.outcome = out.outcome
        if out.done:
            self._state.sandbox_id = None
        return _observation(out, task_id=self._state.task_id)

    @property
    def state(self) -> RecipeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"orchard-{self.shared.config.recipe}",
            description=f"orchard {self.shared.config.recipe} recipe on the sandbox service "
            "(tools as actions, the verifier's result as the final reward)",
            version="0.1.0",
        )

    def close(self) -> None:
        self.session.close()


class SharedEnv(session_module.SharedEnv):
    """What all sessions of one server share (see `components.envs.session.SharedEnv`)."""

    def new_environment(self) -> RecipeEnvironment:
        return RecipeEnvironment(self)


TOKEN_ENV = "ORCHARD_ENV_TOKEN"
_UNAUTHORIZED = (
    f"missing or wrong token: send 'Authorization: Bearer <token>' (the server printed it at start, "
    f"or it was given as --token / {TOKEN_ENV}); RecipeEnvClient reads {TOKEN_ENV}"
)


def create_env_app(config: EnvConfig, *, token: str, max_concurrent_envs: int = 64) -> tuple[FastAPI, SharedEnv]:
    """The OpenEnv server app (reset/step/state over HTTP and WebSocket), every route but /health behind
    `Authorization: Bearer <token>`: its episodes spend the sandbox service's token and its session cap.
    Call `shared.close()` at exit."""
    from sandbox_service.server.auth import BearerAuthMiddleware, TokenAuth

    shared = SharedEnv(config)
    app = create_fastapi_app(
        shared.new_environment, RecipeAction, RecipeObservation, max_concurrent_envs=max_concurrent_envs
    )
    app.add_middleware(BearerAuthMiddleware, auth=TokenAuth(token), open_paths=("/health",), message=_UNAUTHORIZED)
    return app, shared


class RecipeEnvClient(EnvClient[RecipeAction, RecipeObservation, RecipeState]):
    """OpenEnv client of a served recipe (async; `.sync()` for a blocking one). `token`: the server's
    (default: $ORCHARD_ENV_TOKEN), sent as a bearer token on the WebSocket handshake."""

    _ws: ClientConnection | None  # the base class's connection, restated: mypy cannot infer it from the base class

    def __init__(self, base_url: str, *, token: str | None = None, **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self._token = token or os.environ.get(TOKEN_ENV)

    async def connect(self) -> "RecipeEnvClient":
        if self._ws is None and self._token:
            from websockets.asyncio.client import connect as ws_connect

            try:
                self._ws = await ws_connect(
                    self._ws_url,
                    open_timeout=self._connect_timeout,
                    max_size=self._max_message_size,
                    proxy=None,
                    additional_headers={"Authorization": f"Bearer {self._token}"},
                )
            except Exception as e:  # the base class's contract
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {e}") from e
        return await super().connect()

    def _step_payload(self, action: RecipeAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[RecipeObservation]:
        obs = RecipeObservation.model_validate(
            {**payload.get("observation", {}), "done": payload.get("done", False), "reward": payload.get("reward")}
        )
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> RecipeState:
        return RecipeState.model_validate(payload)
