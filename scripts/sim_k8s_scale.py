"""Scale simulation of the Kubernetes backend against the in-process fake API server (no cluster).

    PYTHONPATH=$PWD python scripts/sim_k8s_scale.py                      # 1,000 creates at caps 50/150/1000
    PYTHONPATH=$PWD python scripts/sim_k8s_scale.py --creates 1000,5000  # also 5,000 (takes longer)

What runs: the real `KubernetesBackend.start()` (real `kubernetes` client, real HTTP on loopback) in a
pool of `cap` worker threads, as the service's create semaphore would, against `kubernetes_fake`
with: per-request latency, API Priority and Fairness-style throttling (requests beyond
`--inflight` in flight get 429 + Retry-After), pod start times from a log-normal distribution plus a
cold image pull for a fraction of pods, status lag (the kubelet reports Running late), and injected
transient CreateContainerErrors. Readiness is synthetic: a create ends when start() returns the pod
IP (no agent is pinged). Then a fresh backend plays a restarted service: it lists the orphans and
reaps them all (16 threads).

Modes: `watch` is the backend as built (one pod watch per backend); `poll` replaces only the wait for
Running with the previous backend's loop (a GET of the pod every 0.1 s doubling to 0.5 s), to show
what the watch saves. The warm pool of the issue is not built, so it has no row.

What this cannot show: a real API server's CPU, etcd, the scheduler, real image pulls or a CNI.
Figures depend on this machine's load: report /proc/loadavg with them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes import KubernetesBackend
from sandbox_service.backends.kubernetes_config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes_fake import FakeKubernetesAPI, running_status, waiting
from sandbox_service.backends.kubernetes_retry import is_not_found
from sandbox_service.models import Resources, SandboxCreate

SPEC = SandboxCreate(image="ghcr.io/example/swe-task:1", labels={"stage": "rl"})


class SimKubelet:
    """Pod start = log-normal start + (cold pull for some pods); reported `lag` late; some pods show a
    transient CreateContainerError first."""

    def __init__(self, seed: int, *, median: float, sigma: float, cold_fraction: float, cold_pull: tuple,
                 lag: float, error_fraction: float):
        self.rng = random.Random(seed)
        self.median, self.sigma, self.cold_fraction, self.cold_pull = median, sigma, cold_fraction, cold_pull
        self.lag, self.error_fraction = lag, error_fraction
        self.plan: dict[str, tuple[float, float, bool, str]] = {}  # name -> (seen at, ready at, flaky, IP)
        self.lock = threading.Lock()

    def __call__(self, pod: dict, ticks: int) -> dict | None:
        name = pod["metadata"]["name"]
        with self.lock:
            if name not in self.plan:
                delay = self.rng.lognormvariate(0, self.sigma) * self.median
                if self.rng.random() < self.cold_fraction:
                    delay += self.rng.uniform(*self.cold_pull)
                now, n = time.monotonic(), len(self.plan)
                self.plan[name] = (now, now + delay + self.lag, self.rng.random() < self.error_fraction,
                                   f"10.{n // 250 % 250}.{n % 250}.7")
        seen_at, ready_at, flaky, ip = self.plan[name]
        now = time.monotonic()
        if now >= ready_at:
            return running_status(pod, ip)
        if flaky and now < (seen_at + ready_at) / 2:
            return waiting("CreateContainerError", "failed to reserve container name")(pod, ticks)
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}


class PollingBackend(KubernetesBackend):
    """The previous backend's wait for Running: read the pod until it runs (kept here for comparison)."""

    def _wait_running(self, pod_name: str) -> str:
        deadline, delay = time.monotonic() + self.config.start_timeout_seconds, 0.1
        while time.monotonic() < deadline:
            pod = self._call("read pod", self.core.read_namespaced_pod, pod_name, self.config.namespace,
                             passthrough=is_not_found)
            seen = self._assess(pod)
            if seen.state == "running" and seen.pod_ip:
                return seen.pod_ip
            if seen.state == "failed":
                raise RuntimeError(seen.message)
            time.sleep(delay)
            delay = min(0.5, delay * 2)
        raise TimeoutError(pod_name)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else (values or [0])[0]


