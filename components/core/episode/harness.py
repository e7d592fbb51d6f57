"""The harness: one episode of a policy acting on a task through tools in a sandbox.

It turns model text into tool calls (`protocol.py`) and tool results into observations, checks each
call's arguments against the tool's own JSON schema before it runs (a mismatch is the policy's error,
an observation), enforces the limits, and verifies the end state with the recipe's hidden checks. Every failure is
attributed
to one boundary: malformed output or a bad tool call is the policy's error (an observation, the
episode goes on); the sandbox service, the verifier's environment or the policy endpoint failing is
infrastructure (`Outcome.infra_error`, `EpisodeStatus.aborted`, with the reason), never unresolved.

Attribution rule (also in docs/concepts/rewards.md): infrastructure errors are only failures of the sandbox as a
whole for a reason outside its own processes (creation, image, node, agent lost without a cause inside,
service timeout) and failures of the verification runs this harness starts. Everything a policy's
command does to itself is the policy's: a non-zero exit, its own timeout, the signals it sends (the
agent ignores every signal sent from inside the sandbox), and running the sandbox out of memory
(`command_failed` with `reason="oom"`, no resource escalation; a sandbox the command took down is
recreated with the same memory). Verification runs go through `Sandbox.verifying()`, which marks their
execs (`ExecRequest.verification`); tools only ever get the unmarked handle, so a policy cannot mark
its own commands, and its OOM is never an infrastructure error.

No byte a policy chooses can make a failed step an infrastructure error: a tool call, the verification,
a snapshot of the state it left or a fork of such a state is the infrastructure's only when the service's
own record shows the sandbox lost or a health check the harness chooses fails in a fresh sandbox of the
same spec; a failure its arguments caused is the policy's at once (one rule, `step_blame.py`; otherwise
a tool's failure is an error the model sees, a verification's is unresolved with the reason, a
snapshot's is a note on the step). The verdict's record (verifier, version, ignored parts of the
change) is kept on the trajectory, and `recipe.release` frees what setup kept (a pristine snapshot).

Limits: `max_steps` and `max_total_tokens` count what the policy wrote; `max_wall_seconds` counts policy
time only (`metadata["policy_seconds"]`): each turn's generation plus the run time of the commands its
tools executed, as the agent inside the sandbox measured them. Sandbox creation and setup, the transport
and queueing of every exec, file transfers, snapshots, heartbeats and verification are the
infrastructure's time and are never charged (they stay in `wall_seconds`). Why not the other option
(count everything, and call a wall-clock cut caused by infrastructure an infra error): telling which
cut the infrastructure caused would need exactly this accounting, and dropping such episodes would
also drop the policy's slow-but-honest ones. All three cuts end the episode unsubmitted and it is still
verified; how the RL samplers treat its reward is one rule for all of them (`rl.sampling.rules.carries_reward`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from components.core.distributed import rank
from components.core.interrupts import raise_if_stopping
from components.core.policy.base import EpisodeAwarePolicy, GenerationConfig, Policy, ToolAwarePolicy
from components.core.rendering.protocol import ToolCallParseError, tools_prompt
from components.core.episode.recipe_base import RecipeBase, ToolResult, VerifyResult
from components.core.rendering.tokens import steps_as_messages
from components.core.episode.blame import (
    Failure,
    FailureKind,
    FreshSandbox,
    InfrastructureFailure,
    blame,
    sandbox_lost,
    tool_result,
)
from components.core.data.schema import EpisodeStatus, Outcome, Step, Task, TestReport, Trajectory, Verification, utcnow
from components.core.rendering.tool_formats import NATIVE_FORMATS, ToolFormat, ToolFormatSetting, parse_call
from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import SandboxServiceError

log = logging.getLogger(__name__)


class HarnessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: int = Field(16, ge=1, description="Most assistant turns; reaching it ends the episode as truncated.")
    max_total_tokens: int = Field(
        16384, ge=16, description="Most tokens in the conversation (last prompt + completion); beyond: truncated."
    )
    tool_call_timeout_seconds: float = Field(
        180.0,
        gt=0,
        description="Watchdog on one tool call; a call that hangs this long is the policy's error "
        "unless the harness's health check fails in a fresh sandbox (step_blame.py).",
    )
    max_wall_seconds: float = Field(
        900.0,
        gt=0,
        description="Policy-time budget per episode (generation + the "
        "commands' own run time; never sandbox latency); beyond: time_truncated.",
    )
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="Sampling settings per turn.")
    snapshot_every_step: bool = Field(
        False, description="Snapshot the sandbox after setup and after every tool step (Step.sandbox_state_id)."
    )
    sandbox_wait_seconds: float = Field(120.0, gt=0, description="How long to wait for a new sandbox to be ready.")
    heartbeat_every_seconds: float = Field(30.0, gt=0, description="Heartbeat the sandbox when idle this long.")
    tool_format: ToolFormatSetting = Field(
        "auto",
        description="How tool calls are written and parsed: auto = the policy's own (a local model's "
        "chat template; the text protocol for endpoints and scripted teachers); protocol = "
        "our text protocol described in the system prompt; hermes / llama3_json = native.",
    )


class _Abort(Exception):
    """Infrastructure failure: the episode ends as infra_error/aborted with this reason."""


steps_to_messages = steps_as_messages  # the chat conversation of a list of steps (one definition)


def policy_tool_format(policy: Policy, config: HarnessConfig) -> ToolFormat:
    """The tool-call format of this episode: the harness option, else the policy's own."""
    own = policy.tool_format if isinstance(policy, ToolAwarePolicy) else "protocol"
    if config.tool_format == "auto":
        return own  # type: ignore[return-value]
    if isinstance(policy, ToolAwarePolicy) and own != config.tool_format:
        raise ValueError(
            f"harness tool_format={config.tool_format!r} but policy {policy.policy_id} writes {own!r}; "
            "build the policy with the same tool_format"
        )
    return config.tool_format


