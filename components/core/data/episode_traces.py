"""Episodes as MLflow traces: what the agent did, turn by turn, to read and filter in the MLflow UI.

One trace per episode, for a sample of them (`TraceConfig`): a root span `episode` (inputs: the task's prompt;
outputs: the reward, outcome, reason, final answer) with a child span per model turn (LLM, named turn 1, 2, 3:
the text, its tokens, the sampling settings, a logprob summary, a policy error), per tool call (TOOL: arguments,
output, duration, a policy or infrastructure error) and the verification (EVALUATOR: the reward, the test
report and verifier). The episode's reward (1 resolved, 0 unresolved; none for an infrastructure error, which
is never a reward) is also the trace's `reward` assessment, a numeric column of the traces table. Multi-line
text (a diff, a tool's output) is shown as a fenced block: the UI renders values as Markdown (`as_code`). Each trace is
tagged `orchard.task`, `orchard.split`, `orchard.stage`, `orchard.policy` and `orchard.outcome` and linked to
the stage's MLflow run, so "unresolved episodes of evaluate-rl on task X" is the trace search
`tags.orchard.stage = 'evaluate-rl' AND tags.orchard.outcome = 'unresolved' AND tags.orchard.task = 'X'`.

Traces are built after the episode from its `Trajectory` (times from its steps), in the stage's own thread:
the harness's hot path is untouched and a tracing failure costs a warning, never an episode. The sample is a
pure function of the trajectory ids, so two runs of the same episodes trace the same ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import Step, Trajectory

log = logging.getLogger(__name__)

TAGS = ("orchard.task", "orchard.split", "orchard.stage", "orchard.policy", "orchard.outcome")  # and orchard.reward


class TraceConfig(BaseModel):
    """Which episodes of a stage become MLflow traces."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Log sampled episodes as MLflow traces (False: none).")
    sample_rate: float = Field(
        0.25, ge=0.0, le=1.0, description="Share of the episodes traced (chosen by trajectory id: reproducible)."
    )
    max_per_stage: int = Field(100, ge=0, description="At most this many traces per stage (bounds the volume).")


def sampled(trajectories: list[Trajectory], config: TraceConfig) -> list[Trajectory]:
    """The episodes to trace: those whose id hashes below `sample_rate`, at most `max_per_stage`."""
    if not config.enabled:
        return []
    keep = [
        t for t in trajectories if int(hashlib.sha256(t.id.encode()).hexdigest()[:8], 16) < config.sample_rate * 16**8
    ]
    return keep[: config.max_per_stage]


def as_code(text: str | None) -> str | None:
    """Multi-line text as a fenced block: the MLflow UI renders span inputs and outputs as Markdown, where a diff's
    `- old` lines become bullets and `+` lines lose their sign. A diff is fenced as `diff` (its lines keep their
    signs and colours), any other multi-line text as plain code; one-liners and None pass through."""
    if not text or "\n" not in text.strip():
        return text
    fence = "~~~~" if "```" in text else "```"
    looks_like_diff = text.startswith(("diff --git", "--- ", "Index: ")) or "\n@@ " in text
    return f"{fence}{'diff' if looks_like_diff else 'text'}\n{text.rstrip()}\n{fence}"


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


def _turn_attributes(step: Step, sampling: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"sampling.{k}": v for k, v in sampling.items()}
    if step.token_ids is not None:
        out["completion_tokens"] = len(step.token_ids)
    if step.logprobs:
        out.update(
            {
                "logprob.mean": sum(step.logprobs) / len(step.logprobs),
                "logprob.min": min(step.logprobs),
                "logprob.sum": sum(step.logprobs),
            }
        )
    if step.policy_error:
        out["policy_error"] = step.policy_error
    return out


