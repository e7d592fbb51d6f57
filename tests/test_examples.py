"""The examples run: the bring-your-own guide's commands run as written (the fenced block after its
`<!-- example: bring-your-own ... -->` marker, in bash, from a directory holding a copy of examples/), and the
example's tasks are sound (every patch fixes its FAIL_TO_PASS tests and breaks none of PASS_TO_PASS).

The run is the whole pipeline on a random-init checkpoint with Qwen's vocabulary, the fake teacher and the six
example tasks, in real sandboxes: a minute or two of CPU, in the default suite because a guide whose commands
stop working is the first thing a newcomer meets."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guides" / "bring-your-own.md"
EXAMPLE = REPO / "examples" / "bring-your-own"


def example_block(text: str, name: str) -> str:
    """The fenced block right after `<!-- example: NAME ... -->`."""
    match = re.search(rf"<!-- example: {re.escape(name)}\b[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"no example block {name!r} in the guide"
    return match.group(1)


def _rows() -> list[dict]:
    return [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines() if line.strip()]


def test_every_example_task_is_fixed_by_its_patch_and_only_then(tmp_path):
    """In the checkout make_repos.py builds (at the row's base_commit), FAIL_TO_PASS fails with the test patch
    alone and passes once the patch is applied; PASS_TO_PASS passes both times."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "make_repos.py"), str(tmp_path / "repos")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.strip().endswith(_rows()[0]["base_commit"]), out
    for row in _rows():
        repo = tmp_path / row["instance_id"]
        shutil.copytree(tmp_path / "repos" / row["repo"].replace("/", "__"), repo)
        subprocess.run(["git", "apply", "-"], input=row["test_patch"], text=True, cwd=repo, check=True)
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])

        def pytest_exit(*ids: str) -> int:
            return subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids], cwd=repo, capture_output=True
            ).returncode

        assert pytest_exit(*f2p) == 1 and pytest_exit(*p2p) == 0, row["instance_id"]
        subprocess.run(["git", "apply", "-"], input=row["patch"], text=True, cwd=repo, check=True)
        assert pytest_exit(*f2p, *p2p) == 0, row["instance_id"]


def test_the_fake_teacher_solves_the_example_through_the_openai_api():
    from components.fake_teacher import FakeTeacher, make_server
    from components.core.policy.policies import OpenAICompatiblePolicy
    from components.core.policy.base import ChatMessage, GenerationConfig
    from components.core.rendering.protocol import parse_tool_call
    from pipelines.preflight import Endpoint, check_endpoint

    row = _rows()[2]
    server = make_server(FakeTeacher(EXAMPLE / "tasks.jsonl"), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        check_endpoint(Endpoint("distill.openai", url, "fake-teacher", None))  # the run's preflight passes
        policy = OpenAICompatiblePolicy(base_url=url, model="fake-teacher", api_key_env=None, max_retries=0)
        messages = [
            ChatMessage(role="system", content="You fix bugs."),
            ChatMessage(role="user", content=f"Issue:\n{row['problem_statement']}\n"),
        ]
        calls = []
        for _ in range(3):
            text = policy.generate(messages, GenerationConfig(max_new_tokens=256)).text
            calls.append(parse_tool_call(text))
            messages += [ChatMessage(role="assistant", content=text), ChatMessage(role="tool", content="ok")]
        assert [c.name for c in calls] == ["bash", "bash", "submit"]
        assert calls[0].arguments["command"].startswith("git apply") and row["patch"] in calls[0].arguments["command"]
        unknown = policy.generate([ChatMessage(role="user", content="a task it never saw")], GenerationConfig())
        assert parse_tool_call(unknown.text).name == "submit"  # ends the episode, unresolved
        with pytest.raises(Exception, match="404"):  # another model name is refused, as vLLM refuses it
            OpenAICompatiblePolicy(base_url=url, model="gpt-x", api_key_env=None, max_retries=0).generate(
                messages[:2], GenerationConfig()
            )
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(1500)
def test_the_bring_your_own_guide_runs_as_written(tmp_path):
    block = example_block(GUIDE.read_text(), "bring-your-own")
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "bring-your-own")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    pid_file = tmp_path / "build" / "byo" / "teacher.pid"
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1400,
        )
    finally:  # the fake teacher never outlives the test, whatever happened
        if pid_file.exists():
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline")
            if cmdline.exists() and b"fake-teacher" in cmdline.read_bytes():  # still ours, not a reused pid
                os.kill(pid, signal.SIGTERM)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "done distill" in out and "resolved 4, unresolved 0, infra_error 0" in out, out[-4000:]
    assert "done evaluate-teacher" in out and "resolved 2/2" in out, out[-4000:]
    assert "stages run: provision, init-policy" in out and "promote" in out
    assert "orchard ui --runs-dir build/byo/runs" in out  # how to look at it
    assert (tmp_path / "build" / "byo" / "model" / "config.json").exists()
