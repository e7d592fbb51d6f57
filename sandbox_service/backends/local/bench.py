"""`python -m sandbox_service.backends.local.bench`: the local backend and agent without the REST layer.

Measured side by side in one run (medians and p99): a bare `subprocess.run(["true"])`, `true` through
the agent of an isolated sandbox, the agent's ping round trip, and create-to-ready (start() until the
agent answers) followed by stop(). The REST figures are `python -m sandbox_service.tools.bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from sandbox_service.agent_link.client import AgentClient
from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig
from sandbox_service.models import ExecRequest, SandboxCreate


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": s[len(s) // 2] * 1000, "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1000}


async def _agent_samples(backend: LocalBackend, n: int) -> tuple[list[float], list[float]]:
    spec = SandboxCreate()
    endpoint = backend.start("bench-exec", spec, spec.resources, secrets.token_hex(16))
    client = AgentClient(endpoint)
    try:
        execs, pings = [], []
        for _ in tqdm(range(n), desc="agent exec", leave=False):
            t = time.perf_counter()
            await client.exec(ExecRequest(command=["true"]), workdir="/workspace", env={}, max_output_bytes=1 << 16)
            execs.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.ping()
            pings.append(time.perf_counter() - t)
        return execs, pings
    finally:
        await client.close()
        backend.stop("bench-exec")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--execs", type=int, default=500, help="exec samples")
    p.add_argument("--creates", type=int, default=30, help="create-to-ready samples")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    state = tempfile.mkdtemp(prefix="orbench", dir="/tmp")
    backend = LocalBackend(LocalBackendConfig(state_dir=state))
    try:
        bare = []
        for _ in tqdm(range(args.execs), desc="bare subprocess", leave=False):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            bare.append(time.perf_counter() - t)
        execs, pings = asyncio.run(_agent_samples(backend, args.execs))
        spec = SandboxCreate()
        creates, stops = [], []
        for i in tqdm(range(args.creates), desc="create/stop", leave=False):
            t = time.perf_counter()
            endpoint = backend.start(f"bench-{i}", spec, spec.resources, secrets.token_hex(16))
            asyncio.run(AgentClient(endpoint).ping(timeout=5))
            creates.append(time.perf_counter() - t)
            t = time.perf_counter()
            backend.stop(f"bench-{i}")
            stops.append(time.perf_counter() - t)
    finally:
        backend.close()
        shutil.rmtree(state, ignore_errors=True)
    figures: dict[str, Any] = {  # each sample's stats, and the exec ratio (a number)
        "bare_subprocess": _stats(bare),
        "agent_exec": _stats(execs),
        "agent_ping": _stats(pings),
        "create_to_ready": _stats(creates),
        "stop": _stats(stops),
    }
    figures["exec_ratio_p50"] = figures["agent_exec"]["p50_ms"] / figures["bare_subprocess"]["p50_ms"]
    table = Table(title="local backend + agent (no REST)")
    for col in ("figure", "p50", "p99"):
        table.add_column(col)
    for name in ("bare_subprocess", "agent_exec", "agent_ping", "create_to_ready", "stop"):
        table.add_row(name, f"{figures[name]['p50_ms']:.2f} ms", f"{figures[name]['p99_ms']:.2f} ms")
    table.add_row("agent exec / bare (p50)", f"{figures['exec_ratio_p50']:.2f}x", "")
    Console().print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
