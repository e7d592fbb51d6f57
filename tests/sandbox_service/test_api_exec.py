"""Exec through REST + agent: exit codes, shells, stdin/env/cwd, timeouts with tree kill, output caps."""

from __future__ import annotations

import time

from sandbox_service.models import ExecOutcome, SandboxCreate


def test_exit_codes_and_outcomes(module_sandbox):
    ok = module_sandbox.exec(["true"])
    assert ok.exit_code == 0 and ok.outcome is ExecOutcome.ok and ok.infra_error is None
    failed = module_sandbox.exec("echo out; echo err >&2; exit 7")
    assert failed.exit_code == 7 and failed.outcome is ExecOutcome.command_failed
    assert failed.stdout == "out\n" and failed.stderr == "err\n"
    assert not failed.is_infra_error  # a failing command is the policy's failure, not the infrastructure's
    killed = module_sandbox.exec("kill -TERM $$")
    assert killed.exit_code == -15 and killed.outcome is ExecOutcome.command_failed
    missing = module_sandbox.exec(["/no/such/binary"])
    assert missing.outcome is ExecOutcome.command_failed and not missing.is_infra_error


def test_a_command_line_too_long_to_exec_says_so_as_a_shell_would(module_sandbox):
    """A 2 MB bash command came back as exit code None with empty output ("Argument list too long" lost)."""
    for command in (["bash", "-c", "echo " + "x" * 2_000_000], "echo " + "x" * 200_000):
        result = module_sandbox.exec(command)
        assert result.exit_code == 126 and result.outcome is ExecOutcome.command_failed, result
        assert "Argument list too long" in result.stderr and "at most 131072 bytes in one argument" in result.stderr
        assert not result.is_infra_error
    assert module_sandbox.exec(["echo", "x" * 100_000]).exit_code == 0  # under the limit: runs


def test_argv_is_not_a_shell_but_a_string_is(module_sandbox):
    assert module_sandbox.exec(["echo", "$HOME", "a b"]).stdout == "$HOME a b\n"
    assert module_sandbox.exec("printf '%s|' a 'b c'").stdout == "a|b c|"


def test_stdin_env_and_cwd(sandbox_client, labels):
    spec = SandboxCreate(labels=labels, env={"BASE": "from-spec", "OVERRIDE": "spec"}, workdir="/workspace/proj")
    with sandbox_client.create(spec) as sb:
        assert sb.exec("pwd").stdout == "/workspace/proj\n"  # the spec's workdir is the default cwd
        assert sb.exec(["cat"], stdin="piped text").stdout == "piped text"
        env = sb.exec("echo $BASE $OVERRIDE $EXTRA", env={"OVERRIDE": "call", "EXTRA": "x"}).stdout
        assert env == "from-spec call x\n"
        sb.exec("mkdir -p sub")
        assert sb.exec("pwd", cwd="/workspace/proj/sub").stdout == "/workspace/proj/sub\n"


def test_timeout_kills_the_whole_process_tree(module_sandbox):
    start = time.monotonic()
    result = module_sandbox.exec("(sleep 300 & echo $! > /workspace/grandchild.pid; wait) & sleep 300", timeout=1.0)
    assert time.monotonic() - start < 10
    assert result.outcome is ExecOutcome.command_timeout and not result.is_infra_error
    assert "timeout" in (result.message or "")
    pid = module_sandbox.read_text("/workspace/grandchild.pid").strip()
    # The grandchild (in its own subshell, backgrounded) must be gone too.
    alive = module_sandbox.exec(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone").stdout
    assert alive == "gone\n"


def test_huge_output_is_truncated_at_the_cap(module_sandbox):
    big = module_sandbox.exec(
        "head -c 5000000 /dev/zero | tr '\\0' a; head -c 3000 /dev/zero >&2", max_output_bytes=1000
    )
    assert big.exit_code == 0
    assert big.stdout_truncated and len(big.stdout) <= 1000 and set(big.stdout) == {"a"}
    assert big.stderr_truncated and len(big.stderr) <= 1000
    small = module_sandbox.exec("echo short", max_output_bytes=1000)
    assert not small.stdout_truncated and small.stdout == "short\n"
    # Without a per-call cap the service default (1 MB) applies.
    default = module_sandbox.exec("head -c 3000000 /dev/zero | tr '\\0' b")
    assert default.stdout_truncated and 0 < len(default.stdout) <= 1_000_000


def test_duration_is_measured(module_sandbox):
    result = module_sandbox.exec("sleep 0.3")
    assert 0.25 <= result.duration_seconds < 5


def test_a_nul_byte_in_env_argv_or_cwd_is_a_400_not_a_backend_failure(sandbox_client, module_sandbox, labels):
    """A NUL in a create's env value was retried as a backend failure (4 attempts, then
    BackendUnavailable); in an exec it cannot reach execve either."""
    import pytest

    from sandbox_service.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="NUL"):
        sandbox_client.create(SandboxCreate(labels=labels, env={"A": "x\0y"}), wait_timeout=60)
    with pytest.raises(InvalidRequestError, match="env name"):
        sandbox_client.create(SandboxCreate(labels=labels, env={"A=B": "x"}), wait_timeout=60)
    assert sandbox_client.list(labels) == []  # refused up front: nothing was created and retried
    for kw in ({"env": {"A": "x\0y"}}, {"cwd": "/tmp\0x"}):
        with pytest.raises(InvalidRequestError, match="NUL"):
            module_sandbox.exec("true", **kw)
        with pytest.raises(InvalidRequestError, match="NUL"):
            module_sandbox.exec_async("true", **kw)
    with pytest.raises(InvalidRequestError, match="NUL"):
        module_sandbox.exec(["echo", "a\0b"])
    assert module_sandbox.exec("echo still-fine").stdout == "still-fine\n"
