"""OpenEnv environments for our recipes, served by openenv-core and driven by its client, against the real
sandbox service: full SWE and Claw episodes to a verified reward, infrastructure failures reported as such,
16 concurrent sessions with nothing left behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from components.core.policy.base import ChatMessage, GenerationConfig
from components.core.rendering.protocol import parse_tool_call
from components.envs.session import EnvConfig
from components.recipes import get_recipe, get_scripted_teacher

pytest.importorskip("openenv.core", reason="needs the orchard[openenv] extra")
from components.envs.openenv_env import RecipeAction, RecipeEnvClient  # noqa: E402


def _config(sandbox_service, recipe: str, **kw) -> EnvConfig:
    return EnvConfig(recipe=recipe, num_tasks=4, service=sandbox_service.connection(), **kw)


def _drive(client, recipe: str, config: EnvConfig, **reset_kwargs):
    """A trainer's loop: the scripted teacher stands in for the policy, the OpenEnv client is the only way
    to the environment. Returns the final step result and the number of steps."""
    tasks = {t.id: t for t in get_recipe(recipe).tasks(config.split, config.num_tasks, config.task_seed)}
    result = client.reset(**reset_kwargs)
    obs = result.observation
    assert obs.outcome == "running" and obs.tools and obs.system_prompt, obs
    teacher = get_scripted_teacher(recipe, error_rate=0.0, seed=0)
    teacher.reset(tasks[obs.task_id])
    messages = [ChatMessage(role="system", content=obs.system_prompt), ChatMessage(role="user", content=obs.output)]
    steps = 0
    while not result.done:
        text = teacher.generate(messages, GenerationConfig()).text
        call = parse_tool_call(text)
        result = client.step(RecipeAction(tool=call.name, arguments=call.arguments))
        messages += [
            ChatMessage(role="assistant", content=text),
            ChatMessage(role="tool", content=result.observation.output, tool_call_id=call.id, name=call.name),
        ]
        steps += 1
        assert steps <= config.max_steps
    return result, steps


@pytest.mark.parametrize("recipe", ["swe", "claw", pytest.param("gui", marks=pytest.mark.slow)])
def test_openenv_client_drives_a_full_episode_to_a_verified_reward(sandbox_service, sandbox_client, env_server, recipe):
    config = _config(sandbox_service, recipe, max_steps=16)
    with env_server(config) as (url, _):
        client = RecipeEnvClient(base_url=url).sync()
        try:
            result, steps = _drive(client, recipe, config, task_index=1)
            assert (result.done, result.reward, result.observation.outcome) == (True, 1.0, "resolved")
            state = client.state()
            assert state.recipe == recipe and state.step_count == steps and state.outcome == "resolved"
            # The episode's sandbox is freed as soon as it is verified.
            live = sandbox_client.list({"orchard.task": state.task_id[:63]})
            assert [s for s in live if s.state.value in ("pending", "ready")] == []
            # Stepping an ended episode is the caller's mistake, said plainly (not a reward).
            again = client.step(RecipeAction(tool="submit" if recipe == "swe" else "answer", arguments={"text": "x"}))
            assert again.done and again.reward is None and "reset" in again.observation.output
        finally:
            client.close()


def test_unresolved_submission_is_reward_zero_with_the_verifier_reason(sandbox_service, env_server):
    config = _config(sandbox_service, "swe")
    with env_server(config) as (url, _):
        with RecipeEnvClient(base_url=url).sync() as client:
            client.reset(task_index=0)
            bad = client.step(RecipeAction(tool="read_file", arguments={"path": "no/such/file.py"}))
            assert not bad.done and bad.observation.policy_error  # the policy's error: the episode goes on
            result = client.step(RecipeAction(tool="submit"))
            assert (result.done, result.reward, result.observation.outcome) == (True, 0.0, "unresolved")
            assert result.observation.reason


def test_step_limit_ends_and_verifies_the_episode(sandbox_service, env_server):
    config = _config(sandbox_service, "swe", max_steps=2)
    with env_server(config) as (url, _):
        with RecipeEnvClient(base_url=url).sync() as client:
            client.reset(task_index=0)
            first = client.step(RecipeAction(tool="bash", arguments={"command": "ls"}))
            assert not first.done
            second = client.step(RecipeAction(tool="bash", arguments={"command": "ls"}))
            assert second.done and second.reward == 0.0


def test_infrastructure_failure_ends_the_episode_without_a_reward(sandbox_service, sandbox_client, env_server):
    config = _config(sandbox_service, "swe")
    with env_server(config) as (url, _):
        with RecipeEnvClient(base_url=url).sync() as client:
            client.reset(task_index=2)
            sandbox_id = client.state().sandbox_id
            sandbox_client.request("DELETE", f"/v1/sandboxes/{sandbox_id}")  # it vanishes under the episode
            result = client.step(RecipeAction(tool="bash", arguments={"command": "ls"}))
            obs = result.observation
            assert result.done and result.reward is None
            assert obs.outcome == "infra_error" and obs.infra_error and sandbox_id in obs.infra_error


def test_sixteen_concurrent_sessions_share_setup_snapshots_and_leave_nothing(
    sandbox_service, sandbox_client, env_server
):
    config = _config(sandbox_service, "swe", max_steps=4)

    async def episode(url: str, i: int) -> tuple[float | None, str]:
        client = RecipeEnvClient(base_url=url, message_timeout_s=240)
        try:
            await client.connect()
            obs = (await client.reset(task_index=i % 4)).observation
            assert obs.outcome == "running", obs.infra_error
            await client.step(RecipeAction(tool="bash", arguments={"command": f"echo session-{i} > mine.txt"}))
            own = await client.step(RecipeAction(tool="read_file", arguments={"path": "mine.txt"}))
            if i % 2:  # half end by closing mid-episode: the server must free their sandboxes too
                return None, own.observation.output
            result = await client.step(RecipeAction(tool="submit"))
            return result.reward, own.observation.output
        finally:
            await client.close()

    async def run_all(url: str):
        return await asyncio.gather(*(episode(url, i) for i in range(16)))

    snapshots_before = {s["id"] for s in sandbox_client.request("GET", "/v1/snapshots").json()}
    with env_server(config, max_concurrent_envs=16) as (url, shared):
        results = asyncio.run(run_all(url))
        assert len(shared.cache) == 4  # one setup snapshot per task; the other 12 sessions forked them
        for i, (reward, own) in enumerate(results):
            assert f"session-{i}" in own  # each session saw only its own sandbox
            assert reward == (0.0 if i % 2 == 0 else None)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # closed sessions are destroyed right after the socket closes
            live = [s for s in sandbox_client.list({"orchard.recipe": "swe"}) if s.state.value != "deleted"]
            if not live:
                break
            time.sleep(0.2)
        assert live == []
    snapshots_after = {s["id"] for s in sandbox_client.request("GET", "/v1/snapshots").json()}
    assert snapshots_after <= snapshots_before  # the server removed its setup snapshots at exit


def test_orchard_env_serve_is_reachable_from_the_orchard_cli(capsys):
    from pipelines.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["env", "serve", "--recipe", "nope"])
    assert exit_info.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_the_server_wants_its_token_on_every_route_but_health(sandbox_service, env_server):
    """The OpenEnv server had no authentication: any local process could reset and step episodes in
    sandboxes paid for with the service's token, and fill the session cap."""
    import httpx

    config = _config(sandbox_service, "claw", max_steps=4)
    with env_server(config) as (url, _):
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        for method, path in (("POST", "/reset"), ("POST", "/step"), ("GET", "/state"), ("GET", "/schema")):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                got = httpx.request(method, url + path, json={}, headers=headers, timeout=30)
                assert got.status_code == 401 and got.json()["code"] == "unauthorized", (path, got.text)
        refused = RecipeEnvClient(base_url=url, token="wrong").sync()
        with pytest.raises(ConnectionError):
            refused.reset()
        client = RecipeEnvClient(base_url=url).sync()  # the token from ORCHARD_ENV_TOKEN
        try:
            assert client.reset().observation.output
        finally:
            client.close()


