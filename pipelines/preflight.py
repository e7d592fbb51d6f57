"""What is checked before the first stage runs, so that a run fails in seconds and in one line, not minutes in.

Checks that need no I/O are validators of the configs themselves, so `orchard config show` refuses them too
(a teacher or judge without its endpoint settings: `DistillConfig`, `TeacherConfig`, `EvalConfig`,
`CreditConfig`; imported tasks without a teacher that can solve them: `PipelineConfig`). This module holds
the checks that need more than the config:
- `preflight`: every OpenAI-compatible endpoint the config names answers one cheap request (`GET
  <base_url>/models`, no retries) and serves the model the config asks for. The local runner calls it before
  it starts anything, the cluster's start step before it opens the MLflow parent run.
- `check_model`, right after init-policy (it needs the model's tokenizer, which the tiny model trains there),
  seconds into the run and before any episode: the template renders a two-turn tool conversation
  append-only (`check_template`), and the length limits leave room for the first prompt (system prompt, tools,
  task) plus one turn (`check_lengths`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import httpx

from pipelines.config import PipelineConfig


class PreflightError(ValueError):
    """A setting that cannot work, found before any stage ran: the message says what to change."""


class Endpoint(NamedTuple):
    where: str  # the config field, e.g. "distill.openai"
    base_url: str
    model: str
    api_key_env: str | None


def endpoints(config: PipelineConfig) -> list[Endpoint]:
    """Every endpoint some stage of this run will call."""
    found: list[tuple[str, object]] = []
    if config.distill.teacher == "openai":
        found.append(("distill.openai", config.distill.openai))
    for name in ("evaluate_teacher", "evaluate"):
        section = getattr(config, name)
        if section.policy == "openai":
            found.append((f"{name}.endpoint", section.endpoint))
    if config.credit.estimator == "judge":
        found.append(("credit.judge", config.credit.judge))
    elif config.credit.monte_carlo.teacher is not None and config.credit.monte_carlo.teacher.kind == "openai":
        found.append(("credit.monte_carlo.teacher.endpoint", config.credit.monte_carlo.teacher.endpoint))
    return [Endpoint(where, s.base_url, s.model, s.api_key_env) for where, s in found]


def check_endpoint(endpoint: Endpoint, timeout: float = 10.0) -> None:
    """One `GET /models`: the endpoint answers, takes the key and serves the model (raises PreflightError)."""
    where, url = endpoint.where, endpoint.base_url.rstrip("/")
    headers = {}
    if endpoint.api_key_env and os.environ.get(endpoint.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[endpoint.api_key_env]}"
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        raise PreflightError(f"{where}: {url} does not answer ({type(err).__name__}: {err}); start the endpoint "
                             f"or fix {where}.base_url") from None
    if response.status_code in (401, 403):
        key = f"${endpoint.api_key_env}" if endpoint.api_key_env else "no key (api_key_env is None)"
        raise PreflightError(f"{where}: {url} refused the request ({response.status_code}) with {key}; put the "
                             f"endpoint's key in {where}.api_key_env's variable")
    if response.status_code == 404:  # an endpoint without the models list: it answered, that is all we can ask
        return
    if response.status_code >= 400:
        raise PreflightError(f"{where}: {url}/models answered {response.status_code} "
                             f"({response.text[:200]!r}); fix the endpoint or {where}.base_url")
    try:
        served = [m["id"] for m in response.json().get("data", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return  # not an OpenAI models list: the endpoint answered
    if served and endpoint.model not in served:
        raise PreflightError(f"{where}: {url} serves {', '.join(served[:5])}, not {endpoint.model!r}; "
                             f"set {where}.model to one of them")


def preflight(config: PipelineConfig) -> None:
    """The network checks of a run's config (see the module docstring); raises PreflightError."""
    for endpoint in endpoints(config):
        check_endpoint(endpoint)