def initial_steps(task: Task, recipe: RecipeBase, tool_format: ToolFormat = "protocol") -> list[Step]:
    """System and user steps. The text protocol is described in the system prompt; native formats get the
    tool specs through the chat template instead (`Trajectory.tools`)."""
    tools = [t.openai() for t in recipe.tools()]
    system = recipe.system_prompt(task)
    if tool_format not in NATIVE_FORMATS:
        system = f"{system}\n\n{tools_prompt(tools)}"
    return [Step(index=0, role="system", content=system), Step(index=1, role="user", content=task.prompt)]


def storable(text: str) -> str:
    """`text` with any lone surrogate (an endpoint's JSON can carry "\\ud800") replaced, so the
    trajectory always serialises as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:1000]


class _Metered:
    """The sandbox as a policy's tools see it: every command's own run time (measured by the agent inside
    the sandbox, so without transport or queueing) is charged to the episode's policy time. Everything
    else is the sandbox's own method."""

    def __init__(self, sandbox: Sandbox, episode: _Episode):
        self._sandbox, self._episode = sandbox, episode

    def exec(self, *args: Any, **kwargs: Any) -> Any:
        result = self._sandbox.exec(*args, **kwargs)
        if not result.is_infra_error:
            self._episode.policy_seconds += result.duration_seconds
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)


