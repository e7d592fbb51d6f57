"""Create-to-ready with the published API's unrestricted-egress allowlist (116 routes) vs no network.

    python scripts/bench_allowlist_create.py [N]

For each policy: 2 warm-up creates, then N creates (each deleted before the next); prints, as JSON, the wall
p50 and the service's CPU per create (its own plus its reaped children: `ip`, `nsenter`, `sh`). CPU, not
wall, is the figure to compare on a shared machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import psutil

from sandbox_service.compat.egress import unrestricted_egress
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.models import SandboxCreate


def main(n: int = 20) -> dict:
    out = {}
    with EmbeddedService(ServiceConfig(token="unused"), check_leaks=False) as service, service.client() as client:
        proc = max(psutil.Process().children(), key=lambda p: p.create_time())  # the service just started

        def cpu() -> float:
            t = proc.cpu_times()
            return t.user + t.system + t.children_user + t.children_system

        for name, extra in (("none", {}), ("allowlist116", {"network": unrestricted_egress()})):
            for _ in range(2):
                client.create(SandboxCreate(labels={"bench": "allowlist"}, **extra)).delete()
            walls, c0 = [], cpu()
            for _ in range(n):
                t0 = time.perf_counter()
                sandbox = client.create(SandboxCreate(labels={"bench": "allowlist"}, **extra))
                walls.append(time.perf_counter() - t0)
                sandbox.delete()
            out[name] = {
                "wall_p50_ms": round(statistics.median(walls) * 1e3, 1),
                "service_cpu_ms": round((cpu() - c0) / n * 1e3, 1),
            }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
