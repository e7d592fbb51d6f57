"""The published SDK's own benchmarks, unmodified, against a fresh service; ours beside the published figures.

    git clone https://github.com/microsoft/Orchard /tmp/Orchard            # their SDK and benchmarks
    python scripts/bench_published_sdk.py --sdk /tmp/Orchard/orchard_env --num 10 100 1000 [--pty]

For each N it starts an embedded service (root) with `published_unrestricted_egress` on (their benchmark
creates with `block_network=false`), runs `tests/integration/bench_concurrent.py --num N` from their
checkout exactly as shipped (`--pty`: also `bench_concurrent_pty.py`), and prints the wall time, create and
command means, commands per second and the success rate next to what the published system reports for
1,000 sandboxes on 8 x 32 vCPU, and the CPU per sandbox of each part (`sandbox_service/tools/cpu_accounting.py`):
their client, our service's own threads, the helpers it ran (`ip`, `nsenter`), the agent zygote, and the
sandboxes (agents, their four commands, namespaces), so "ours" (service + helpers + zygote) reads apart
from the work their commands ask for.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# microsoft/Orchard's reported run of bench_concurrent.py at N = 1,000 (8 nodes x 32 vCPU).
PUBLISHED = {"num": 1000, "total_s": 26.0, "create_mean_s": 11.75, "command_mean_s": 0.28, "commands_per_s": 154.0}


def _summary(timing: dict) -> dict:
    records = timing["records"]
    creates = [r["duration"] for r in records if r["operation"] == "create"]
    commands = [r["duration"] for r in records if r["operation"].startswith("exec_")]
    return {
        "total_s": timing["total_time"],
        "create_mean_s": statistics.fmean(creates) if creates else None,
        "command_mean_s": statistics.fmean(commands) if commands else None,
        "commands_per_s": len(commands) / timing["total_time"] if timing["total_time"] else None,
        "success": sum(r["success"] for r in records) / len(records) if records else 0.0,
    }


def _run(sdk: Path, script: str, url: str, token: str, num: int, extra: list[str]) -> subprocess.CompletedProcess:
    # Their scripts import `tests.integration...` from their checkout: keep our own PYTHONPATH out of it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SANDBOX_API_KEY": token}
    return subprocess.run(
        [sys.executable, f"tests/integration/{script}", "--url", url, "--num", str(num), *extra],
        cwd=sdk,
        env=env,
        capture_output=True,
        text=True,
    )


def _children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fmt(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f} {unit}".strip()


def main(argv: list[str] | None = None) -> int:
    from sandbox_service.config import ServiceConfig
    from sandbox_service.tools.cpu_accounting import TreeCpu
    from sandbox_service.embedded import EmbeddedService

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sdk",
        type=Path,
        required=True,
        help="the orchard_env directory of a microsoft/Orchard checkout (holds tests/integration/)",
    )
    parser.add_argument("--num", type=int, nargs="+", default=[10, 100], help="sandbox counts to run")
    parser.add_argument("--pty", action="store_true", help="also run bench_concurrent_pty.py")
    args = parser.parse_args(argv)
    if not (args.sdk / "tests" / "integration" / "bench_concurrent.py").exists():
        print(
            f"bench_published_sdk: {args.sdk} has no tests/integration/bench_concurrent.py; pass the "
            "orchard_env directory of a microsoft/Orchard checkout",
            file=sys.stderr,
        )
        return 2
    rows, failed = [], False
    for num in args.num:
        service = EmbeddedService(ServiceConfig(token="unused", published_unrestricted_egress=True))
        service.start()
        meter = TreeCpu(service.pid)  # before their first create: the service's whole tree is counted
        try:
            with tempfile.TemporaryDirectory() as tmp:
                timing_file = Path(tmp) / "timing.json"
                started, cpu0, client0 = time.monotonic(), meter.sample(), _children_seconds()
                run = _run(
                    args.sdk,
                    "bench_concurrent.py",
                    service.url + "/published",
                    service.token,
                    num,
                    ["--save-timing", str(timing_file)],
                )
                spent, client = meter.sample() - cpu0, _children_seconds() - client0
                if run.returncode != 0 or not timing_file.exists():
                    print(
                        f"N={num}: bench_concurrent.py exited {run.returncode}:\n"
                        f"{run.stdout[-2000:]}{run.stderr[-2000:]}"
                    )
                    failed = True
                    continue
                per = 1e3 / num
                rows.append(
                    {
                        "num": num,
                        **_summary(json.loads(timing_file.read_text())),
                        "wall_s": time.monotonic() - started,
                        "cpu_ms_per_sandbox": {
                            "their_client": client * per,
                            "service": spent.service * per,
                            "helpers": spent.service_children * per,
                            "zygote": spent.zygote * per,
                            "sandboxes": spent.sandboxes * per if spent.sandboxes is not None else None,
                            "ours": (spent.service + spent.service_children + spent.zygote) * per,
                            "machine": spent.machine * per,
                        },
                    }
                )
                if args.pty:
                    pty = _run(args.sdk, "bench_concurrent_pty.py", service.url + "/published", service.token, num, [])
                    counts = [tuple(map(int, m)) for m in re.findall(r"Success: (\d+)\s+Failed: (\d+)", pty.stdout)]
                    ok, bad = sum(c[0] for c in counts), sum(c[1] for c in counts)
                    total = re.search(r"Total test time: ([\d.]+)s", pty.stdout)
                    print(
                        f"N={num} PTY: exit {pty.returncode}, {total.group(1) if total else '?'} s, "
                        f"{ok}/{ok + bad} operations succeeded"
                    )
        finally:
            service.stop()
            meter.close()
    print(f"\n{'':>22}{'N':>6}{'total':>10}{'create mean':>13}{'command mean':>14}{'commands/s':>12}{'success':>9}")
    for row in rows:
        print(
            f"{'ours (this machine)':>22}{row['num']:>6}{_fmt(row['total_s']):>10}{_fmt(row['create_mean_s']):>13}"
            f"{_fmt(row['command_mean_s']):>14}{_fmt(row['commands_per_s'], ''):>12}{row['success']:>9.1%}"
        )
    p = PUBLISHED
    print(
        f"{'published (8x32 vCPU)':>22}{p['num']:>6}{_fmt(p['total_s']):>10}{_fmt(p['create_mean_s']):>13}"
        f"{_fmt(p['command_mean_s']):>14}{_fmt(p['commands_per_s'], ''):>12}{'':>9}"
    )
    print(
        f"\nCPU per sandbox (ms): {'their client':>13}{'service':>9}{'helpers':>9}{'zygote':>8}{'ours':>7}"
        f"{'sandboxes':>11}{'machine':>9}"
    )
    for row in rows:
        c = row["cpu_ms_per_sandbox"]
        print(
            f"{'N=' + str(row['num']):>20} {c['their_client']:>13.1f}{c['service']:>9.1f}{c['helpers']:>9.1f}"
            f"{c['zygote']:>8.1f}{c['ours']:>7.1f}{_fmt(c['sandboxes'], ''):>11}{c['machine']:>9.1f}"
        )
    print(
        f"(this machine: {os.cpu_count()} CPUs, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}; ours = service "
        "+ helpers + zygote; sandboxes = agents, their commands and namespaces; machine = every CPU, neighbours "
        "included)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
