"""What is checked before the first stage runs, so that a run fails in seconds and in one line, not minutes in.

Checks that need no I/O are validators of the configs themselves, so `orchard config show` refuses them too
(a teacher or judge without its endpoint settings: `DistillConfig`, `TeacherConfig`, `EvalConfig`,
`CreditConfig`; imported tasks without a teacher that can solve them: `PipelineConfig`). This module holds
the checks that need more than the config:
- `preflight`: every external thing the config names, all at once, each bounded by one deadline
  (`PREFLIGHT_SECONDS`, no retries), every failure one clause that names the setting and the fix:
  the MLflow tracking URI (a server answers the REST call the run makes first; a sqlite file can be
  written), the sandbox service (`sandbox_url`), the checkpoints (`model.path`, an endpoint's
  `tokenizer_path`: a model directory, a named model that is installed, a hub id in the local cache), the
  tasks file (`provision.source`: every row parses and imports, its checkout and commit exist; an error names
  `file:line`) and every OpenAI-compatible endpoint (`GET <base_url>/models` lists the model if it lists
  anything, then a real chat completion of one token answers with a chat completion: an HTML page or a
  proxy's 200 fails). The local runners call it before they start anything, `orchard check` on its own, and
  the cluster's start step before it opens the MLflow parent run (the network checks only: its pod does not
  mount the paths the stage pods read).
- `check_model`, right after init-policy (it needs the model's tokenizer, which the tiny model trains there),
  seconds into the run and before any episode: the template renders a two-turn tool conversation
  append-only (`check_template`), and the length limits leave room for the first prompt (system prompt, tools,
  task) plus one turn (`check_lengths`).
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import httpx

from components.core.policy.endpoint import ChatEndpoint
from pipelines.config import PipelineConfig

if TYPE_CHECKING:
    from components.core.policies import OpenAIPolicyConfig
    from components.credit.judge import JudgeConfig

# The whole preflight ends within this many seconds: every check runs at once and none retries.
PREFLIGHT_SECONDS = 8.0


class PreflightError(ValueError):
    """A setting that cannot work, found before any stage ran: the message says what to change."""


class Endpoint(NamedTuple):
    where: str  # the config field, e.g. "distill.openai"
    base_url: str
    model: str
    api_key_env: str | None
    tokenizer_path: str | None = None  # the served model's tokenizer, when the config names one


def endpoints(config: PipelineConfig) -> list[Endpoint]:
    """Every endpoint some stage of this run will call."""
    found: list[tuple[str, OpenAIPolicyConfig | JudgeConfig | None]] = []
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
    out = []
    for where, s in found:
        if s is None:  # the config's own checks ask for it with this setting
            raise PreflightError(f"{where} is not set: give base_url and model of the endpoint")
        out.append(Endpoint(where, s.base_url, s.model, s.api_key_env, getattr(s, "tokenizer_path", None)))
    return out


def _left(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic), at least a little so a request can fail cleanly."""
    return max(0.1, deadline - time.monotonic())


def _kind(response: httpx.Response) -> str:
    return (response.headers.get("content-type") or "no content type").split(";")[0]


def check_endpoint(endpoint: Endpoint, timeout: float = 10.0) -> None:
    """The endpoint answers, takes the key, serves the model and completes a chat of one token (raises
    PreflightError): `GET /models` (a 404 is allowed: not every server lists its models), then a real
    `POST /chat/completions` with `max_tokens: 1`, whose answer must be a chat completion."""
    deadline = time.monotonic() + timeout
    where, url = endpoint.where, endpoint.base_url.rstrip("/")
    fix_url = f"fix {where}.base_url (the API root, e.g. http://host:8000/v1)"
    # The endpoint's one client (components/core/policy/endpoint.py), each answer judged here: no retries.
    with ChatEndpoint(url, api_key_env=endpoint.api_key_env, timeout_seconds=timeout, max_retries=0) as client:
        _check_endpoint(endpoint, client, deadline, fix_url)