def log_trace(
    trajectory: Trajectory, *, stage: str, run_id: str, experiment_id: str, sampling: dict[str, Any] | None = None
) -> str:
    """One episode as one MLflow trace under `run_id` (see the module docstring); returns the trace id."""
    import mlflow
    from mlflow.entities import SpanType

    end = trajectory.created_at
    start = end - timedelta(seconds=trajectory.wall_seconds)
    tags = dict(
        zip(TAGS, (trajectory.task_id, trajectory.split, stage, trajectory.policy_id, str(trajectory.outcome.value)))
    )
    user = next((s.content for s in trajectory.steps if s.role == "user"), "")
    tags["orchard.reward"] = "none (infrastructure error)" if trajectory.reward is None else f"{trajectory.reward:g}"
    # Span attributes are stored JSON-encoded, any JSON value (mlflow annotates them as str only).
    episode_attributes: dict[str, Any] = {
        "trajectory_id": trajectory.id,
        "status": trajectory.status.value,
        "prompt_tokens": trajectory.prompt_tokens,
        "completion_tokens": trajectory.completion_tokens,
        "attempt": trajectory.attempt,
        "reward": trajectory.reward,
    }
    root = mlflow.start_span_no_context(
        "episode",
        span_type=SpanType.AGENT,
        inputs={"task": trajectory.task_id, "prompt": user},
        attributes=episode_attributes,
        tags=tags,
        metadata={"mlflow.sourceRun": run_id},
        experiment_id=experiment_id,
        start_time_ns=_ns(start),
    )
    cursor = start
    turn = 0  # model turns counted 1, 2, 3 (step indices also count the prompt and the tool results)
    for step in trajectory.steps:
        if step.role == "assistant":
            turn += 1
            begin = step.started_at or cursor
            finish = begin + timedelta(seconds=step.duration_seconds or 0.0)
            span = mlflow.start_span_no_context(
                f"turn {turn}",
                span_type=SpanType.LLM,
                parent_span=root,
                inputs={"turn": turn, "step": step.index},
                attributes=_turn_attributes(step, sampling or {}),
                start_time_ns=_ns(begin),
            )
            span.end(
                outputs={
                    "text": step.content,
                    "tool_call": step.tool_call.model_dump(mode="json") if step.tool_call else None,
                },
                end_time_ns=_ns(finish),
            )
        elif step.role == "tool":
            duration = step.duration_seconds or 0.0
            finish = step.started_at or cursor  # a tool step is stamped when its result arrives
            begin = finish - timedelta(seconds=duration)
            attributes: dict[str, Any] = {"duration_seconds": duration}
            attributes.update(
                {k: v for k, v in (("policy_error", step.policy_error), ("infra_error", step.infra_error)) if v}
            )
            span = mlflow.start_span_no_context(
                step.tool_name or "tool",
                span_type=SpanType.TOOL,
                parent_span=root,
                inputs=_arguments(trajectory, step),
                attributes=attributes,
                start_time_ns=_ns(begin),
            )
            span.end(outputs={"output": as_code(step.content)}, end_time_ns=_ns(finish))
        else:
            continue
        cursor = max(cursor, finish)
    report = trajectory.test_report.model_dump(mode="json") if trajectory.test_report else None
    verification = mlflow.start_span_no_context(
        "verification",
        span_type=SpanType.EVALUATOR,
        parent_span=root,
        inputs={"final_answer": as_code(trajectory.final_answer)},
        attributes={
            "verifier": json.dumps(trajectory.verification.model_dump(mode="json")) if trajectory.verification else ""
        },
        start_time_ns=_ns(min(cursor, end)),
    )
    verification.end(
        outputs={
            "reward": trajectory.reward,
            "outcome": trajectory.outcome.value,
            "reason": trajectory.outcome_reason,
            "test_report": report,
        },
        end_time_ns=_ns(end),
    )
    root.end(
        outputs={
            "reward": trajectory.reward,
            "outcome": trajectory.outcome.value,
            "reason": trajectory.outcome_reason,
            "final_answer": as_code(trajectory.final_answer),
        },
        end_time_ns=_ns(end),
    )
    return root.trace_id


def log_reward(trace_id: str, trajectory: Trajectory, stage: str) -> None:
    """The episode's reward as the trace's numeric `reward` assessment (a column of the traces table, sortable and
    filterable); nothing for an infrastructure error. The trace must be stored already (after a flush)."""
    import mlflow
    from mlflow.entities import AssessmentSource

    if trajectory.reward is not None:
        mlflow.log_feedback(
            trace_id=trace_id,
            name="reward",
            value=float(trajectory.reward),
            source=AssessmentSource(source_type="CODE", source_id=f"orchard.verifier:{stage}"),
            rationale=trajectory.outcome_reason or trajectory.outcome.value,
        )


def _arguments(trajectory: Trajectory, step: Step) -> dict[str, Any]:
    """The arguments of the call a tool step answers."""
    for s in trajectory.steps:
        if s.tool_call is not None and s.tool_call.id == step.tool_call_id:
            return {"name": s.tool_call.name, "arguments": s.tool_call.arguments}
    return {"name": step.tool_name}


def log_episode_traces(
    trajectories: list[Trajectory],
    config: TraceConfig,
    *,
    stage: str,
    sampling: dict[str, Any] | None = None,
    step: int | None = None,
) -> int:
    """The sampled episodes as traces under the active MLflow run (none without one); returns how many and logs
    it as `traces_logged` (at `step`, for a stage that traces batch by batch)."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return 0
    logged: list[tuple[str, Trajectory]] = []
    for trajectory in sampled(trajectories, config):
        try:
            logged.append(
                (
                    log_trace(
                        trajectory,
                        stage=stage,
                        run_id=run.info.run_id,
                        experiment_id=run.info.experiment_id,
                        sampling=sampling,
                    ),
                    trajectory,
                )
            )
        except Exception as err:  # noqa: BLE001 - a trace is a view of the episode, never a reason to lose it
            log.warning("could not log trajectory %s as a trace: %s", trajectory.id, err)
    mlflow.flush_trace_async_logging()
    for trace_id, trajectory in logged:
        try:
            log_reward(trace_id, trajectory, stage)
        except Exception as err:  # noqa: BLE001 - as above
            log.warning("could not log the reward of trace %s: %s", trace_id, err)
    mlflow.log_metric("traces_logged", float(len(logged)), step=step)
    return len(logged)
