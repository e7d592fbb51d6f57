"""`python -m sandbox_service.tools.demo`: a two-minute tour of the sandbox service, for people.

Starts the real service (`EmbeddedService`), then: create two sandboxes, exec, files, what isolation
looks like from inside, a snapshot and a fork, an async job, and delete, with a table of what happened.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from sandbox_service.embedded import EmbeddedService
from sandbox_service.errors import PathOutsideSandboxError
from sandbox_service.models import SandboxCreate


def main() -> None:
    console = Console()
    table = Table(title="orchard sandbox service: demo", show_lines=False)
    table.add_column("step", style="bold")
    table.add_column("what happened")
    table.add_column("ms", justify="right")

    def step(name: str, fn):
        start = time.perf_counter()
        detail = fn()
        table.add_row(name, str(detail), f"{(time.perf_counter() - start) * 1000:.1f}")
        return detail

    console.print("[dim]starting the sandbox service...[/]")
    service = EmbeddedService().__enter__()
    try:
        with service.client() as client:
            a = client.create(SandboxCreate(labels={"demo": "a"}))
            b = client.create(SandboxCreate(labels={"demo": "b"}))
            table.add_row("create", f"{a.id} and {b.id} ready ({a.info.backend} backend)", "")

            def run_exec() -> str:
                r = a.exec("echo hello from $(hostname); exit 3")
                return f"exit {r.exit_code}, stdout {r.stdout.strip()!r}, outcome {r.outcome.value} (the command's)"

            step("exec", run_exec)
            step(
                "write + read",
                lambda: (a.write_file("/workspace/hello.txt", "hi"), a.read_text("/workspace/hello.txt"))[1],
            )

            def traversal() -> str:
                try:
                    a.read_file("../../etc/shadow")
                except PathOutsideSandboxError as err:
                    return f"refused: {err.code} (HTTP {err.status_code})"
                return "NOT refused"

            step("path traversal", traversal)
            step(
                "isolation: files",
                lambda: "b tries a's file: " + b.exec("cat /workspace/hello.txt 2>&1 || true").stdout.strip(),
            )
            step(
                "isolation: processes",
                lambda: (
                    "processes visible inside a: "
                    + a.exec("ps -e -o pid=,comm= 2>/dev/null | tr -s ' ' | paste -sd, || ls /proc").stdout.strip()
                ),
            )
            probe = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\" 2>&1 | tail -1"
            step("isolation: network", lambda: a.exec(probe).stdout.strip())
            snap = a.snapshot()
            table.add_row("snapshot", f"{snap.id} ({snap.size_bytes} bytes of a's writable layer)", "")
            fork = client.create(SandboxCreate(labels={"demo": "fork"}, from_snapshot=snap.id))
            step("fork from snapshot", lambda: f"{fork.id} reads: {fork.read_text('/workspace/hello.txt')!r}")
            job = a.exec_async("sleep 0.5; echo background done")
            step("async job", lambda: client.wait_job(job.id, timeout=30).result.stdout.strip())
            for sb in (a, b, fork):
                sb.delete()
            step("delete", lambda: f"states: {[client.get(s.id).state.value for s in (a, b, fork)]}")
    finally:
        console.print("[dim]stopping the service and checking for leaks...[/]")
        service.__exit__(None, None, None)
    table.add_row("cleanup", f"leaked resources after stop: {len(service.leaks)}", "")
    console.print(table)


if __name__ == "__main__":
    main()
