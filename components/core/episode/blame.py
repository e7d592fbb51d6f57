"""Whose failure a failed step is: the one rule, applied to every tool call, verification and snapshot.

An episode that ends as an infrastructure error carries no reward, so a policy that could end its
failures that way would never see them. The rule therefore gives the infrastructure a failure only on
evidence no byte the policy chose can produce:

(a) the service's own record of the episode's sandbox says it is lost (failed, deleted, unknown to the
    service, or the service does not answer), or
(b) a health check the harness chooses fails in a **fresh** sandbox of the same spec, set up from the
    task's pristine state: never the policy's own sandbox, never the policy's call or arguments
    (`RecipeBase.health_calls` for tools, the verification of the pristine state, a snapshot of it).
    A fresh sandbox that cannot be created or set up is such a failed check.

Every other failure is the policy's: a tool call's becomes an error the model sees (and is scored for), a
verification's an unresolved verdict with the reason, a snapshot's a note on the step. Failures whose kind
says the call's arguments caused them (`FailureKind.invalid_argument`: the service's `invalid_request`, a
path the filesystem refuses, a request too large) are the policy's without any check.

Not evidence of innocence: running the policy's own call again on the pristine state. A call whose
arguments alone make it fail (a query too long for sqlite, an argument too long for one argv) fails the
same way there, so that reading would hand the policy every failure its arguments can cause.

The kinds (`FailureKind`) are decided where a step failed, from the error's type, never from message text.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import httpx

from components.core.data.schema import Task, ToolCall
from components.core.episode.results import ToolResult, VerifyResult
from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import InvalidRequestError, SandboxNotFoundError, SandboxServiceError, ValidationFailedError
from sandbox_service.models import SandboxCreate, SandboxState

log = logging.getLogger(__name__)

FRESH_WAIT_SECONDS = 120.0  # how long the fresh sandbox of a health check may take to be ready
HEALTH_CALL_TIMEOUT_SECONDS = 180.0  # watchdog on one health call where the caller gives none


class FailureKind(str, enum.Enum):
    """How a step failed: the one taxonomy of step failures (the rule in `blame` reads nothing else)."""

    invalid_argument = "invalid_argument"  # the call's arguments: invalid, too long, NUL, a path the filesystem refuses
    tool_crashed = "tool_crashed"  # the tool's own code or program failed (an exception, an exit it does not document)
    tool_timeout = "tool_timeout"  # the call did not return within the harness's watchdog
    service_error = "service_error"  # the sandbox service or its transport reported an error during the step
    no_verdict = "no_verdict"  # the verification gave no verdict
    snapshot_failed = "snapshot_failed"  # saving the state the policy left failed
    fork_failed = "fork_failed"  # starting a sandbox from a saved state (made by a policy) failed

    @property
    def caused_by_arguments(self) -> bool:
        return self is FailureKind.invalid_argument


@dataclass(frozen=True)
class Failure:
    """How a step failed: `kind` decides whose it is; `detail` is for people."""

    kind: FailureKind
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value


class Recipe(Protocol):
    """What the rule uses of a recipe (`RecipeBase`, which builds on this module, has all of it)."""

    def sandbox_spec(self, task: Task) -> SandboxCreate: ...
    def setup(self, sandbox: Sandbox, task: Task) -> None: ...
    def release(self, sandbox: Sandbox) -> None: ...
    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult: ...
    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult: ...
    def health_calls(self, task: Task) -> list[ToolCall]: ...


class InfrastructureFailure(Exception):
    """The rule found the infrastructure at fault: the episode ends as infra_error with this reason."""


def blame(failure: Failure, *, lost: Callable[[], str | None], fresh: Callable[[], str | None]) -> str | None:
    """The infrastructure's reason for `failure`, or None when it is the policy's outcome.

    `lost()` reads the service's record of the episode's sandbox (what is lost, or None); `fresh()` runs the
    harness's health check in a fresh sandbox (what is broken, or None). Neither runs for a failure its
    arguments caused."""
    if failure.kind.caused_by_arguments:
        return None
    gone = lost()
    if gone:
        return f"{failure}; the service reports the sandbox lost: {gone}"
    broken = fresh()
    if broken:
        return f"{failure}; the harness's health check failed in a fresh sandbox: {broken}"
    return None


# -- the kinds of what a step returned or raised -------------------------------------------------------------
# A missing file is not here: a tool that reads a path the policy named catches it itself, and one that
# lets it escape read a path of its own (the rule decides).
_ARGUMENT_ERRORS = (InvalidRequestError, ValidationFailedError)


def failure_of_tool(outcome: ToolResult | BaseException) -> Failure | None:
    """How a tool call failed (None: it did not). A policy error is the tool working as meant."""
    if isinstance(outcome, concurrent.futures.TimeoutError):
        return Failure(FailureKind.tool_timeout, "the tool call did not return in time")
    if isinstance(outcome, _ARGUMENT_ERRORS):  # the request the call's arguments made was refused
        return Failure(FailureKind.invalid_argument, outcome.message[:300])
    if isinstance(outcome, SandboxServiceError):
        return Failure(FailureKind.service_error, f"{outcome.infra_error or outcome.code}: {outcome.message}"[:300])
    if isinstance(outcome, httpx.HTTPError):
        return Failure(FailureKind.service_error, f"transport {type(outcome).__name__}: {outcome}"[:300])
    if isinstance(outcome, BaseException):
        return Failure(FailureKind.tool_crashed, f"{type(outcome).__name__}: {outcome}"[:300])
    if outcome.infra_error:
        return Failure(FailureKind.tool_crashed, str(outcome.infra_error)[:300])
    return None


def failure_of_verification(outcome: VerifyResult | BaseException) -> Failure | None:
    """How a verification failed to give a verdict (None: it gave one, resolved or not)."""
    if isinstance(outcome, BaseException):
        return Failure(FailureKind.no_verdict, f"{type(outcome).__name__}: {outcome}"[:300])
    if outcome.infra_error:
        return Failure(FailureKind.no_verdict, str(outcome.infra_error)[:300])
    return None


# -- (a) the service's record ------------------------------------------------------------------------------
def sandbox_lost(sandbox: Sandbox) -> str | None:
    """What the service's own record says is lost about `sandbox` (None: it is there). Nothing runs in it."""
    try:
        info = sandbox.refresh()
    except SandboxNotFoundError as err:
        return f"the service no longer knows sandbox {sandbox.id}: {err}"[:300]
    except (SandboxServiceError, httpx.HTTPError) as err:
        return f"the service did not answer about sandbox {sandbox.id}: {type(err).__name__}: {err}"[:300]
    if info.state in (SandboxState.failed, SandboxState.deleted):
        return f"sandbox {sandbox.id} is {info.state.value} ({info.infra_error}: {info.error})"[:300]
    return None