def _check_endpoint(endpoint: Endpoint, client: ChatEndpoint, deadline: float, fix_url: str) -> None:
    where, url = endpoint.where, client.base_url
    try:
        response = client.request("GET", "/models", timeout=_left(deadline))
    except httpx.HTTPError as err:
        raise PreflightError(
            f"{where}: {url} does not answer ({type(err).__name__}: {err}); start the endpoint or fix {where}.base_url"
        ) from None
    _refused(endpoint, response)
    if response.status_code != 404:
        if response.status_code >= 400:
            raise PreflightError(
                f"{where}: {url}/models answered {response.status_code} "
                f"({response.text[:200]!r}); fix the endpoint or {where}.base_url"
            )
        try:
            listed = response.json()
            served = [m["id"] for m in listed["data"]]
        except (ValueError, TypeError, KeyError):
            raise PreflightError(
                f"{where}: {url}/models answered {response.status_code} with {_kind(response)}, "
                f"not an OpenAI models list ({response.text[:80]!r}): {fix_url}"
            ) from None
        if served and endpoint.model not in served:
            raise PreflightError(
                f"{where}: {url} serves {', '.join(served[:5])}, not {endpoint.model!r}; "
                f"set {where}.model to one of them"
            )
    body = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    try:
        response = client.request("POST", "/chat/completions", json=body, timeout=_left(deadline))
    except httpx.HTTPError as err:
        raise PreflightError(
            f"{where}: {url}/chat/completions did not complete one token ({type(err).__name__}: "
            f"{err}); check that the endpoint serves {endpoint.model!r} or raise its capacity"
        ) from None
    _refused(endpoint, response)
    if response.status_code >= 400:
        raise PreflightError(
            f"{where}: {url}/chat/completions answered {response.status_code} to a one-token chat "
            f"({response.text[:200]!r}); fix {where}.model or {where}.base_url"
        )
    try:
        message = response.json()["choices"][0]["message"]
        if not isinstance(message, dict):
            raise TypeError(message)
    except (ValueError, TypeError, KeyError, IndexError):
        raise PreflightError(
            f"{where}: {url}/chat/completions answered {response.status_code} with "
            f"{_kind(response)}, not a chat completion ({response.text[:80]!r}): {fix_url}"
        ) from None


def _refused(endpoint: Endpoint, response: httpx.Response) -> None:
    if response.status_code in (401, 403):
        key = f"${endpoint.api_key_env}" if endpoint.api_key_env else "no key (api_key_env is None)"
        raise PreflightError(
            f"{endpoint.where}: {endpoint.base_url.rstrip('/')} refused the request "
            f"({response.status_code}) with {key}; put the endpoint's key in "
            f"{endpoint.where}.api_key_env's variable"
        )