def _first_episode(config: PipelineConfig, tasks_dir: Path, model_dir: Path):
    """(tokenizer, tool format, recipe, the first steps of an episode on a training task) in the trained
    model's template and tool format."""
    from components.core.harness import initial_steps
    from components.core.modeling import load_tokenizer
    from components.core.rendering import chat_format
    from components.core.store import TaskStore
    from components.recipes import get_recipe

    tokenizer = load_tokenizer(model_dir)
    fmt = chat_format(tokenizer, None if config.sft.tool_format == "auto" else config.sft.tool_format).tool_format
    tasks = TaskStore(tasks_dir).read()
    task = next((t for t in tasks if t.split == "train"), tasks[0])
    recipe = get_recipe(config.recipe, **config.provision.recipe_options)
    return tokenizer, fmt, recipe, task, initial_steps(task, recipe, fmt)


def prompt_tokens(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> int:
    """Tokens of an episode's first prompt (system prompt, tools, the first task) in the trained model's
    template and tool format: what every sample, rollout and evaluation turn starts with."""
    from components.core.rendering import render_prompt, steps_as_messages

    tokenizer, fmt, recipe, _, steps = _first_episode(config, tasks_dir, model_dir)
    return len(render_prompt(steps_as_messages(steps), tokenizer, tools=[t.openai() for t in recipe.tools()],
                             tool_format=fmt))


def check_template(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> None:
    """The model's chat template renders a two-turn tool conversation of text-only teacher turns so that no
    emitted token changes (`components/core/rendering.py`, history rule: append-only, or through the history
    view for templates such as Qwen3's that drop an earlier turn's `<think>` block); raises PreflightError in
    one line. A template even the view cannot hold would otherwise fail at SFT, minutes into the run."""
    from components.core.rendering import TemplateError, render_trajectory
    from components.core.schema import Outcome, Step, ToolCall, Trajectory
    from components.core.tool_formats import format_call

    tokenizer, fmt, recipe, task, steps = _first_episode(config, tasks_dir, model_dir)
    tool = recipe.tools()[0]
    for n in range(2):
        call = ToolCall(name=tool.name, arguments={})
        steps += [Step(index=len(steps), role="assistant", content=format_call(call, fmt), tool_call=call),
                  Step(index=len(steps) + 1, role="tool", content=f"result {n}", tool_call_id=call.id,
                       tool_name=tool.name)]
    conversation = Trajectory(task_id=task.id, recipe=task.recipe, policy_id="teacher", steps=steps,
                              tools=[t.openai() for t in recipe.tools()], outcome=Outcome.resolved)
    try:
        render_trajectory(conversation, tokenizer, loss_on="assistant", tool_format=fmt)
    except TemplateError as err:
        first = next((line for line in str(err).splitlines() if line.strip()), str(err))
        raise PreflightError(f"the chat template of {model_dir} cannot train on text-only teacher turns: it "
                             f"rewrites earlier turns of a two-turn tool conversation ({first[:300]}); use a "
                             "checkpoint whose template renders history append-only, or a teacher whose turns "
                             "carry this tokenizer's ids (distill.openai.sampled_tokens with tokenizer_path)") from None


def check_model(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> int:
    """What init-policy's model must allow, checked right after it (seconds into the run, before any episode):
    its template (`check_template`) and the length limits (`check_lengths`); returns the first prompt's tokens."""
    check_template(config, tasks_dir, model_dir)
    return check_lengths(config, tasks_dir, model_dir)


def check_lengths(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> int:
    """Every length limit leaves room for the first prompt and one turn after it (raises PreflightError);
    returns the prompt's tokens. Run once the model exists (after init-policy), before any episode."""
    prompt = prompt_tokens(config, tasks_dir, model_dir)
    limits = (("sft.max_len", config.sft.max_len, config.distill.harness.generation.max_new_tokens),
              ("rl.max_len", config.rl.max_len, config.rl.harness.generation.max_new_tokens),
              ("rl.harness.max_total_tokens", config.rl.harness.max_total_tokens,
               config.rl.harness.generation.max_new_tokens),
              ("evaluate.harness.max_total_tokens", config.evaluate.harness.max_total_tokens,
               config.evaluate.harness.generation.max_new_tokens))
    for where, limit, turn in limits:
        if prompt + turn > limit:
            raise PreflightError(f"{where}={limit} leaves no room for a turn: the system prompt, tools and first task "
                                 f"take {prompt} tokens in this model's template and one turn writes up to {turn}; "
                                 f"set {where} >= {prompt + turn}")
    return prompt
