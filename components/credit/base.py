"""The estimator interface of the credit stage: a trajectory in, a value curve V(s_0..s_T) out.

V(s_0) is the probability of resolving the task before the first assistant action, V(s_t) after the
t-th assistant step (including the environment's response to it). Both estimators (LLM judge,
Monte-Carlo continuations) return the same record, so segment selection never knows which ran.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.core.data.schema import Step, Task, Trajectory


class CreditEstimationError(RuntimeError):
    """The estimator could not produce a value curve for a trajectory (it is kept without credit)."""


class ValueEstimate(BaseModel):
    """A value curve over the assistant steps of one trajectory."""

    model_config = ConfigDict(extra="forbid")
    trajectory_id: str
    estimator: str = Field(description="Which estimator produced it (judge, monte_carlo).")
    step_indices: list[int] = Field(description="Step.index of the T assistant steps, in order.")
    values: list[float] = Field(description="V(s_0..s_T): T+1 probabilities in [0, 1].")
    stderr: list[float | None] = Field(description="Standard error per value (None when not a sample mean).")
    samples: list[int] = Field(description="Continuations behind each value (0 = interpolated or judged).")
    credit_stderr: list[float | None] | None = Field(
        None,
        description="Standard error of each credit c_t = V(s_t) - V(s_{t-1}), t = 1..T (paired "
        "continuations); None when the estimator cannot give one (judge).",
    )

    @model_validator(mode="after")
    def _shapes(self) -> "ValueEstimate":
        n = len(self.step_indices) + 1
        if not (len(self.values) == len(self.stderr) == len(self.samples) == n):
            raise ValueError(f"a curve over {n - 1} assistant steps needs {n} values, stderrs and sample counts")
        if self.credit_stderr is not None and len(self.credit_stderr) != n - 1:
            raise ValueError(f"a curve over {n - 1} assistant steps needs {n - 1} credit standard errors")
        if any(not 0.0 <= v <= 1.0 for v in self.values):
            raise ValueError(f"values must be probabilities in [0, 1], got {self.values}")
        return self


@runtime_checkable
class ValueEstimator(Protocol):
    name: str

    def estimate(self, trajectory: Trajectory, task: Task) -> ValueEstimate:
        """V(s_0..s_T) for the trajectory's assistant steps; raises CreditEstimationError."""
        ...


def assistant_positions(trajectory: Trajectory) -> list[int]:
    """Positions (in trajectory.steps) of the assistant steps."""
    return [i for i, s in enumerate(trajectory.steps) if s.role == "assistant"]


def state_end(trajectory: Trajectory, position: int) -> int:
    """Exclusive end of the prefix that is the state after the assistant step at `position`: the step
    itself plus the environment's responses to it (tool / user steps up to the next assistant step)."""
    steps: list[Step] = trajectory.steps
    end = position + 1
    while end < len(steps) and steps[end].role != "assistant":
        end += 1
    return end


def initial_end(trajectory: Trajectory) -> int:
    """Exclusive end of the prefix before the first assistant action (system + task prompt)."""
    positions = assistant_positions(trajectory)
    return positions[0] if positions else len(trajectory.steps)