def run(creates: int, cap: int, mode: str, args: argparse.Namespace, tmp: Path) -> dict:
    fake = FakeKubernetesAPI(validate=False, tick_seconds=args.tick)
    fake.inflight_limit = args.inflight
    for method in ("POST", "PATCH", "DELETE", "GET", "PUT"):
        for kind in ("pods", "secrets", "networkpolicies"):
            fake.latency[(method, kind)] = args.latency
    fake.kubelet = SimKubelet(args.seed, median=args.start_median, sigma=0.5, cold_fraction=args.cold_fraction,
                              cold_pull=(2.0, 6.0), lag=args.status_lag, error_fraction=args.error_fraction)
    settings = dict(namespace="orchard", snapshot_dir=tmp / "snapshots", api_pool_size=max(cap, 16) + 8,
                    api_qps=args.qps, api_burst=args.burst, start_timeout_seconds=600, retry_attempts=8,
                    container_error_grace_seconds=30)

    def backend(cls=KubernetesBackend) -> KubernetesBackend:
        return cls(KubernetesBackendConfig(**settings), api_client=k8s.ApiClient(k8s.Configuration(host=fake.url)),
                   resolver=lambda h: ["93.184.216.34"])

    first = backend(PollingBackend if mode == "poll" else KubernetesBackend)
    t0 = time.monotonic()
    queued, started, failed = [], [], []

    def create(i: int) -> None:
        began = time.monotonic()
        queued.append(began - t0)
        try:
            first.start(f"sb-sim-{i:05d}", SPEC, Resources(), "secret")
            started.append(time.monotonic() - began)
        except Exception as err:  # noqa: BLE001 - counted, the run goes on
            failed.append(f"{type(err).__name__}: {err}"[:200])

    with ThreadPoolExecutor(cap) as pool:
        list(pool.map(create, range(creates)))
    burst_seconds = time.monotonic() - t0
    requests = [r for r in fake.requests if r["method"] != "WATCH"]
    n_requests, throttled = len(requests), fake.throttled
    bytes_out = fake.bytes_out
    first.close()  # the service dies; its pods stay

    restarted = backend()
    t1 = time.monotonic()
    orphans = restarted.list_orphans()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(restarted.stop, orphans))
    reap_seconds = time.monotonic() - t1
    left = len(fake.of_kind("pods"))
    restarted.close()
    fake.close()
    totals = [q + s for q, s in zip(queued, started)]
    return dict(creates=creates, cap=cap, mode=mode, ok=len(started), failed=len(failed),
                calls_per_sandbox=n_requests / creates, kib_per_sandbox=bytes_out / creates / 1024,
                throttled_pct=100 * throttled / max(1, n_requests),
                amplification=n_requests / max(1, n_requests - throttled),
                queue_mean=statistics.fmean(queued), start_mean=statistics.fmean(started or [0]),
                start_p99=pct(started, 99), create_mean=statistics.fmean(totals or [0]), burst_seconds=burst_seconds,
                reaped=len(orphans), reap_seconds=reap_seconds, pods_left=left, first_error=failed[0] if failed else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", default="1000", help="comma-separated numbers of creates")
    parser.add_argument("--caps", default="50,150,1000", help="comma-separated create caps (worker threads)")
    parser.add_argument("--modes", default="watch,poll")
    parser.add_argument("--latency", type=float, default=0.005, help="API server latency per request, s")
    parser.add_argument("--inflight", type=int, default=64, help="APF: concurrent requests before 429")
    parser.add_argument("--qps", type=float, default=200.0, help="the backend's client-side rate limit")
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--start-median", type=float, default=2.0, help="median pod start, s")
    parser.add_argument("--cold-fraction", type=float, default=0.1, help="pods whose image is pulled (2-6 s)")
    parser.add_argument("--status-lag", type=float, default=0.3, help="kubelet status lag, s")
    parser.add_argument("--error-fraction", type=float, default=0.05, help="pods with a transient CreateContainerError")
    parser.add_argument("--tick", type=float, default=0.1, help="fake kubelet status period, s")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(f"# load before: {open('/proc/loadavg').read().strip()}  cpus: {os.cpu_count()}", flush=True)
    print("| creates | cap | mode | ok/failed | API calls/sandbox | KiB/sandbox | 429 % | amplification | "
          "queue mean s | pod start mean / p99 s | create mean s | burst s | reap N after restart s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for creates in map(int, args.creates.split(",")):
            for cap in map(int, args.caps.split(",")):
                for mode in args.modes.split(","):
                    r = run(creates, cap, mode, args, Path(tmp))
                    print(f"| {r['creates']} | {r['cap']} | {r['mode']} | {r['ok']}/{r['failed']} | "
                          f"{r['calls_per_sandbox']:.1f} | {r['kib_per_sandbox']:.1f} | {r['throttled_pct']:.1f} | "
                          f"{r['amplification']:.2f} | {r['queue_mean']:.2f} | {r['start_mean']:.2f} / "
                          f"{r['start_p99']:.2f} | {r['create_mean']:.2f} | {r['burst_seconds']:.1f} | "
                          f"{r['reaped']} in {r['reap_seconds']:.1f} ({r['pods_left']} left) |", flush=True)
                    if r["first_error"]:
                        print(f"#   first failure: {r['first_error']}", file=sys.stderr)
    print(f"# load after: {open('/proc/loadavg').read().strip()}  at {datetime.now(timezone.utc):%H:%M} UTC")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
