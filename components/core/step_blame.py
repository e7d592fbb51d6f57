"""The blame rule (`blame.py`) applied to the harness's own steps: a tool call and the verification.

Any step that ends in an infrastructure outcome — a tool's `infra_error`, a sandbox-service error raised
in the tool, the tool watchdog, an exception of the recipe's code, a verification that could not give a
verdict — is the infrastructure's only when a health probe of the episode's sandbox fails, or the same
step fails the same way on a fresh sandbox set up from the task's pristine state with the same limits.
Otherwise the policy caused it: a tool call becomes a policy error the model sees, a verification an
unresolved verdict with the reason. Recipes no longer decide this by guessing from messages; a recipe
that has a cheaper control of its own (Claw replays a call on a host-side world) still goes through the
same rule.

"The same way" is a `Failure.kind` decided here from the failure's type, never from its message text.
A control whose fresh sandbox cannot be created or set up raises `ControlUnavailable`: with no control,
nothing shows the policy caused the failure, so the caller counts it as the infrastructure's.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

import httpx

from components.core.blame import Failure
from components.core.recipe_base import RecipeBase, ToolResult, VerifyResult
from components.core.schema import Task, ToolCall
from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import SandboxServiceError
from sandbox_service.models import SandboxCreate

PROBE_TIMEOUT_SECONDS = 30.0


class ControlUnavailable(Exception):
    """The control run's pristine sandbox could not be made: the failure stays the infrastructure's."""


def failure_of_tool(outcome: ToolResult | BaseException) -> Failure | None:
    """How a tool call failed (None: it did not). A policy error is the tool working as meant."""
    if isinstance(outcome, concurrent.futures.TimeoutError):
        return Failure("TIMEOUT (tool watchdog)", "the tool call did not return in time")
    if isinstance(outcome, SandboxServiceError):
        return Failure(f"sandbox service {outcome.infra_error or outcome.code}", str(outcome)[:300])
    if isinstance(outcome, httpx.HTTPError):
        return Failure(f"transport {type(outcome).__name__}", str(outcome)[:300])
    if isinstance(outcome, BaseException):
        return Failure(f"tool raised {type(outcome).__name__}", str(outcome)[:300])
    if outcome.infra_error:
        return Failure("tool infrastructure error", str(outcome.infra_error)[:300])
    return None


def failure_of_verification(outcome: VerifyResult | BaseException) -> Failure | None:
    """How a verification failed to give a verdict (None: it gave one, resolved or not)."""
    if isinstance(outcome, BaseException):
        return failure_of_tool(outcome)
    if outcome.infra_error:
        return Failure("verification infrastructure error", str(outcome.infra_error)[:300])
    return None


def probe(sandbox: Sandbox) -> str | None:
    """An independent health check of the episode's sandbox: what is broken, or None when healthy."""
    try:
        res = sandbox.exec(["true"], timeout=PROBE_TIMEOUT_SECONDS)
    except (SandboxServiceError, httpx.HTTPError) as err:
        return f"`true` could not run: {type(err).__name__}: {err}"[:300]
    return None if res.ok else f"`true` gave {res.outcome.value} ({res.infra_error or res.exit_code})"


class PristineControl:
    """Runs one step again on a fresh sandbox set up from the task's pristine state (same spec, same
    setup, same limits), then deletes it."""

    def __init__(self, client: SandboxClient, spec: SandboxCreate, recipe: RecipeBase, task: Task,
                 wait_seconds: float):
        self.client, self.spec, self.recipe, self.task, self.wait_seconds = client, spec, recipe, task, wait_seconds

    def run(self, step: Callable[[Sandbox], Failure | None]) -> Failure | None:
        spec = self.spec.model_copy(update={"from_snapshot": None})
        try:
            sandbox = self.client.create(spec, wait_timeout=self.wait_seconds)
        except Exception as err:
            raise ControlUnavailable(f"could not create the control sandbox: {type(err).__name__}: {err}") from err
        try:
            try:
                self.recipe.setup(sandbox, self.task)
            except Exception as err:
                raise ControlUnavailable(f"could not set up the control sandbox: {type(err).__name__}: {err}") from err
            return step(sandbox)
        finally:
            try:
                self.recipe.release(sandbox)
            finally:
                try:
                    sandbox.delete()
                except Exception:  # the reaper collects it; the verdict of the control stands
                    pass

    def tool(self, call: ToolCall, timeout: float) -> Failure | None:
        """The same tool call, under the same watchdog, on the pristine state."""
        return self.run(lambda sandbox: failure_of_tool(_watched(
            lambda: self.recipe.execute_tool(sandbox, self.task, call), timeout)))

    def verification(self, final_answer: str | None) -> Failure | None:
        """The same verification (the same final answer) of the pristine state."""
        return self.run(lambda sandbox: failure_of_verification(_caught(
            lambda: self.recipe.verify(sandbox.verifying(), self.task, final_answer))))


def _caught(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as err:  # compared by kind with the episode's own failure
        return err


def _watched(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` or its exception, or a TimeoutError after `timeout` (the hung call is abandoned)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
    try:
        return pool.submit(_caught, fn).result(timeout=timeout)
    except concurrent.futures.TimeoutError as err:
        return err
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ControlUnavailable", "PristineControl", "failure_of_tool", "failure_of_verification", "probe"]