class _Episode:
    """State of one running episode (kept off module globals so episodes run in parallel threads)."""

    def __init__(self, task: Task, recipe: RecipeBase, policy: Policy, config: HarnessConfig, fresh: FreshSandbox):
        self.task, self.recipe, self.policy, self.config = task, recipe, policy, config
        self.fresh = fresh  # the harness's health checks in a fresh sandbox of the task, for blame
        self.tool_format = policy_tool_format(policy, config)
        self.specs = {t.name: t for t in recipe.tools()}
        self.tools = [t.openai() for t in self.specs.values()]
        self.start = time.monotonic()
        self.steps: list[Step] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.final_answer: str | None = None
        self.submitted = False
        self.sandbox: Sandbox | None = None
        self.policy_seconds = 0.0  # what max_wall_seconds limits: generation + the commands' own run time
        self.last_contact = time.monotonic()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def add(self, **fields: Any) -> Step:
        step = Step(index=len(self.steps), **fields)
        self.steps.append(step)
        return step

    def snapshot_into(self, step: Step, *, policy_state: bool = True) -> None:
        """Save the sandbox's state as `step.sandbox_state_id`. A snapshot of the state the policy left that
        fails is the policy's (a note on the step, no state id) unless the one rule blames the infrastructure;
        before the policy acted (`policy_state=False`) any failure is the infrastructure's."""
        if not self.config.snapshot_every_step or self.sandbox is None:
            return
        try:
            step.sandbox_state_id = self.sandbox.snapshot().id
            return
        except (SandboxServiceError, httpx.HTTPError) as err:
            if not policy_state:
                raise _Abort(f"snapshot failed: {_describe(err)}") from err
            failure = Failure(FailureKind.snapshot_failed, _describe(err))
        sandbox = self.sandbox
        infra = blame(failure, lost=lambda: sandbox_lost(sandbox), fresh=self.fresh.snapshot)
        if infra:
            raise _Abort(f"snapshot failed: {infra}")
        note = f"the sandbox state after this step could not be saved: {failure.detail}"[:500]
        step.content = f"{step.content}\n[{note}]"
        step.policy_error = f"{step.policy_error}; {note}" if step.policy_error else note

    def run_tool(self, step: Step) -> ToolResult:
        """Execute an assistant step's call under the watchdog. A call that fails is blamed by the one rule
        (`step_blame.py`): the infrastructure's raises `_Abort`, the policy's is an error the model sees."""
        assert self.sandbox is not None and step.tool_call is not None
        call = step.tool_call
        spec = self.specs.get(call.name)
        wrong = spec.argument_error(call.arguments) if spec is not None else None
        if wrong:  # checked against the tool's own schema before anything runs: the policy's error
            return ToolResult(output=f"Error: {wrong}", policy_error=wrong)
        future = self._pool.submit(self.recipe.execute_tool, _Metered(self.sandbox, self), self.task, call)
        outcome: ToolResult | BaseException
        try:
            outcome = future.result(timeout=self.config.tool_call_timeout_seconds)
        except concurrent.futures.TimeoutError as err:
            outcome = err
            # The hung call keeps its thread; later calls get a fresh one instead of queueing behind it.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool")
        except Exception as err:  # sandbox service, transport, or the recipe's own code
            if not isinstance(err, (SandboxServiceError, httpx.HTTPError)):
                log.warning("tool %s raised %s", call.name, _describe(err))
            outcome = err
        self.last_contact = time.monotonic()
        try:
            return tool_result(outcome, call, self.sandbox, self.fresh, self.config.tool_call_timeout_seconds)
        except InfrastructureFailure as err:
            raise _Abort(str(err)) from err

    def observe(self, step: Step, result: ToolResult, started: float) -> Step:
        assert step.tool_call is not None
        obs = self.add(
            role="tool",
            content=result.output,
            tool_call_id=step.tool_call.id,
            tool_name=step.tool_call.name,
            policy_error=result.policy_error,
            started_at=utcnow(),
            duration_seconds=time.monotonic() - started,
        )
        if result.submitted:
            self.submitted = True
            self.final_answer = result.final_answer
        self.snapshot_into(obs)
        return obs

    def replay(self, prefix: list[Step], *, rerun: bool) -> None:
        """Adopt `prefix` as the start of the episode. With `rerun` its tool calls are executed again
        to rebuild the sandbox state (no snapshot to fork); a final unanswered call is answered now."""
        if prefix[0].role != "system":  # a bare action prefix: put the task's own preamble first
            prefix = initial_steps(self.task, self.recipe, self.tool_format) + [
                s for s in prefix if s.role not in ("system", "user")
            ]
        for s in prefix:
            self.steps.append(s.model_copy(update={"index": len(self.steps)}, deep=True))
        last = len(self.steps) - 1
        for i, step in enumerate(list(self.steps)):
            if step.role != "assistant" or step.tool_call is None:
                continue
            answered = i < last and self.steps[i + 1].role == "tool"
            if answered and not rerun:
                continue
            if not answered and i != last:
                continue
            result = self.run_tool(step)
            if answered:
                if result.submitted:
                    self.submitted, self.final_answer = True, result.final_answer
            else:
                self.observe(step, result, time.monotonic())

    def verify(self) -> VerifyResult:
        """The recipe's verdict (`RecipeBase.verify` attributes a verification that gives none by the one
        rule): an infrastructure failure raises `_Abort`."""
        assert self.sandbox is not None
        try:
            # The only place execs are marked as verification runs (their OOM is the infrastructure's).
            verdict = self.recipe.verify(self.sandbox.verifying(), self.task, self.final_answer)
        except Exception as err:  # `verify` attributes the verifier's failures; this is the harness's own
            raise _Abort(f"verification failed: {_describe(err)}") from err
        if verdict.infra_error:
            raise _Abort(verdict.infra_error)
        return verdict

    def loop(self) -> EpisodeStatus:
        cfg = self.config
        assert self.sandbox is not None
        while not self.submitted:
            raise_if_stopping()  # Ctrl-C/SIGTERM: the episode ends here and its sandbox is deleted
            turns = sum(1 for s in self.steps if s.role == "assistant")
            if turns >= cfg.max_steps:
                return EpisodeStatus.truncated
            if self.policy_seconds >= cfg.max_wall_seconds:
                return EpisodeStatus.time_truncated
            if time.monotonic() - self.last_contact > cfg.heartbeat_every_seconds:
                try:
                    self.sandbox.heartbeat()
                except (SandboxServiceError, httpx.HTTPError) as err:
                    raise _Abort(f"sandbox lost: {_describe(err)}") from err
                self.last_contact = time.monotonic()
            started = time.monotonic()
            started_at = utcnow()
            generation = cfg.generation.for_turn(turns)  # fresh random numbers every turn
            try:
                messages = steps_as_messages(self.steps)
                if isinstance(self.policy, ToolAwarePolicy):
                    gen = self.policy.generate(messages, generation, tools=self.tools)
                else:
                    gen = self.policy.generate(messages, generation)
            except Exception as err:  # the provider boundary: an endpoint failure is not a policy error
                raise _Abort(f"policy {self.policy.policy_id} failed to generate: {_describe(err)}") from err
            self.policy_seconds += time.monotonic() - started
            self.prompt_tokens += gen.prompt_tokens
            self.completion_tokens += gen.completion_tokens
            try:
                call = parse_call(gen.text, self.tool_format)
                error = None
            except ToolCallParseError as err:
                call, error = None, str(err)
            step = self.add(
                role="assistant",
                content=storable(gen.text),
                tool_call=call,
                policy_error=error,
                token_ids=list(gen.token_ids) if gen.token_ids is not None else None,
                logprobs=list(gen.logprobs) if gen.logprobs is not None else None,
                tokenizer_id=gen.tokenizer_id if gen.token_ids is not None else None,
                started_at=started_at,
                duration_seconds=time.monotonic() - started,
            )
            if call is None:
                obs = self.add(role="tool", content=f"Error: {error}", policy_error=error, started_at=utcnow())
                self.snapshot_into(obs)  # every step gets a restorable state, even an unchanged one
            else:
                tool_started = time.monotonic()
                self.observe(step, self.run_tool(step), tool_started)
            if gen.prompt_tokens + gen.completion_tokens >= cfg.max_total_tokens and not self.submitted:
                return EpisodeStatus.truncated
        return EpisodeStatus.completed