def check_tracking(uri: str, experiment: str, timeout: float = PREFLIGHT_SECONDS) -> None:
    """The MLflow store the run logs to can be used (raises PreflightError): a server answers the first REST
    call a run makes (the experiment by name; 404 for a new experiment is an answer) in `timeout` seconds,
    where MLflow's own client would retry an unreachable server for minutes; a sqlite file's directory can be
    written; a file store (which MLflow 3 refuses) is named with its replacement."""
    unset = "or leave tracking_uri unset (a sqlite file beside the runs)"
    if uri.startswith(("http://", "https://")):
        headers, auth = {}, None
        if os.environ.get("MLFLOW_TRACKING_TOKEN"):
            headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
        elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
            auth = (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
        verify = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() not in ("1", "true")
        api = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name"
        try:
            response = httpx.get(
                api, params={"experiment_name": experiment}, headers=headers, auth=auth, timeout=timeout, verify=verify
            )
        except httpx.HTTPError as err:
            raise PreflightError(
                f"tracking_uri: MLflow at {uri} does not answer ({type(err).__name__}: {err}); "
                f"start it (mlflow server --host 0.0.0.0 --port 5000), fix tracking_uri, {unset}"
            ) from None
        if response.status_code in (401, 403):
            raise PreflightError(
                f"tracking_uri: MLflow at {uri} refused the request ({response.status_code}); set "
                "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD"
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        found = response.status_code == 200 and isinstance(answer, dict) and "experiment" in answer
        new = response.status_code == 404 and isinstance(answer, dict) and "error_code" in answer
        if not (found or new):
            raise PreflightError(
                f"tracking_uri: {uri} answered {response.status_code} with {_kind(response)} to "
                f"MLflow's REST API ({response.text[:80]!r}): not an MLflow tracking server; fix "
                f"tracking_uri (the server's root URL), {unset}"
            )
    elif uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        where = next((p for p in [path.parent, *path.parent.parents] if p.exists()), Path("/"))
        if not os.access(where if where.is_dir() else where.parent, os.W_OK) or (
            path.exists() and not os.access(path, os.W_OK)
        ):
            raise PreflightError(
                f"tracking_uri: {uri} cannot be written here ({where} is not writable); point "
                f"tracking_uri at a writable sqlite file, {unset}"
            )
    elif uri.startswith("file:") or "://" not in uri:
        raise PreflightError(
            f"tracking_uri: {uri} is a file store, which MLflow 3 no longer writes; use a database, "
            f"e.g. tracking_uri=sqlite:///{Path(uri.removeprefix('file://')).resolve()}.db, {unset}"
        )


def check_sandbox(url: str, timeout: float = PREFLIGHT_SECONDS) -> None:
    """The configured sandbox service answers its health check (one request, no retries)."""
    try:
        httpx.get(f"{url.rstrip('/')}/healthz", timeout=timeout)
    except httpx.HTTPError as err:
        raise PreflightError(
            f"sandbox_url: {url} does not answer ({type(err).__name__}: {err}); start the sandbox "
            "service there, or leave sandbox_url unset to run one locally"
        ) from None


def check_checkpoint(where: str, path: str, allow_download: bool) -> None:
    """A checkpoint the run will load exists here: a model directory (with config.json), a named model whose
    source is installed (not converted now), or a hub id in the local cache (raises PreflightError)."""
    from components.core.policy.modeling import resolve_checkpoint_path
    from components.core.policy.named_models import check_named, is_named

    if is_named(path):
        try:
            check_named(path)
        except FileNotFoundError as err:
            raise PreflightError(f"{where}: {err}") from None
        return
    try:
        resolve_checkpoint_path(path, allow_download)
    except FileNotFoundError as err:
        raise PreflightError(
            f"{where}: {err}; set {where} to a save_pretrained directory (`orchard make-checkpoint "
            "--out DIR` writes a small one)"
        ) from None


def check_tokenizer(where: str, path: str) -> None:
    if not Path(path).is_dir():
        raise PreflightError(
            f"{where}: {path} is not a directory; set {where} to the served model's tokenizer directory (or unset it)"
        )


def check_tasks(config: PipelineConfig) -> None:
    """An imported tasks file: every row parses and imports (its fields, its checkout, its base commit); the
    error names the row (`file:line`)."""
    from components.recipes.swe.swebench import SWEBenchImportError, import_swebench

    source = config.provision.source
    try:
        import_swebench(source.path, source.repos_dir)  # type: ignore[arg-type]
    except SWEBenchImportError as err:
        raise PreflightError(f"provision.source: {err}") from None


def checks(config: PipelineConfig, files: bool = True) -> list[tuple[str, Callable[[], None]]]:
    """(what, check) for every external thing the config names (see the module docstring). `files=False` leaves
    out the paths (checkpoints, tasks file, tokenizers): a cluster's start step does not mount what its stage
    pods will read, and only the network is the same for both."""
    out: list[tuple[str, Callable[[], None]]] = []
    if config.tracking_uri:
        out.append(("tracking_uri", lambda: check_tracking(config.tracking_uri or "", config.experiment)))
    if config.sandbox_url:
        out.append(("sandbox_url", lambda: check_sandbox(config.sandbox_url or "")))
    if config.model.path and files:  # also with start_from=champion: the first run has no champion yet
        out.append(
            ("model.path", lambda: check_checkpoint("model.path", config.model.path or "", config.model.allow_download))
        )
    if config.provision.source.kind == "swebench" and files:
        out.append(("provision.source", lambda: check_tasks(config)))
    same: dict[tuple[str, str, str | None], list[Endpoint]] = {}  # one endpoint in several roles is asked once
    for endpoint in endpoints(config):
        same.setdefault((endpoint.base_url.rstrip("/"), endpoint.model, endpoint.api_key_env), []).append(endpoint)
    for group in same.values():
        out.append((", ".join(e.where for e in group), functools.partial(_check_group, group)))
    for endpoint in endpoints(config):
        if endpoint.tokenizer_path and files:
            where = f"{endpoint.where}.tokenizer_path"
            out.append((where, functools.partial(check_tokenizer, where, endpoint.tokenizer_path)))
    return out


def _check_group(group: list[Endpoint]) -> None:
    """One endpoint that several settings name: asked once, the failure names every setting."""
    try:
        check_endpoint(group[0], timeout=PREFLIGHT_SECONDS)
    except PreflightError as err:
        if len(group) == 1:
            raise
        others = ", ".join(e.where for e in group[1:])
        raise PreflightError(f"{err} (the same endpoint as {others})") from None


def preflight(config: PipelineConfig, files: bool = True) -> None:
    """Every check of `checks` at once, within PREFLIGHT_SECONDS; raises one PreflightError whose line names
    every setting that cannot work and what to do about each."""
    todo = checks(config, files)
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="preflight") as pool:
        futures = [pool.submit(check) for _, check in todo]
        problems = []
        for future in futures:
            err = future.exception()
            if isinstance(err, PreflightError):
                problems.append(str(err))
            elif err is not None:
                raise err
    if problems:
        raise PreflightError("; ".join(problems))


def _first_episode(config: PipelineConfig, tasks_dir: Path, model_dir: Path):
    """(tokenizer, tool format, recipe, the first steps of an episode on a training task) in the trained
    model's template and tool format."""
    from components.core.episode.harness import initial_steps
    from components.core.policy.modeling import load_tokenizer
    from components.core.rendering.tokens import chat_format
    from components.core.data.parquet_store import TaskStore
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
    from components.core.rendering.tokens import render_prompt, steps_as_messages

    tokenizer, fmt, recipe, _, steps = _first_episode(config, tasks_dir, model_dir)
    return len(
        render_prompt(steps_as_messages(steps), tokenizer, tools=[t.openai() for t in recipe.tools()], tool_format=fmt)
    )


def check_template(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> None:
    """The model's chat template renders a two-turn tool conversation of text-only teacher turns so that no
    emitted token changes (`components/core/rendering/tokens.py`, history rule: append-only, or through the history
    view for templates such as Qwen3's that drop an earlier turn's `<think>` block); raises PreflightError in
    one line. A template even the view cannot hold would otherwise fail at SFT, minutes into the run."""
    from components.core.rendering.tokens import TemplateError, render_trajectory
    from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
    from components.core.rendering.tool_formats import format_call

    tokenizer, fmt, recipe, task, steps = _first_episode(config, tasks_dir, model_dir)
    tool = recipe.tools()[0]
    for n in range(2):
        call = ToolCall(name=tool.name, arguments={})
        steps += [
            Step(index=len(steps), role="assistant", content=format_call(call, fmt), tool_call=call),
            Step(index=len(steps) + 1, role="tool", content=f"result {n}", tool_call_id=call.id, tool_name=tool.name),
        ]
    conversation = Trajectory(
        task_id=task.id,
        recipe=task.recipe,
        policy_id="teacher",
        steps=steps,
        tools=[t.openai() for t in recipe.tools()],
        outcome=Outcome.resolved,
    )
    try:
        render_trajectory(conversation, tokenizer, loss_on="assistant", tool_format=fmt)
    except TemplateError as err:
        first = next((line for line in str(err).splitlines() if line.strip()), str(err))
        raise PreflightError(
            f"the chat template of {model_dir} cannot train on text-only teacher turns: it "
            f"rewrites earlier turns of a two-turn tool conversation ({first[:300]}); use a "
            "checkpoint whose template renders history append-only, or a teacher whose turns "
            "carry this tokenizer's ids (distill.openai.sampled_tokens with tokenizer_path)"
        ) from None


def check_model(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> int:
    """What init-policy's model must allow, checked right after it (seconds into the run, before any episode):
    its template (`check_template`) and the length limits (`check_lengths`); returns the first prompt's tokens."""
    check_template(config, tasks_dir, model_dir)
    return check_lengths(config, tasks_dir, model_dir)


def check_lengths(config: PipelineConfig, tasks_dir: Path, model_dir: Path) -> int:
    """Every length limit leaves room for the first prompt and one turn after it (raises PreflightError);
    returns the prompt's tokens. Run once the model exists (after init-policy), before any episode."""
    prompt = prompt_tokens(config, tasks_dir, model_dir)
    limits = (
        ("sft.max_len", config.sft.max_len, config.distill.harness.generation.max_new_tokens),
        ("rl.max_len", config.rl.max_len, config.rl.harness.generation.max_new_tokens),
        (
            "rl.harness.max_total_tokens",
            config.rl.harness.max_total_tokens,
            config.rl.harness.generation.max_new_tokens,
        ),
        (
            "evaluate.harness.max_total_tokens",
            config.evaluate.harness.max_total_tokens,
            config.evaluate.harness.generation.max_new_tokens,
        ),
    )
    for where, limit, turn in limits:
        if prompt + turn > limit:
            raise PreflightError(
                f"{where}={limit} leaves no room for a turn: the system prompt, tools and first task "
                f"take {prompt} tokens in this model's template and one turn writes up to {turn}; "
                f"set {where} >= {prompt + turn}"
            )
    return prompt
