"""`python -m sandbox_service.tools.bench [--quick]`: the sandbox service's figures, measured side by side.

1. exec latency of `true` through REST + agent (keep-alive client, one sandbox), interleaved call by
   call with a bare `subprocess.run(["true"])` on the host, so both see the same machine load:
   p50, p99 and the ratio of medians (targets: p50 <= 5 ms, ratio <= 2.5x); then the same
   pair paced, each call after a pause (an agent's tool calls come between generation turns, and the
   first exec after a pause is where per-exec kernel work that waits for an idle spell shows).
2. create-to-ready latency (POST until `wait` returns ready), p50 and p99.
3. stress: N sandboxes (1,000 by default) each created, running one exec, deleted, with bounded
   concurrency: success rate, wall time, commands per second, and what leaked (processes, mounts,
   cgroups under the service's state directory after it stopped; target 0).

Prints a table and writes the figures as JSON (default build/bench/sandbox_bench.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import psutil
from rich.console import Console
from tqdm import tqdm
from rich.table import Table

from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.models import SandboxCreate


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class _CpuMeter:
    """CPU seconds (user + system) of the service process and, separately, of everything below it
    (zygote, agents and the commands they reaped): wall latency alone means little on a loaded machine."""

    def __init__(self, service_url: str) -> None:
        port = int(service_url.rpartition(":")[2])
        self.service = next(
            p
            for p in psutil.Process().children()  # the one listening on our port
            if any(
                c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")
            )
        )
        self._procs = [self.service, *self.service.children(recursive=True)]

    def sample(self) -> tuple[float, float]:
        service = sandbox = 0.0
        for proc in self._procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            if proc.pid == self.service.pid:
                service += t.user + t.system  # not its children: those are the sandbox side
            else:
                sandbox += t.user + t.system + t.children_user + t.children_system
        return service, sandbox


def bench_exec(client, n: int) -> dict:
    with client.create(SandboxCreate(labels={"bench": "exec"})) as sb:
        for _ in range(min(50, n)):  # warm the connection pools on both hops
            sb.exec(["true"])
            subprocess.run(["true"])
        meter = _CpuMeter(client.base_url)  # after create: the sandbox's agent is a descendant by now
        rest, bare = [], []
        client_cpu = bare_cpu = 0.0
        service0, sandbox0 = meter.sample()
        children0 = os.times()
        for _ in range(n):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            result = sb.exec(["true"])
            t1 = time.perf_counter()
            c1 = time.thread_time()
            subprocess.run(["true"])
            t2 = time.perf_counter()
            c2 = time.thread_time()
            assert result.exit_code == 0, result
            rest.append(t1 - t0)
            bare.append(t2 - t1)
            client_cpu += c1 - c0
            bare_cpu += c2 - c1
        service1, sandbox1 = meter.sample()
        children1 = os.times()
    # The bare `true` children are this process's only reaped children during the loop.
    bare_cpu += (
        children1.children_user - children0.children_user + children1.children_system - children0.children_system
    )
    p50, bare50 = statistics.median(rest), statistics.median(bare)
    per = 1e3 / n
    cpu = {
        "client_ms": client_cpu * per,
        "service_ms": (service1 - service0) * per,
        "agent_and_command_ms": (sandbox1 - sandbox0) * per,
        "bare_ms": bare_cpu * per,
    }
    cpu["rest_total_ms"] = cpu["client_ms"] + cpu["service_ms"] + cpu["agent_and_command_ms"]
    cpu["ratio"] = cpu["rest_total_ms"] / cpu["bare_ms"] if cpu["bare_ms"] else float("nan")
    return {
        "n": n,
        "rest_p50_ms": p50 * 1e3,
        "rest_p99_ms": _pct(rest, 0.99) * 1e3,
        "rest_mean_ms": statistics.fmean(rest) * 1e3,
        "bare_p50_ms": bare50 * 1e3,
        "bare_p99_ms": _pct(bare, 0.99) * 1e3,
        "ratio_p50": p50 / bare50,
        "cpu_per_exec": cpu,
        "load_average": os.getloadavg(),
    }


def bench_paced_exec(client, n: int, pause: float) -> dict:
    """exec `true` and bare `subprocess.run(["true"])`, each after `pause` seconds of idleness."""
    with client.create(SandboxCreate(labels={"bench": "paced"})) as sb:
        sb.exec(["true"])
        rest, bare = [], []
        for _ in range(n):
            time.sleep(pause)
            t0 = time.perf_counter()
            result = sb.exec(["true"])
            rest.append(time.perf_counter() - t0)
            assert result.exit_code == 0, result
            time.sleep(pause)
            t0 = time.perf_counter()
            subprocess.run(["true"])
            bare.append(time.perf_counter() - t0)
    p50, bare50 = statistics.median(rest), statistics.median(bare)
    return {
        "n": n,
        "pause_seconds": pause,
        "rest_p50_ms": p50 * 1e3,
        "rest_p99_ms": _pct(rest, 0.99) * 1e3,
        "bare_p50_ms": bare50 * 1e3,
        "ratio_p50": p50 / bare50,
    }


def bench_create(client, n: int) -> dict:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        sb = client.create(SandboxCreate(labels={"bench": "create"}))
        times.append(time.perf_counter() - t0)
        sb.delete()
    return {"n": n, "p50_ms": statistics.median(times) * 1e3, "p99_ms": _pct(times, 0.99) * 1e3}


@contextlib.contextmanager
def _phase(console: Console, text: str) -> Iterator[None]:
    """Say which phase runs (a line, not a spinner: the project's one progress library is tqdm, for the bars)."""
    console.print(f"[dim]{text}[/]")
    yield


def bench_stress(service: EmbeddedService, n: int, concurrency: int, console: Console) -> dict:
    def one(i: int) -> bool:
        with service.client(timeout=120) as client:
            sb = client.create(SandboxCreate(labels={"bench": "stress"}), wait_timeout=300)
            try:
                return sb.exec(["echo", str(i)]).stdout == f"{i}\n"
            finally:
                sb.delete()

    ok = failed = 0
    errors: list[str] = []
    start = time.perf_counter()
    bar = tqdm(total=n, desc=f"stress: {n} sandboxes, concurrency {concurrency}", leave=False)
    with bar, ThreadPoolExecutor(concurrency) as pool:
        for future in as_completed(pool.submit(one, i) for i in range(n)):
            try:
                ok += bool(future.result())
                failed += not future.result()
            except Exception as err:  # noqa: BLE001 - counted and reported, not fatal
                failed += 1
                errors.append(f"{type(err).__name__}: {err}"[:200])
            bar.update(1)
    wall = time.perf_counter() - start
    with service.client() as client:
        live = len(client.list({"bench": "stress"}))
    return {
        "n": n,
        "concurrency": concurrency,
        "succeeded": ok,
        "failed": failed,
        "success_rate": ok / n,
        "wall_seconds": wall,
        "sandboxes_per_second": n / wall,
        "live_after": live,
        "errors": errors[:10],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run, ~30 s)")
    parser.add_argument("--execs", type=int, help="exec latency samples (default 2000, quick 300)")
    parser.add_argument("--paced", type=int, help="paced exec samples, 0.1 s apart (default 100, quick 20)")
    parser.add_argument("--creates", type=int, help="create-to-ready samples (default 100, quick 20)")
    parser.add_argument("--stress", type=int, help="stress sandboxes (default 1000, quick 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="stress concurrency")
    parser.add_argument(
        "--runtime",
        choices=["namespaces", "gvisor"],
        default="namespaces",
        help="local backend runtime (gvisor: runsc)",
    )
    parser.add_argument("--out", type=Path, default=Path("build/bench/sandbox_bench.json"))
    args = parser.parse_args(argv)
    n_exec = args.execs or (300 if args.quick else 2000)
    n_create = args.creates or (20 if args.quick else 100)
    n_paced = args.paced if args.paced is not None else (20 if args.quick else 100)
    n_stress = args.stress if args.stress is not None else (100 if args.quick else 1000)

    console = Console()
    figures: dict = {}
    service = EmbeddedService(ServiceConfig(token="unused", runtime=args.runtime), check_leaks=False)
    with _phase(console, "starting the service..."):
        service.start()
    try:
        with service.client() as client:
            with _phase(console, f"exec latency ({n_exec} samples)..."):
                figures["exec"] = bench_exec(client, n_exec)
            if n_paced:
                with _phase(console, f"paced exec latency ({n_paced} samples, 0.1 s apart)..."):
                    figures["paced_exec"] = bench_paced_exec(client, n_paced, 0.1)
            with _phase(console, f"create-to-ready ({n_create} samples)..."):
                figures["create"] = bench_create(client, n_create)
        if n_stress:
            figures["stress"] = bench_stress(service, n_stress, args.concurrency, console)
    finally:
        with _phase(console, "stopping the service, checking for leaks..."):
            service.stop()
    figures["leaks"] = {"count": len(service.leaks), "items": service.leaks[:20]}

    table = Table(title="sandbox service benchmark")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    e, c = figures["exec"], figures["create"]
    table.add_row("exec `true` p50 (REST+agent)", f"{e['rest_p50_ms']:.2f} ms", "<= 5 ms")
    table.add_row("exec `true` p99", f"{e['rest_p99_ms']:.2f} ms", "")
    table.add_row("bare subprocess.run p50", f"{e['bare_p50_ms']:.2f} ms", "")
    table.add_row("ratio of p50s", f"{e['ratio_p50']:.2f}x", "<= 2.5x")
    u = e["cpu_per_exec"]
    table.add_row(
        "CPU per exec: client / service / agent+command",
        f"{u['client_ms']:.2f} / {u['service_ms']:.2f} / {u['agent_and_command_ms']:.2f} ms",
        "",
    )
    table.add_row(
        "CPU per exec: REST total vs bare", f"{u['rest_total_ms']:.2f} vs {u['bare_ms']:.2f} ms ({u['ratio']:.2f}x)", ""
    )
    if "paced_exec" in figures:
        pe = figures["paced_exec"]
        table.add_row(
            "exec `true` p50 after 0.1 s idle vs bare",
            f"{pe['rest_p50_ms']:.2f} vs {pe['bare_p50_ms']:.2f} ms ({pe['ratio_p50']:.2f}x)",
            "<= 2.5x",
        )
    table.add_row("load average during exec (1/5/15 min)", " / ".join(f"{x:.1f}" for x in e["load_average"]), "")
    table.add_row("create-to-ready p50 / p99", f"{c['p50_ms']:.0f} / {c['p99_ms']:.0f} ms", "p50 <= 50 ms")
    if "stress" in figures:
        s = figures["stress"]
        table.add_row(
            f"stress {s['n']} sandboxes (concurrency {s['concurrency']})",
            f"{s['success_rate'] * 100:.1f} % in {s['wall_seconds']:.1f} s",
            "100 %",
        )
        table.add_row("stress throughput", f"{s['sandboxes_per_second']:.1f} sandboxes/s", ">= 20/s")
    table.add_row("leaked processes/mounts/cgroups", str(figures["leaks"]["count"]), "0")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    console.print(f"figures written to {args.out}")
    return figures


if __name__ == "__main__":
    main()