# -- (b) the harness's health checks in a fresh sandbox --------------------------------------------------------
class FreshSandbox:
    """A health check in a fresh sandbox of the task's spec, set up from its pristine state (never a fork of
    the policy's state), deleted afterwards."""

    def __init__(
        self,
        client: SandboxClient,
        spec: SandboxCreate,
        recipe: Recipe,
        task: Task,
        wait_seconds: float = FRESH_WAIT_SECONDS,
    ):
        self.client, self.recipe, self.task, self.wait_seconds = client, recipe, task, wait_seconds
        self.spec = spec.model_copy(update={"from_snapshot": None, "request_id": None})

    def check(self, what: Callable[[Sandbox], str | None]) -> str | None:
        """What `what(sandbox)` found broken in the fresh sandbox (None: healthy); a sandbox that cannot be
        created or set up is broken."""
        try:
            sandbox = self.client.create(self.spec, wait_timeout=self.wait_seconds)
        except Exception as err:  # noqa: BLE001 - any failure to get a fresh sandbox is the infrastructure's
            return f"could not create a fresh sandbox: {type(err).__name__}: {err}"[:500]
        try:
            try:
                self.recipe.setup(sandbox, self.task)
            except Exception as err:  # noqa: BLE001 - the pristine state alone does not come up
                return f"could not set up a fresh sandbox: {type(err).__name__}: {err}"[:500]
            return what(sandbox)
        finally:
            _quietly(lambda: self.recipe.release(sandbox))
            _quietly(sandbox.delete)  # the reaper collects it otherwise; the check's finding stands

    def tools(self, timeout: float = HEALTH_CALL_TIMEOUT_SECONDS) -> str | None:
        """The recipe's harness-chosen health calls, each under the watchdog: a failure, or arguments the tool
        refuses, means the tools are broken."""

        def run(sandbox: Sandbox) -> str | None:
            res = _caught(lambda: sandbox.exec(["true"], timeout=30))
            if isinstance(res, BaseException) or not res.ok:
                return f"`true` did not run: {res}"[:300]
            for call in self.recipe.health_calls(self.task):
                outcome = _watched(lambda: self.recipe.execute_tool(sandbox, self.task, call), timeout)
                failed = failure_of_tool(outcome)
                if failed is None and outcome.policy_error:
                    failed = Failure(
                        FailureKind.tool_crashed, f"refused the harness's arguments: {outcome.policy_error}"
                    )
                if failed is not None:
                    return f"health call {call.name} {call.arguments}: {failed}"[:500]
            return None

        return self.check(run)

    def verification(self) -> str | None:
        """The recipe's own verification of the pristine state (no answer) must give a verdict."""

        def run(sandbox: Sandbox) -> str | None:
            failed = failure_of_verification(_caught(lambda: self.recipe.judge(sandbox.verifying(), self.task, None)))
            return None if failed is None else f"the pristine state's verification: {failed}"

        return self.check(run)

    def snapshot(self) -> str | None:
        """The pristine state must snapshot."""

        def run(sandbox: Sandbox) -> str | None:
            taken = _caught(sandbox.snapshot)
            if isinstance(taken, BaseException):
                return f"the pristine state's snapshot: {type(taken).__name__}: {taken}"[:500]
            _quietly(lambda: self.client.request("DELETE", f"/v1/snapshots/{taken.id}"))
            return None

        return self.check(run)

    def setup(self) -> str | None:
        """The pristine state must come up (creation and setup only)."""
        return self.check(lambda sandbox: None)