def test_the_server_token_is_generated_and_printed_once_when_not_given(monkeypatch, capsys):
    from components.envs.cli import main, server_token

    monkeypatch.delenv("ORCHARD_ENV_TOKEN", raising=False)
    token = server_token(None)
    assert len(token) >= 32 and capsys.readouterr().err.count(token) == 1
    assert server_token("given") == "given" and capsys.readouterr().err == ""
    monkeypatch.setenv("ORCHARD_ENV_TOKEN", "from-env")
    assert server_token(None) == "from-env"
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "(loopback by default)" in capsys.readouterr().out


def test_mcp_lists_the_recipe_tools_and_a_call_is_one_step_of_the_session(sandbox_service, env_server):
    """`/mcp tools/list` answered -32603 ("Environment does not support MCP") although the server advertises
    the route; now it lists the recipe's tools, and `tools/call` in a session steps that session's episode."""
    import os

    import httpx

    from components.envs.openenv_env import TOKEN_ENV

    config = _config(sandbox_service, "swe", max_steps=4)
    expected = {t.name: t.parameters for t in get_recipe("swe").tools()}
    with env_server(config) as (url, _):
        auth = {"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"}
        listed = httpx.post(
            url + "/mcp",
            json={"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1},
            headers=auth,
            timeout=30,
        ).json()
        assert "error" not in listed or listed["error"] is None, listed
        assert {t["name"]: t["inputSchema"] for t in listed["result"]["tools"]} == expected
        # Outside a session there is no episode: the call says so (an observation, not a server error).
        stateless = httpx.post(
            url + "/mcp",
            headers=auth,
            timeout=30,
            json={
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": "ls"}},
                "id": 2,
            },
        ).json()
        assert "result" in stateless, stateless
        assert "reset" in stateless["result"]["output"] and stateless["result"]["done"] is True

        async def in_a_session() -> dict:
            async with RecipeEnvClient(base_url=url) as client:
                await client.reset(task_index=0)
                reply = await client._send_and_receive(
                    {
                        "type": "mcp",
                        "data": {
                            "jsonrpc": "2.0",
                            "method": "tools/call",
                            "id": 3,
                            "params": {"name": "bash", "arguments": {"command": "echo via-mcp"}},
                        },
                    }
                )
                state = await client.state()
                return {"reply": reply, "steps": state.step_count}

        got = asyncio.run(in_a_session())
        result = got["reply"]["data"]["result"]
        assert "via-mcp" in result["output"] and result["done"] is False and got["steps"] == 1


def test_an_out_of_range_task_index_is_refused_with_the_suite_size(sandbox_service, env_server):
    """`reset(task_index=99999)` used to wrap around silently and give another task."""
    config = _config(sandbox_service, "claw")
    with env_server(config) as (url, _):
        client = RecipeEnvClient(base_url=url).sync()
        try:
            with pytest.raises(RuntimeError, match="task_index 99999 is out of range.* has 4 tasks, 0 to 3"):
                client.reset(task_index=99999)
        finally:
            client.close()


@pytest.mark.parametrize("recipe", ["swe", "claw", pytest.param("gui", marks=pytest.mark.slow)])
def test_repeat_episodes_of_a_task_fork_the_setup_and_resolve(sandbox_service, env_server, recipe):
    """With forking on, later episodes of a task fork the first set-up's snapshot, which holds its files but not
    its processes: GUI's every later episode was "browser controller unreachable" (its site and browser are
    restarted now)."""
    config = _config(sandbox_service, recipe, max_steps=16)
    assert config.fork_setup
    with env_server(config) as (url, shared):
        client = RecipeEnvClient(base_url=url, message_timeout_s=240).sync()
        try:
            for episode in range(2):
                result, _ = _drive(client, recipe, config, task_index=1)
                outcome = (result.done, result.reward, result.observation.outcome)
                assert outcome == (True, 1.0, "resolved"), (episode, result.observation.infra_error)
                assert len(shared.cache) == 1  # the first episode's set-up, which the second forked
        finally:
            client.close()
