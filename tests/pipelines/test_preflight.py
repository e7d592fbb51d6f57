"""Fail early, in one line: what a run cannot do is refused before the first stage, with what to change."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.cli import main
from pipelines.config import ConfigError, resolve
from pipelines.preflight import PreflightError, endpoints, preflight


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(handler: type) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _Answers(BaseHTTPRequestHandler):
    """Answers every GET and POST with `status`, `content_type` and `body` (set per test by subclassing)."""

    status, content_type, body = 200, "application/json", b"{}"
    routes: dict[str, tuple[int, str, bytes]] = {}

    def _answer(self):
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, kind, body = self.routes.get(self.path.split("?")[0], (self.status, self.content_type, self.body))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args):
        pass


CHAT = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "length"}]}
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "served-model", "object": "model"}]}).encode()
HTML = b"<!doctype html><html><body>Welcome to nginx!</body></html>"


@pytest.fixture
def endpoint():
    """A real OpenAI-shaped HTTP server on loopback serving `served-model`; it wants the key `sesame`; a chat
    completion asks for the model it serves."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.headers.get("Authorization") != "Bearer sesame":
                self.send_response(401)
                self.end_headers()
                return
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(MODELS)

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ok = self.path == "/v1/chat/completions" and body["model"] == "served-model" and body["max_tokens"] == 1
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(CHAT if ok else b'{"error": "bad request"}')

        def log_message(self, *args):
            pass

    server, url = _serve(Handler)
    yield f"{url}/v1"
    server.shutdown()
    server.server_close()


def _teacher(base_url: str, model: str = "served-model") -> list[str]:
    return [
        "evaluate_teacher.policy=openai",
        "evaluate_teacher.endpoint=" + json.dumps({"base_url": base_url, "model": model, "api_key_env": "KEY34"}),
    ]


def test_an_endpoint_teacher_without_its_settings_is_refused_by_config_show(capsys):
    assert main(["config", "show", "--preset", "tiny", "--set", "distill.teacher=openai"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(
        "orchard: distill: teacher='openai' needs its endpoint settings: set distill.openai={"
    )


def test_imported_tasks_need_a_teacher_that_can_solve_them():
    source = 'provision.source={"kind": "swebench", "path": "x.jsonl", "repos_dir": "/repos"}'
    with pytest.raises(
        ConfigError,
        match="distill.teacher, evaluate_teacher.policy, credit.monte_carlo.teacher use "
        "the scripted teacher, which only solves generated tasks",
    ):
        resolve("tiny", [source])
    endpoint = {"base_url": "http://vllm:8000/v1", "model": "m"}
    config = resolve(
        "tiny",
        [
            source,
            "distill.teacher=openai",
            f"distill.openai={json.dumps(endpoint)}",
            "evaluate_teacher.policy=openai",
            f"evaluate_teacher.endpoint={json.dumps(endpoint)}",
            "credit.monte_carlo.teacher=" + json.dumps({"kind": "openai", "endpoint": endpoint}),
        ],
    )
    assert [e.where for e in endpoints(config)] == [
        "distill.openai",
        "evaluate_teacher.endpoint",
        "credit.monte_carlo.teacher.endpoint",
    ]


def test_harness_tool_format_is_set_once_for_every_stage_that_samples_the_trained_model():
    config = resolve("tiny", ["harness.tool_format=hermes"])
    assert (config.sft.tool_format, config.rl.harness.tool_format, config.evaluate.harness.tool_format) == (
        "hermes",
    ) * 3
    assert resolve("tiny").sft.tool_format == "auto"
    with pytest.raises(ConfigError, match="set all three at once with harness.tool_format"):
        resolve("tiny", ["sft.tool_format=hermes"])
    with pytest.raises(ConfigError, match="harness.tool_format"):
        resolve("tiny", ["harness.tool_format=xml"])


def test_endpoints_are_asked_once_before_anything_runs(endpoint, monkeypatch):
    monkeypatch.setenv("KEY34", "sesame")
    preflight(resolve("tiny", _teacher(endpoint)))  # answers, takes the key, serves the model
    with pytest.raises(
        PreflightError,
        match=r"evaluate_teacher.endpoint: .* serves served-model, not 'other'; "
        r"set evaluate_teacher.endpoint.model",
    ):
        preflight(resolve("tiny", _teacher(endpoint, "other")))
    monkeypatch.setenv("KEY34", "wrong")
    with pytest.raises(PreflightError, match=r"refused the request \(401\) with \$KEY34"):
        preflight(resolve("tiny", _teacher(endpoint)))
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(PreflightError, match=f"evaluate_teacher.endpoint: {url} does not answer .*ConnectError"):
        preflight(resolve("tiny", _teacher(url)))


def test_lengths_that_leave_no_room_for_a_turn_stop_the_run_right_after_init_policy(
    tmp_path, external_service, micro_config
):
    import mlflow

    from pipelines.local import run_local

    config = micro_config.updated(sandbox_url=external_service.url, sft={"max_len": 300})
    with pytest.raises(
        PreflightError,
        match=r"sft.max_len=300 leaves no room for a turn: the system prompt, tools "
        r"and first task take (\d+) tokens .* set sft.max_len >= \d+",
    ):
        run_local(config, tmp_path / "runs")
    (run_dir,) = (tmp_path / "runs").glob("2*")
    assert sorted(p.name for p in (run_dir / "results").iterdir()) == ["init-policy.json", "provision.json"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("orchard").experiment_id], filter_string="tags.`orchard.stage` = 'pipeline'"
    )
    assert parent.info.status == "FAILED" and parent.data.tags["orchard.failed_stage"] == "init-policy"


def test_orchard_run_with_an_unreachable_endpoint_fails_in_seconds_in_one_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    argv = [
        "run",
        "--preset",
        "tiny",
        "--runs-dir",
        str(tmp_path / "runs"),
        *sum([["--set", s] for s in _teacher(url)], []),
    ]
    t0 = time.perf_counter()
    assert main(argv) == 1
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert seconds < 10, seconds
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"orchard: evaluate_teacher.endpoint: {url} does not answer") and err.endswith(
        "(PreflightError; --debug shows the traceback)"
    ), err
    assert not (tmp_path / "runs").exists(), "nothing started: no service, no run directory, no MLflow run"
    with pytest.raises(PreflightError):  # --debug: the exception itself, traceback and all
        main([*argv, "--debug"])