def _fork(ep: _Episode, client: SandboxClient, spec: Any, snapshot: str) -> bool:
    """Start `ep.sandbox` from `snapshot` (a state a policy made) and restart the recipe's processes in it.
    True when it did; False when that failed on the saved state (the one rule: a fresh sandbox of the task
    comes up), and the episode starts from the task's setup instead, replaying the prefix. An
    infrastructure failure raises `_Abort`."""
    sandbox = None
    try:
        sandbox = client.create(
            spec.model_copy(update={"from_snapshot": snapshot}), wait_timeout=ep.config.sandbox_wait_seconds
        )
        ep.recipe.resume(sandbox, ep.task)  # the snapshot's files, none of its processes: the recipe restarts those
        ep.sandbox = sandbox
        return True
    except Exception as err:  # noqa: BLE001 - whose failure: the one rule decides
        failure = Failure(FailureKind.fork_failed, _describe(err))
        if sandbox is not None:
            try:
                sandbox.delete()
            except Exception as gone:  # noqa: BLE001 - the reaper collects it
                log.warning("could not delete sandbox %s: %s", sandbox.id, gone)
    infra = blame(failure, lost=lambda: None, fresh=ep.fresh.setup)  # no sandbox of the episode yet
    if infra:
        raise _Abort(f"sandbox setup failed: {infra}")
    log.warning("forking %s failed on the saved state (%s); starting from the task's setup", snapshot, failure)
    return False