# -- the rule applied to one step ---------------------------------------------------------------------------
def tool_result(
    outcome: ToolResult | BaseException,
    call: ToolCall,
    sandbox: Sandbox,
    fresh: FreshSandbox,
    timeout: float = HEALTH_CALL_TIMEOUT_SECONDS,
) -> ToolResult:
    """What the policy sees for a tool call that ended in `outcome`; raises InfrastructureFailure when the
    rule blames the infrastructure. `sandbox` is the episode's, read only through the service's record."""
    failure = failure_of_tool(outcome)
    if failure is None:
        assert isinstance(outcome, ToolResult)
        return outcome
    infra = blame(failure, lost=lambda: sandbox_lost(sandbox), fresh=lambda: fresh.tools(timeout))
    if infra:
        raise InfrastructureFailure(f"infrastructure error in tool {call.name}: {infra}")
    shown = outcome.output if isinstance(outcome, ToolResult) and outcome.output else failure.detail
    if failure.kind.caused_by_arguments:
        return ToolResult(output=f"Error: {shown[-1000:]}", policy_error=f"tool {call.name}: {failure}"[:500])
    return ToolResult(
        output=f"Error: the tool failed with your arguments or on the state your actions left: {shown[-1000:]}",
        policy_error=f"tool {call.name}: {failure} (the harness's health check passes)"[:500],
    )


def verdict(recipe: Recipe, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
    """The recipe's verdict (`recipe.judge`) with a failure to give one attributed by the rule: unresolved
    with the reason, or `infra_error` only when the infrastructure is at fault (`RecipeBase.verify`)."""
    outcome = _caught(lambda: recipe.judge(sandbox, task, final_answer))
    failure = failure_of_verification(outcome)
    if failure is None:
        assert isinstance(outcome, VerifyResult)
        return outcome
    kept = outcome if isinstance(outcome, VerifyResult) else VerifyResult(resolved=False)
    fresh = FreshSandbox(sandbox.client, recipe.sandbox_spec(task), recipe, task)
    infra = blame(failure, lost=lambda: sandbox_lost(sandbox), fresh=fresh.verification)
    if infra:
        return kept.model_copy(update={"resolved": False, "infra_error": f"verification failed: {infra}"[:2000]})
    return kept.model_copy(
        update={
            "resolved": False,
            "infra_error": None,
            "reason": f"verification gave no verdict on the state the policy left "
            f"(the harness's health check passes): {failure}"[:2000],
        }
    )


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - freeing a health check's sandbox must not change its finding
        log.warning("cleaning up a fresh sandbox failed: %s", err)


def _caught(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - classified by failure_of_*
        return err


def _watched(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` or its exception, or a TimeoutError after `timeout` (the hung call is abandoned)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="health")
    try:
        return pool.submit(_caught, fn).result(timeout=timeout)
    except concurrent.futures.TimeoutError as err:
        return err
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "Failure",
    "FailureKind",
    "FreshSandbox",
    "InfrastructureFailure",
    "blame",
    "failure_of_tool",
    "failure_of_verification",
    "sandbox_lost",
    "tool_result",
    "verdict",
]
