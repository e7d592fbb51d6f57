"""Episodes as MLflow traces: what the agent did, turn by turn, to read and filter in the MLflow UI.

One trace per episode, for a sample of them (`TraceConfig`): a root span `episode` (inputs: the task's prompt;
outputs: outcome, reason, final answer) with a child span per model turn (LLM: the text, its tokens, the
sampling settings, a logprob summary, a policy error), per tool call (TOOL: arguments, output, duration, a
policy or infrastructure error) and the verification (EVALUATOR: the test report and verifier). Each trace is
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

from components.core.schema import Step, Trajectory

log = logging.getLogger(__name__)

TAGS = ("orchard.task", "orchard.split", "orchard.stage", "orchard.policy", "orchard.outcome")


class TraceConfig(BaseModel):
    """Which episodes of a stage become MLflow traces."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Log sampled episodes as MLflow traces (False: none).")
    sample_rate: float = Field(0.25, ge=0.0, le=1.0,
                               description="Share of the episodes traced (chosen by trajectory id: reproducible).")
    max_per_stage: int = Field(100, ge=0, description="At most this many traces per stage (bounds the volume).")


def sampled(trajectories: list[Trajectory], config: TraceConfig) -> list[Trajectory]:
    """The episodes to trace: those whose id hashes below `sample_rate`, at most `max_per_stage`."""
    if not config.enabled:
        return []
    keep = [t for t in trajectories
            if int(hashlib.sha256(t.id.encode()).hexdigest()[:8], 16) < config.sample_rate * 16**8]
    return keep[:config.max_per_stage]


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


def _turn_attributes(step: Step, sampling: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"sampling.{k}": v for k, v in sampling.items()}
    if step.token_ids is not None:
        out["completion_tokens"] = len(step.token_ids)
    if step.logprobs:
        out.update({"logprob.mean": sum(step.logprobs) / len(step.logprobs), "logprob.min": min(step.logprobs),
                    "logprob.sum": sum(step.logprobs)})
    if step.policy_error:
        out["policy_error"] = step.policy_error
    return out


def log_trace(trajectory: Trajectory, *, stage: str, run_id: str, experiment_id: str,
              sampling: dict[str, Any] | None = None) -> None:
    """One episode as one MLflow trace under `run_id` (see the module docstring)."""
    import mlflow
    from mlflow.entities import SpanType

    end = trajectory.created_at
    start = end - timedelta(seconds=trajectory.wall_seconds)
    tags = dict(zip(TAGS, (trajectory.task_id, trajectory.split, stage, trajectory.policy_id,
                           str(trajectory.outcome.value))))
    user = next((s.content for s in trajectory.steps if s.role == "user"), "")
    root = mlflow.start_span_no_context(
        "episode", span_type=SpanType.AGENT, inputs={"task": trajectory.task_id, "prompt": user},
        attributes={"trajectory_id": trajectory.id, "status": trajectory.status.value,
                    "prompt_tokens": trajectory.prompt_tokens, "completion_tokens": trajectory.completion_tokens,
                    "attempt": trajectory.attempt, "reward": trajectory.reward},
        tags=tags, metadata={"mlflow.sourceRun": run_id}, experiment_id=experiment_id, start_time_ns=_ns(start))
    cursor = start
    for step in trajectory.steps:
        if step.role == "assistant":
            begin = step.started_at or cursor
            finish = begin + timedelta(seconds=step.duration_seconds or 0.0)
            span = mlflow.start_span_no_context(
                f"turn {step.index}", span_type=SpanType.LLM, parent_span=root, inputs={"step": step.index},
                attributes=_turn_attributes(step, sampling or {}), start_time_ns=_ns(begin))
            span.end(outputs={"text": step.content,
                              "tool_call": step.tool_call.model_dump(mode="json") if step.tool_call else None},
                     end_time_ns=_ns(finish))
        elif step.role == "tool":
            duration = step.duration_seconds or 0.0
            finish = step.started_at or cursor  # a tool step is stamped when its result arrives
            begin = finish - timedelta(seconds=duration)
            attributes = {"duration_seconds": duration}
            attributes.update({k: v for k, v in (("policy_error", step.policy_error),
                                                 ("infra_error", step.infra_error)) if v})
            span = mlflow.start_span_no_context(
                step.tool_name or "tool", span_type=SpanType.TOOL, parent_span=root,
                inputs=_arguments(trajectory, step), attributes=attributes, start_time_ns=_ns(begin))
            span.end(outputs={"output": step.content}, end_time_ns=_ns(finish))
        else:
            continue
        cursor = max(cursor, finish)
    report = trajectory.test_report.model_dump(mode="json") if trajectory.test_report else None
    verification = mlflow.start_span_no_context(
        "verification", span_type=SpanType.EVALUATOR, parent_span=root, inputs={"final_answer": trajectory.final_answer},
        attributes={"verifier": json.dumps(trajectory.verification.model_dump(mode="json"))
                    if trajectory.verification else ""}, start_time_ns=_ns(min(cursor, end)))
    verification.end(outputs={"outcome": trajectory.outcome.value, "reason": trajectory.outcome_reason,
                              "test_report": report}, end_time_ns=_ns(end))
    root.end(outputs={"outcome": trajectory.outcome.value, "reason": trajectory.outcome_reason,
                      "final_answer": trajectory.final_answer}, end_time_ns=_ns(end))


def _arguments(trajectory: Trajectory, step: Step) -> dict[str, Any]:
    """The arguments of the call a tool step answers."""
    for s in trajectory.steps:
        if s.tool_call is not None and s.tool_call.id == step.tool_call_id:
            return {"name": s.tool_call.name, "arguments": s.tool_call.arguments}
    return {"name": step.tool_name}


def log_episode_traces(trajectories: list[Trajectory], config: TraceConfig, *, stage: str,
                       sampling: dict[str, Any] | None = None, step: int | None = None) -> int:
    """The sampled episodes as traces under the active MLflow run (none without one); returns how many and logs
    it as `traces_logged` (at `step`, for a stage that traces batch by batch)."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return 0
    logged = 0
    for trajectory in sampled(trajectories, config):
        try:
            log_trace(trajectory, stage=stage, run_id=run.info.run_id, experiment_id=run.info.experiment_id,
                      sampling=sampling)
            logged += 1
        except Exception as err:  # noqa: BLE001 - a trace is a view of the episode, never a reason to lose it
            log.warning("could not log trajectory %s as a trace: %s", trajectory.id, err)
    mlflow.flush_trace_async_logging()
    mlflow.log_metric("traces_logged", float(logged), step=step)
    return logged