def run_episode(
    task: Task,
    recipe: RecipeBase,
    policy: Policy,
    client: SandboxClient,
    config: HarnessConfig,
    *,
    prefix_steps: list[Step] | None = None,
    from_snapshot: str | None = None,
) -> Trajectory:
    """Run one episode and verify it. With `from_snapshot` the sandbox forks that state (no setup,
    no replay; a fork that fails on the saved state falls back to setup and replay); with only
    `prefix_steps` the prefix's tool calls are re-executed after setup."""
    raise_if_stopping()  # a stopping run starts no more episodes (queued ones in a thread pool end here)
    spec = recipe.sandbox_spec(task)
    ep = _Episode(task, recipe, policy, config, FreshSandbox(client, spec, recipe, task, config.sandbox_wait_seconds))
    if isinstance(policy, EpisodeAwarePolicy):
        policy.reset(task)
    status, outcome, reason = EpisodeStatus.aborted, Outcome.infra_error, None
    report: TestReport | None = None
    verification: Verification | None = None
    try:
        forked = _fork(ep, client, spec, from_snapshot) if from_snapshot else False
        if not forked:
            try:
                ep.sandbox = client.create(spec, wait_timeout=config.sandbox_wait_seconds)
                recipe.setup(ep.sandbox, task)
            except Exception as err:
                raise _Abort(f"sandbox setup failed: {_describe(err)}") from err
        ep.last_contact = time.monotonic()
        if prefix_steps:
            ep.replay(prefix_steps, rerun=not forked)
            ep.policy_seconds = 0.0  # replaying a (teacher's) prefix is not this policy's time
        else:
            ep.steps = initial_steps(task, recipe, ep.tool_format)
            ep.snapshot_into(ep.steps[-1], policy_state=False)
        status = ep.loop() if not ep.submitted else EpisodeStatus.completed
        verdict = ep.verify()
        report, verification = verdict.report, verdict.verification
        outcome = Outcome.resolved if verdict.resolved else Outcome.unresolved
        reason = verdict.reason if not verdict.resolved else None
        if not verdict.resolved and status is not EpisodeStatus.completed:
            reason = f"{status.value}: {reason}"
    except _Abort as err:
        status, outcome, reason = EpisodeStatus.aborted, Outcome.infra_error, str(err)
        if not ep.steps:
            ep.steps = initial_steps(task, recipe, ep.tool_format)
    finally:
        ep._pool.shutdown(wait=False, cancel_futures=True)
        if ep.sandbox is not None:
            try:
                recipe.release(ep.sandbox)
            except Exception as err:  # a kept snapshot outlives the episode until the service drops it
                log.warning("recipe %s could not release sandbox %s: %s", recipe.name, ep.sandbox.id, err)
            try:
                ep.sandbox.delete()
            except Exception as err:  # the reaper collects it; the episode's result stands
                log.warning("could not delete sandbox %s: %s", ep.sandbox.id, err)
    reward = {Outcome.resolved: 1.0, Outcome.unresolved: 0.0}.get(outcome)
    return Trajectory(
        task_id=task.id,
        recipe=task.recipe,
        split=task.split,
        policy_id=policy.policy_id,
        steps=ep.steps,
        tools=ep.tools,
        final_answer=ep.final_answer,
        outcome=outcome,
        outcome_reason=reason,
        status=status,
        test_report=report,
        verification=verification,
        reward=reward,
        prompt_tokens=ep.prompt_tokens,
        completion_tokens=ep.completion_tokens,
        wall_seconds=ep.elapsed(),
        metadata={
            "sandbox_id": ep.sandbox.id if ep.sandbox else None,
            "family": task.family,
            "difficulty": task.difficulty,
            "from_snapshot": from_snapshot,
            "prefix_len": len(prefix_steps) if prefix_steps else 0,
            "tool_format": ep.tool_format,
            "policy_seconds": ep.policy_seconds,
            # which process of a distributed launch ran it (0 alone): a PyTorchJob's ranks each roll out
            "rank": rank(),
        },
    )
