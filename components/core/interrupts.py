"""Stopping a run on Ctrl-C or SIGTERM: one run-wide stop request, honoured where the work is.

`stop_on_signals()` (the local runner, `orchard run`) installs handlers for SIGINT and SIGTERM in the main
thread, whatever their disposition was: a shell starts background jobs with SIGINT ignored, and Python then
never raises KeyboardInterrupt, so `kill -INT -<pgid>` (or Ctrl-C in a CI runner's shell) used to be lost.

- The first signal only records the stop request. The work raises `RunInterrupted` at its next safe point
  (`raise_if_stopping()`): an episode before each turn (so a thread pool of episodes drains in one turn, and
  each episode deletes its sandbox on the way out), a training loop between optimizer steps
  (`trainer_callback()`), the runner between stages. The runner's own handlers then stop the sandbox service
  and close the MLflow runs (KILLED). Raising from the signal handler itself was tried and dropped: it lands
  anywhere, e.g. inside an MLflow sqlite transaction, whose lock then fails every later write.
- A second signal does not wait for any of that: it runs the `on_force_exit` callback (the local runner asks
  its embedded service to stop, which deletes its sandboxes without us) and leaves with `os._exit`.

`RunInterrupted` is a BaseException, like KeyboardInterrupt: the `except Exception` boundaries that turn a
failing episode into data (an infra_error trajectory) must not swallow a stop request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

_stop = threading.Event()
# A second signal this soon after the first is the same stop arriving twice (a Ctrl-C reaches the whole
# process group, and a parent runner forwards it to its stage processes too), not a request to exit at once.
DUPLICATE_SECONDS = 0.3
_reason: list[str] = []


class RunInterrupted(BaseException):
    """The run was asked to stop (Ctrl-C, SIGTERM): not a failure of the code that was running."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by this signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def stopping() -> bool:
    """Whether a stop was requested in this process."""
    return _stop.is_set()


def raise_if_stopping() -> None:
    """Raise `RunInterrupted` in this thread when a stop was requested (episode loops call it each turn)."""
    if _stop.is_set():
        raise RunInterrupted(int(_reason[0]) if _reason else signal.SIGINT)


def trainer_callback():
    """A transformers `TrainerCallback` that stops training between optimizer steps when a stop was requested."""
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise_if_stopping()

        on_substep_end = on_step_end

    return StopOnSignal()


@contextlib.contextmanager
def stop_on_signals(on_force_exit: Callable[[], None] | None = None,
                    on_stop: Callable[[int], None] | None = None) -> Iterator[None]:
    """SIGINT/SIGTERM stop the run (see the module docstring); the previous handlers come back on exit.
    `on_stop(signum)` runs at the first signal (a runner whose stages are child processes forwards it).

    Outside the main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def handle(signum: int, _frame: object) -> None:
        if _stop.is_set() and time.monotonic() - first[0] < DUPLICATE_SECONDS:
            return  # the same stop delivered twice (to the process group and forwarded by a parent runner)
        if _stop.is_set():  # the second signal: out now
            sys.stderr.write(f"\norchard: {signal.Signals(signum).name} again: exiting now, without cleaning up "
                             "(the sandbox service deletes its sandboxes; MLflow runs stay RUNNING)\n")
            sys.stderr.flush()
            try:
                if on_force_exit is not None:
                    on_force_exit()
            finally:
                os._exit(128 + signum)
        _reason[:] = [str(signum)]
        first[:] = [time.monotonic()]
        _stop.set()
        sys.stderr.write(f"\norchard: {signal.Signals(signum).name}: stopping the run (ending the current stage, "
                         "deleting its sandboxes); send it again to exit at once\n")
        sys.stderr.flush()
        if on_stop is not None:
            on_stop(signum)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop.clear()
        _reason.clear()
