"""The episode core under every adapter: heartbeats keep an idle episode's sandbox, and losing it is an
infrastructure failure, not a reward."""

from __future__ import annotations

import time

import pytest

from components.envs.session import EnvConfig, Heartbeats, RecipeSession


def _session(sandbox_service, sandbox_client, heartbeats):
    config = EnvConfig(
        recipe="swe",
        num_tasks=2,
        fork_setup=False,
        sandbox_heartbeat_ttl_seconds=1.5,
        service=sandbox_service.connection(),
    )
    return RecipeSession(config, client=sandbox_client, heartbeats=heartbeats)


def test_heartbeats_keep_an_idle_episode_alive_and_without_them_it_is_an_infra_error(sandbox_service, sandbox_client):
    heartbeats = Heartbeats(every_seconds=0.3)
    kept, lost = _session(sandbox_service, sandbox_client, heartbeats), _session(sandbox_service, sandbox_client, None)
    try:
        assert kept.reset(task_index=0).outcome == "running" and lost.reset(task_index=0).outcome == "running"
        time.sleep(3.5)  # a trainer generating for longer than the sandbox's idle TTL (the reaper runs every 0.5 s)
        alive = kept.step("bash", {"command": "echo still-here"})
        assert alive.outcome == "running" and "still-here" in alive.output
        gone = lost.step("bash", {"command": "echo hello"})
        assert gone.done and gone.reward is None and gone.outcome == "infra_error", gone
    finally:
        kept.close()
        lost.close()
        heartbeats.close()


def test_reset_with_an_unknown_task_id_is_the_callers_error(sandbox_service, sandbox_client):
    session = _session(sandbox_service, sandbox_client, None)
    with pytest.raises(ValueError, match="no task 'swe-nope'"):
        session.reset(task_id="swe-nope")


@pytest.mark.parametrize("index", [2, 99999, -1])
def test_reset_with_an_out_of_range_task_index_is_the_callers_error(sandbox_service, sandbox_client, index):
    session = _session(sandbox_service, sandbox_client, None)  # 2 tasks: indexes 0 and 1
    with pytest.raises(ValueError, match=f"task_index {index} is out of range.* has 2 tasks, 0 to 1"):
        session.reset(task_index=index)
    assert session.sandbox is None  # nothing was created for it


def test_a_bash_command_too_long_to_run_is_the_policys_error_with_the_reason(sandbox_service, sandbox_client):
    """A 2 MB bash command answered only `[exit code None]`. Over the tool's schema bound it is refused before
    it runs; under it but over one argv string (128 KiB) the shell cannot start, and says why."""
    session = _session(sandbox_service, sandbox_client, None)
    try:
        assert session.reset(task_index=0).outcome == "running"
        out = session.step("bash", {"command": "echo " + "x" * 200_000})
        assert out.outcome == "running" and not out.done, out
        assert "Argument list too long" in out.output and "131072 bytes" in out.output
        assert "[exit code 126]" in out.output
        out = session.step("bash", {"command": "echo " + "x" * 2_000_000})
        assert out.outcome == "running" and out.policy_error and "at most 1000000 characters" in out.output, out
    finally:
        session.close()


def test_a_served_episode_blames_a_failed_tool_by_the_harness_rule(sandbox_service, sandbox_client):
    """The served environment (OpenEnv, TRL) ended an episode as an infrastructure error for any tool
    failure: a path the filesystem refuses (a 300-character directory name) or a recipe's tool raising
    was a dodge there. It now goes through the harness's one rule: the policy's error, the episode goes on."""
    session = _session(sandbox_service, sandbox_client, None)
    tools = session.recipe.execute_tool

    def raises(sandbox, task, call):  # on this argument only: the harness's health calls work
        if call.arguments.get("path") == "README.md":
            raise OSError(7, "Argument list too long")
        return tools(sandbox, task, call)

    try:
        assert session.reset(task_index=0).outcome == "running"
        out = session.step("write_file", {"path": "a" * 300 + "/x.py", "content": "x = 1\n"})
        assert out.outcome == "running" and out.policy_error and out.output.startswith("Error"), out
        session.recipe.execute_tool = raises  # this session's recipe only
        out = session.step("read_file", {"path": "README.md"})
        assert out.outcome == "running" and out.policy_error and "Argument list too long" in out.output, out
        del session.recipe.execute_tool
        assert session.step("submit", {}).outcome == "unresolved"
    finally:
        session.close()
