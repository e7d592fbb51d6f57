"""LLM-judge value estimator (as published): a teacher reads the whole trajectory and the final test
result and states, after every assistant step, the probability that the task will be solved from there.

The answer must be one JSON object matching `JudgeAnswer` exactly: one entry per assistant step, each
probability in [0, 1]. Anything else (prose, a missing or extra step, a number out of range) is
rejected and the judge is asked again with the reason, up to `max_attempts`; transport failures and
5xx/429 answers are retried with backoff. Talks to any OpenAI-compatible `/chat/completions`.
"""

from __future__ import annotations

import json

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from components.credit.base import CreditEstimationError, ValueEstimate
from components.core.data.schema import Task, Trajectory
from components.core.policy.endpoint import ChatEndpoint, PolicyError, PolicyUnavailableError
from sandbox_service.retry import Backoff

_BACKOFF = Backoff(first=0.25, cap=8.0)

_SYSTEM = (
    "You review an agent's attempt at a software task after the fact. You see every step and the final "
    "hidden-test result. For the state before the first action and after each assistant step, estimate the "
    "probability that a competent agent continuing from that state would resolve the task. Answer with one "
    "JSON object and nothing else: "
    '{"initial": <p>, "steps": [{"step": <step number>, "p_resolve": <p>}, ...]} '
    "with one entry for every assistant step number listed, each p between 0 and 1."
)


class JudgeConfig(BaseModel):
    """Where the judge model lives and how hard to insist on a well-formed answer."""

    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://vllm:8000/v1.")
    model: str = Field(description="Model name sent in the request.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Env var holding the API key (None = no auth).")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature of the judge.")
    max_tokens: int = Field(1024, ge=16, description="Cap on the judge's answer length.")
    timeout_seconds: float = Field(120.0, gt=0, description="HTTP timeout per request.")
    max_attempts: int = Field(3, ge=1, description="Answers requested before giving up on malformed output.")
    http_retries: int = Field(3, ge=0, description="Retries of a failed request (transport error, 429, 5xx).")
    json_mode: bool = Field(True, description="Send response_format={'type': 'json_object'}.")
    max_observation_chars: int = Field(2000, ge=100, description="Tool output kept per step in the transcript.")


class JudgedStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int = Field(description="The assistant step number from the transcript.")
    p_resolve: float = Field(ge=0.0, le=1.0, description="P(resolve) after this step.")


class JudgeAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    initial: float = Field(ge=0.0, le=1.0, description="P(resolve) before the first action.")
    steps: list[JudgedStep]


def transcript(trajectory: Trajectory, task: Task, max_chars: int) -> tuple[str, list[int]]:
    """The review prompt and the assistant step numbers the answer must cover."""
    lines = [f"TASK:\n{task.prompt}\n", "TRAJECTORY:"]
    numbers: list[int] = []
    for step in trajectory.steps:
        if step.role == "system":
            continue
        if step.role == "user" and not numbers:
            continue  # the task prompt, already shown
        content = step.content if len(step.content) <= max_chars else step.content[:max_chars] + " [...]"
        if step.role == "assistant":
            numbers.append(step.index)
            lines.append(f"[step {step.index}] assistant:\n{content}")
        else:
            lines.append(f"  ({step.role} response):\n{content}")
    report = trajectory.test_report
    result = f"FINAL RESULT: {trajectory.outcome.value}"
    if trajectory.outcome_reason:
        result += f" ({trajectory.outcome_reason})"
    if report is not None:
        result += f"; hidden tests passed={report.passed} failed={report.failed} errors={report.errors}"
        if report.output:
            result += f"\n{report.output[-max_chars:]}"
    lines.append(result)
    lines.append(f"ASSISTANT STEP NUMBERS: {numbers}")
    return "\n".join(lines), numbers


def parse_answer(content: str, expected_steps: list[int]) -> JudgeAnswer:
    """Validate the judge's text; raises ValueError saying what was wrong (fed back to the judge)."""
    text = content.strip()
    if text.startswith("```"):  # a fenced block is formatting, not a different answer
        text = text.strip("`")
        text = text[4:] if text.startswith("json") else text
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON object ({err.msg})") from None
    try:
        answer = JudgeAnswer.model_validate(payload)
    except ValidationError as err:
        raise ValueError(f"does not match the schema: {err.errors()[0]['msg']} at {err.errors()[0]['loc']}") from None
    got = [s.step for s in answer.steps]
    if sorted(got) != sorted(expected_steps) or len(set(got)) != len(got):
        raise ValueError(f"steps must be exactly {expected_steps}, got {got}")
    return answer


class LLMJudgeEstimator:
    name = "judge"

    def __init__(self, config: JudgeConfig, transport: httpx.BaseTransport | None = None) -> None:
        self.config = config
        # The one endpoint client (components/core/policy/endpoint.py): key, timeout, retries on its schedule.
        self.endpoint = ChatEndpoint(
            config.base_url,
            api_key_env=config.api_key_env,
            timeout_seconds=config.timeout_seconds,
            max_retries=config.http_retries,
            backoff=_BACKOFF,
            transport=transport,
        )
        self.rejected_answers = 0

    def close(self) -> None:
        self.endpoint.close()

    def _complete(self, messages: list[dict]) -> str:
        body = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if self.config.json_mode:
            body["response_format"] = {"type": "json_object"}
        try:
            data = self.endpoint.complete(body)
            return data["choices"][0]["message"]["content"] or ""
        except PolicyUnavailableError as err:
            raise CreditEstimationError(
                f"judge endpoint {self.config.base_url} unavailable after retries: {err}"
            ) from err
        except (PolicyError, KeyError, IndexError, TypeError) as err:
            raise CreditEstimationError(f"judge endpoint {self.config.base_url} answered badly: {err}") from err

    def estimate(self, trajectory: Trajectory, task: Task) -> ValueEstimate:
        prompt, numbers = transcript(trajectory, task, self.config.max_observation_chars)
        messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
        problems = []
        for _ in range(self.config.max_attempts):
            content = self._complete(messages)
            try:
                answer = parse_answer(content, numbers)
            except ValueError as err:
                self.rejected_answers += 1
                problems.append(str(err))
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": f"Rejected: your answer {err}. Reply with the JSON object only."},
                ]
                continue
            by_step = {s.step: s.p_resolve for s in answer.steps}
            return ValueEstimate(
                trajectory_id=trajectory.id,
                estimator=self.name,
                step_indices=numbers,
                values=[answer.initial] + [by_step[n] for n in numbers],
                stderr=[None] * (len(numbers) + 1),
                samples=[0] * (len(numbers) + 1),
            )
        raise CreditEstimationError(
            f"judge gave {self.config.max_attempts} malformed answers for {trajectory.id}: {problems}"
        )