def test_traces_are_switched_off_once_for_every_stage_that_has_them():
    config = resolve("tiny", ["traces.enabled=false"])
    assert not any(getattr(config, name).traces.enabled for name in ("evaluate", "evaluate_teacher", "rl"))
    config = resolve("tiny", ["traces.sample_rate=1.0", "traces.max_per_stage=5"])
    assert {getattr(config, name).traces.sample_rate for name in ("evaluate", "evaluate_teacher", "rl")} == {1.0}
    assert resolve("tiny").rl.traces.sample_rate == 0.25  # unset: each stage's own


def test_the_argo_start_step_refuses_an_unreachable_endpoint_in_one_line(tmp_path, capsys):
    from pipelines.steps import main as steps_main

    url = f"http://127.0.0.1:{_closed_port()}/v1"
    overrides = json.dumps(
        {
            "evaluate_teacher.policy": "openai",
            "evaluate_teacher.endpoint": {"base_url": url, "model": "m", "api_key_env": None},
        }
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = steps_main(
        [
            "start",
            "--run-dir",
            str(tmp_path / "run"),
            "--outputs-dir",
            str(tmp_path / "out"),
            "--param",
            "preset=tiny",
            "--param",
            "recipe=swe",
            "--param",
            "sandbox_url=",
            "--param",
            f"mlflow_uri={uri}",
            "--param",
            "experiment=orchard",
            "--param",
            f"overrides_json={overrides}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: evaluate_teacher.endpoint: {url} does not answer") and "\n" not in err
    assert not (tmp_path / "out" / "parent_run_id").exists()  # no parent run: the exit handler has nothing to close


def test_qwen3_trains_and_a_template_that_rewrites_other_turns_is_refused_in_one_line(tmp_path):
    """Qwen3's template gives the newest assistant turn an empty <think> block and drops it once another
    turn follows: the history view trains it. A template that rewrites a tool turn once another
    follows cannot be trained at all, and init-policy says so in one line, seconds into the run."""
    from components.checkpoints import qwen_vocab_tokenizer
    from components.core.rendering.chat_templates import CHATML_TOOLS
    from components.core.data.parquet_store import TaskStore
    from components.recipes import get_recipe
    from pipelines.preflight import check_model

    TaskStore(tmp_path / "tasks").write(get_recipe("swe").tasks("train", 1, seed=0))
    config = resolve("tiny")
    for family in ("chatml", "qwen3"):
        tokenizer = qwen_vocab_tokenizer(family)
        tokenizer.save_pretrained(tmp_path / family)
        assert check_model(config, tmp_path / "tasks", tmp_path / family) > 0  # trainable
    tool_turn = "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    assert tool_turn in CHATML_TOOLS
    tokenizer.chat_template = CHATML_TOOLS.replace(
        tool_turn,
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + ('\\n(latest)' if loop.last "
        "else '') + '\\n</tool_response><|im_end|>\\n' }}",
    )
    assert tokenizer.chat_template != CHATML_TOOLS
    tokenizer.save_pretrained(tmp_path / "rewrites-tools")
    with pytest.raises(PreflightError) as err:
        check_model(config, tmp_path / "tasks", tmp_path / "rewrites-tools")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        f"the chat template of {tmp_path / 'rewrites-tools'} cannot "
        "train on text-only teacher turns: it rewrites earlier turns"
    )


def _openai(base_url: str, model: str = "served-model") -> list[str]:
    return _teacher(base_url, model)


@pytest.mark.parametrize(
    "routes, expected",
    [
        # a web server (or a proxy's page) where the API should be: /models answers 200 with HTML
        (
            {"/v1/models": (200, "text/html", HTML)},
            r"/v1/models answered 200 with text/html, not an OpenAI models list \('<!doctype html>.*'\): fix "
            r"evaluate_teacher.endpoint.base_url \(the API root, e.g. http://host:8000/v1\)",
        ),
        # no models list (allowed), but the chat completion is a page too
        (
            {"/v1/models": (404, "text/html", b"not here"), "/v1/chat/completions": (200, "text/html", HTML)},
            r"/v1/chat/completions answered 200 with text/html, not a chat completion",
        ),
        # JSON, but not a completion (a gateway's own status document)
        (
            {
                "/v1/models": (200, "application/json", MODELS),
                "/v1/chat/completions": (200, "application/json", b'{"ok": 1}'),
            },
            r"/v1/chat/completions answered 200 with application/json, not a chat completion",
        ),
        # the model is listed but the completion is refused
        (
            {
                "/v1/models": (200, "application/json", MODELS),
                "/v1/chat/completions": (400, "application/json", b'{"error": "max_tokens too small"}'),
            },
            r"/v1/chat/completions answered 400 to a one-token chat \('\{\"error\": \"max_tokens too small\"\}'\); fix "
            r"evaluate_teacher.endpoint.model or evaluate_teacher.endpoint.base_url",
        ),
    ],
)
def test_an_endpoint_must_complete_a_chat_of_one_token(routes, expected):
    handler = type("Routes", (_Answers,), {"routes": routes, "status": 404})
    server, url = _serve(handler)
    try:
        t0 = time.perf_counter()
        with pytest.raises(PreflightError, match=expected) as err:
            preflight(resolve("tiny", _openai(f"{url}/v1")))
        assert "\n" not in str(err.value) and time.perf_counter() - t0 < 10
    finally:
        server.shutdown()
        server.server_close()


def test_one_endpoint_in_three_roles_is_asked_once_and_named_with_all_three():
    seen = []

    class Counting(_Answers):
        routes = {
            "/v1/models": (200, "application/json", MODELS),
            "/v1/chat/completions": (200, "application/json", CHAT),
        }

        def _answer(self):
            seen.append(self.path)
            super()._answer()

        do_GET = do_POST = _answer  # noqa: N815

    server, url = _serve(Counting)
    endpoint = json.dumps({"base_url": f"{url}/v1", "model": "served-model", "api_key_env": None})
    roles = [
        "distill.teacher=openai",
        f"distill.openai={endpoint}",
        "evaluate_teacher.policy=openai",
        f"evaluate_teacher.endpoint={endpoint}",
        'credit.monte_carlo.teacher={"kind": "openai", "endpoint": ' + endpoint + "}",
    ]
    try:
        preflight(resolve("tiny", roles))
        assert seen == ["/v1/models", "/v1/chat/completions"]
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(PreflightError) as err:  # the same endpoint, now down: one clause naming every role
        preflight(resolve("tiny", roles))
    message = str(err.value)
    assert message.count("does not answer") == 1 and message.startswith("distill.openai: ")
    assert message.endswith("(the same endpoint as evaluate_teacher.endpoint, credit.monte_carlo.teacher.endpoint)")
