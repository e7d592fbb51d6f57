"""Attacks from inside real sandboxes against the real service (issue 13): each test is one attack class
that a policy under RL pressure could use to escape, read what it must not, or pass its own failures
off as the infrastructure's."""

from __future__ import annotations

import signal
import time

from sandbox_service.models import ExecOutcome, SandboxCreate


def _agent_start_time(sb) -> str:
    return sb.exec("cut -d' ' -f22 /proc/1/stat").stdout.strip()


def test_agent_survives_every_signal_a_sandbox_process_can_send(sandbox_client, labels):
    """`kill -INT 1` used to end the agent, and the exec passed for SANDBOX_CRASHED (an infra error)."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        born = _agent_start_time(sb)
        sigs = " ".join(str(int(s)) for s in sorted(signal.valid_signals()) if 0 < int(s) < 65)
        result = sb.exec(f"for s in {sigs}; do kill -$s 1 2>/dev/null; done; kill -INT 1; echo sent")
        assert result.outcome is ExecOutcome.ok and result.stdout == "sent\n", result
        after = sb.exec("echo alive")
        assert after.ok and after.stdout == "alive\n", after
        assert _agent_start_time(sb) == born  # the same agent, not a recreated sandbox
        assert sb.refresh().escalations == []


# A process in the sandbox that swaps `d` (a real directory) and `l` (a symlink out of the workspace)
# atomically, as fast as it can (renameat2 RENAME_EXCHANGE), for `seconds`.
FLIPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace/race")
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    libc.renameat2(-100, b"d", -100, b"l", 2)
    n += 1
print(n)
"""


def _race(sb, target: str, seconds: float = 4.0):
    sb.exec(f"mkdir -p /workspace/race/d && echo inside > /workspace/race/d/secret && "
            f"ln -sfn {target} /workspace/race/l")
    sb.write_file("/workspace/flip.py", FLIPPER)
    return sb.exec_async(["python3", "/workspace/flip.py", str(seconds)], timeout=seconds + 30)


def test_file_routes_never_follow_a_symlink_swapped_in_during_the_call(sandbox_client, labels):
    """The agent used to check a resolved path and open the unresolved one: a directory swapped for a
    symlink in between let reads, writes and listings of the API land outside the workspace."""
    from sandbox_service.errors import SandboxServiceError

    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        sb.exec("mkdir -p /tmp/out && echo OUTSIDE > /tmp/out/secret && touch /tmp/out/outside-marker")
        job = _race(sb, "/tmp/out")
        leaks, refused, served = [], 0, 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                if sb.read_text("/workspace/race/d/secret").strip() == "OUTSIDE":
                    leaks.append("read /tmp/out/secret")
                sb.write_file("/workspace/race/d/written.txt", "from the API")
                if any(e.name == "outside-marker" for e in sb.list_files("/workspace/race/d")):
                    leaks.append("listed /tmp/out")
                served += 1
            except SandboxServiceError as err:
                assert err.status_code in (400, 404), err  # refused or not there mid-swap: never a 500
                refused += 1
        sandbox_client.wait_job(job.id, timeout=60)
        outside = sb.exec("ls /tmp/out").stdout.split()
        assert "written.txt" not in outside, "a write landed outside the workspace"
        assert not leaks, f"{len(leaks)} escapes, e.g. {leaks[:3]}"
        assert served + refused > 20


def test_exec_cwd_cannot_go_through_the_agents_magic_links(sandbox_client, labels):
    """`cwd=/proc/1/fd/N` (the agent's own fds: its host cgroup directories) used to start the command
    in a host directory, from where it could write another sandbox's cgroup limits."""
    from sandbox_service.errors import PathOutsideSandboxError, SandboxServiceError

    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        sb.exec("ln -sfn /proc/1/fd/3 /workspace/fd3; ln -sfn /proc/1/root /workspace/agentroot")
        cwds = [f"/proc/1/fd/{n}" for n in range(0, 16)] + ["/proc/1/root", "/proc/1/cwd", "/workspace/fd3",
                                                             "/workspace/agentroot", "/proc/self/root"]
        refused = 0
        for cwd in cwds:
            try:
                r = sb.exec("pwd -P; ls", cwd=cwd)
            except PathOutsideSandboxError:
                refused += 1
                continue
            except SandboxServiceError as err:
                assert err.status_code in (400, 404), err
                continue
            assert "cgroup.procs" not in r.stdout and "tasks" not in r.stdout.split(), (cwd, r.stdout)
        assert refused >= 5  # every magic link is refused, not just failing to exist
        assert sb.exec("pwd", cwd="/tmp").stdout == "/tmp\n"  # plain directories anywhere still work
        assert sb.exec("pwd").stdout == "/workspace\n"
