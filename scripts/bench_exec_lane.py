"""Exec latency and CPU per exec with the client's keep-alive lane vs httpx, side by side in one run.

    python scripts/bench_exec_lane.py [--rounds 3] [--execs 1000]

One service, one sandbox; each round runs `sandbox_service.tools.bench.bench_exec` (an exec of `true` interleaved
with a bare `subprocess.run(["true"])`) first through httpx (the lane switched off), then through the lane.
Prints one line per arm and round, then the medians of the p50 ratios; `--out` writes all figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from sandbox_service.tools.bench import bench_exec
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService

ARMS = ("httpx", "lane")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--execs", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("build/bench/exec_lane.json"))
    args = parser.parse_args(argv)
    figures: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with EmbeddedService(ServiceConfig(token="unused"), check_leaks=False) as service, service.client() as client:
        lane = client._lane
        if lane is None:
            raise SystemExit("the client got no keep-alive lane (a proxy variable in the environment?)")
        try:
            for _ in range(args.rounds):
                for arm in ARMS:
                    client._lane = lane if arm == "lane" else None
                    f = bench_exec(client, args.execs)
                    figures[arm].append(f)
                    u = f["cpu_per_exec"]
                    print(
                        f"{arm:5s} p50 {f['rest_p50_ms']:.2f} ms, bare {f['bare_p50_ms']:.2f} ms, ratio "
                        f"{f['ratio_p50']:.2f}x | CPU per exec: client {u['client_ms']:.2f}, service "
                        f"{u['service_ms']:.2f}, agent+command {u['agent_and_command_ms']:.2f}, bare "
                        f"{u['bare_ms']:.2f} ms | load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
        finally:
            client._lane = lane
    summary = {
        arm: {
            "median_ratio_p50": statistics.median(f["ratio_p50"] for f in figures[arm]),
            "median_client_cpu_ms": statistics.median(f["cpu_per_exec"]["client_ms"] for f in figures[arm]),
        }
        for arm in ARMS
    }
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rounds": figures, "summary": summary}, indent=1))
    return summary


if __name__ == "__main__":
    main()
