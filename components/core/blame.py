"""Blame by control run: the one rule for whose failure a failed step is.

A step that failed on the agent's state (a verification run, a tool's own program) is the
infrastructure's only when

1. the same step, with the same limits, fails the same way on the task's pristine state (so nothing
   the policy did can be the cause), or
2. an independent health probe of the sandbox fails (the sandbox itself is broken).

Otherwise it is the policy's outcome: unresolved (or a policy error the model sees), with the reason.
"The same way" is the failure's kind (`Failure.kind`: an infrastructure error kind, `no_report`,
`exit 1`, ...), decided where the step ran, never read from message text.

Deviation from the wording of issue 27 ("infrastructure only when the same step on the pristine
snapshot does *not* fail the same way"): read literally, a verification run the agent's change breaks
(and the pristine one does not) would be the infrastructure's, which is the dodge the rule exists to
close; we take the reading that matches its purpose and its "otherwise it is the policy's outcome".

Recipes call `blame` where a step fails; they do not guess from exception types or messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Failure:
    """How a step failed: `kind` is compared between the run and its control; `detail` is for people."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def blame(failure: Failure, control: Callable[[], Failure | None],
          probe: Callable[[], str | None] | None = None) -> str | None:
    """The infrastructure's reason for `failure`, or None when it is the policy's outcome.

    `control()` runs the same step on the pristine state with the same limits and returns its Failure
    (None when it did not fail); `probe()` returns what an independent health check found broken
    (None when healthy). The probe runs first: a broken sandbox makes a control run meaningless."""
    if probe is not None:
        broken = probe()
        if broken:
            return f"{failure}; the sandbox's health probe failed: {broken}"
    seen = control()
    if seen is not None and seen.kind == failure.kind:
        return f"{failure}; the same step fails the same way on the pristine state ({seen})"
    return None


__all__ = ["Failure", "blame"]
