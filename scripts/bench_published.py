"""Exec latency through the published-API surface (`/published`, a job per exec) vs our native route, side by side.

python scripts/bench_published.py --n 300        # starts an embedded service (root); prints medians and p99
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx


def _time(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    from sandbox_service.embedded import EmbeddedService

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="execs per arm (interleaved in rounds of 10)")
    args = parser.parse_args(argv)
    with EmbeddedService() as service:
        native = httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {service.token}"}, timeout=30)
        pub = httpx.Client(base_url=service.url + "/published", headers={"X-API-Key": service.token}, timeout=30)
        sid = pub.post("/sandboxes", json={"image": "local"}).json()["sandbox_id"]
        pub.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})

        def run_native():
            assert native.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}).json()["exit_code"] == 0

        def run_published():
            body = {"command": ["true"], "wait": True}
            assert pub.post(f"/sandboxes/{sid}/exec", json=body).json()["status"] == "succeeded"

        times: dict[str, list[float]] = {"native /v1 exec": [], "published exec (wait: true)": []}
        for _ in range(5):  # warm-up
            run_native(), run_published()
        for _ in range(max(1, args.n // 10)):  # interleaved rounds, so load drifts hit both arms alike
            times["native /v1 exec"] += _time(run_native, 10)
            times["published exec (wait: true)"] += _time(run_published, 10)
        pub.delete(f"/sandboxes/{sid}")
    base = statistics.median(times["native /v1 exec"])
    for name, xs in times.items():
        xs.sort()
        p50, p99 = statistics.median(xs), xs[int(0.99 * (len(xs) - 1))]
        print(f"{name:30s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  ratio {p50 / base:4.2f}x  (n={len(xs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
