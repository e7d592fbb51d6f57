"""The episode core under every adapter: heartbeats keep an idle episode's sandbox, and losing it is an
infrastructure failure, not a reward."""

from __future__ import annotations

import time

import pytest

from components.envs.session import EnvConfig, Heartbeats, RecipeSession


def _session(sandbox_service, sandbox_client, heartbeats):
    config = EnvConfig(recipe="swe", num_tasks=2, fork_setup=False, sandbox_heartbeat_ttl_seconds=1.5,
                       service=sandbox_service.connection())
    return RecipeSession(config, client=sandbox_client, heartbeats=heartbeats)


def test_heartbeats_keep_an_idle_episode_alive_and_without_them_it_is_an_infra_error(sandbox_service,
                                                                                     sandbox_client):
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
    """A 2 MB bash command answered only `[exit code None]`."""
    session = _session(sandbox_service, sandbox_client, None)
    try:
        assert session.reset(task_index=0).outcome == "running"
        out = session.step("bash", {"command": "echo " + "x" * 2_000_000})
        assert out.outcome == "running" and not out.done, out
        assert "Argument list too long" in out.output and "131072 bytes" in out.output
        assert "[exit code 126]" in out.output
    finally:
        session.close()
