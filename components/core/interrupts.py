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
from typing import Callable, Iterator

_stop = threading.Event()
# A runner whose stages are child processes (`orchard run --kfp-local`) forwards a stop to them as this
# signal: a stop request like the first Ctrl-C, never counted as the second one (a Ctrl-C also reaches the
# stage directly, through the process group).
FORWARDED_STOP = signal.SIGUSR2
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
def stop_on_signals(
    on_force_exit: Callable[[], None] | None = None, on_stop: Callable[[int], None] | None = None
) -> Iterator[None]:
    """SIGINT/SIGTERM stop the run (see the module docstring); the previous handlers come back on exit.
    `on_stop(signum)` runs at the first signal (a runner whose stages are child processes forwards it).

    Outside the main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[int] = []  # a SIGINT/SIGTERM came (forwarded stops do not count)

    def forwarded(_signum: int, _frame: object) -> None:
        if not _stop.is_set():
            _reason[:] = [str(signal.SIGTERM)]  # the runner above was stopped
            _stop.set()

    def handle(signum: int, _frame: object) -> None:
        if first:  # the second signal: out now
            sys.stderr.write(
                f"\norchard: {signal.Signals(signum).name} again: exiting now, without cleaning up "
                "(the sandbox service deletes its sandboxes; MLflow runs stay RUNNING)\n"
            )
            sys.stderr.flush()
            try:
                if on_force_exit is not None:
                    on_force_exit()
            finally:
                os._exit(128 + signum)
        if not _stop.is_set():
            _reason[:] = [str(signum)]
        first[:] = [signum]
        _stop.set()
        sys.stderr.write(
            f"\norchard: {signal.Signals(signum).name}: stopping the run (ending the current stage, "
            "deleting its sandboxes); send it again to exit at once\n"
        )
        sys.stderr.flush()
        if on_stop is not None:
            on_stop(signum)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous[FORWARDED_STOP] = signal.signal(FORWARDED_STOP, forwarded)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop.clear()
        _reason.clear()


def exit_at_once_on_signals() -> None:
    """From now on SIGINT/SIGTERM end the process at once, with the message: for a CLI already on its way out
    after a stop (interpreter shutdown flushes MLflow's queues), where a second Ctrl-C would otherwise end in a
    KeyboardInterrupt traceback. Main thread only."""

    def handle(signum: int, _frame: object) -> None:
        sys.stderr.write(f"\norchard: {signal.Signals(signum).name} again: exiting now\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
