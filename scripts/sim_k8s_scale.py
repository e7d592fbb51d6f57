"""Scale simulation of the Kubernetes backend against the in-process fake API server (no cluster).

    PYTHONPATH=$PWD nice -n 15 python scripts/sim_k8s_scale.py                  # 1,000 creates, caps 50/150/1000
    PYTHONPATH=$PWD nice -n 15 python scripts/sim_k8s_scale.py --creates 5000 --time-scale 0.25

What runs: the real `KubernetesBackend.start()` (real `kubernetes` client, real HTTP on loopback) in a
pool of `cap` worker threads, as the service's create semaphore would, against `kubernetes_fake`
with: per-request latency, API Priority and Fairness-style throttling (requests beyond
`--inflight` in flight get 429 + Retry-After), pod start times from a log-normal distribution plus a
cold image pull for a fraction of pods, status lag (the kubelet reports Running late), and injected
transient CreateContainerErrors. Readiness is synthetic but goes through the same steps as the
service's: after start() returns, a stub agent (`StubAgent`, no process, no network) is pinged the way
`service._await_agent` pings (5 ms doubling to 100 ms) until it answers; it answers once the pod has
run for an agent boot time, and only to the key in the pod's Secret in the fake (or the key a warm pool
claim re-keyed it to). A create = queueing (waiting for a create slot) + start (pod start + readiness).
During the burst an asyncio loop runs a stub exec (nominal 5 ms) every 20 ms on a ready sandbox:
its p99 is the service-side stall a burst causes (GIL and loop contention from the backend's threads),
not an agent's latency. Then a fresh backend plays a restarted service and times `adopt()` (one LIST
per kind; claimed warm pods are adopted like any sandbox); a second one, with adoption off, lists the
orphans and reaps all of them (16 threads).

Modes (comma-separated, combinable): `watch` is the backend as built (one pod watch per backend);
`poll` replaces only the wait for Running with the previous backend's loop (a GET of the pod every
0.1 s doubling to 0.5 s), to show what the watch saves; `+pool` adds a warm pool of `--pool-size` pods
for the burst's spec, filled before the burst starts (its fill is not in the create times, its refill
during the burst is in the API counts).

`--time-scale S` multiplies every simulated delay (latency, pod start, pull, status lag, agent boot,
exec, kubelet tick) by S so a large run fits a shared machine; times in the table are then wall
seconds of the scaled run (divide by S for the unscaled world, which overstates the CPU-bound part);
Retry-After stays 1 s (the API server sends whole seconds).

The fake keeps indexes (kubernetes_fake_store: by kind, label and owner) and its kubelet visits a pod
only when its next transition is due (`SimKubelet.revisit`), so the fake's own work per request and per
pod stays constant as N grows and what grows with N is the backend's. Profile a run with a pinned
py-spy outside the project's venv (`pip install --target /tmp/pyspy py-spy==0.4.3`, then
`/tmp/pyspy/bin/py-spy record -r 3 -t -f raw -o prof.txt --nonblocking -- python scripts/sim_k8s_scale.py ...`).

What this cannot show: a real API server's CPU, etcd, the scheduler, real image pulls or a CNI.
Figures depend on this machine's load: report /proc/loadavg with them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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

from sandbox_service.agent_link.base import AgentClientBase, AgentUnreachableError
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.backends.kubernetes.backend import KubernetesBackend
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.decode import FastApiClient
from sandbox_service.backends.kubernetes.testing.fake import FakeKubernetesAPI, running_status, waiting
from sandbox_service.backends.kubernetes.retry import is_not_found
from sandbox_service.models import ExecOutcome, ExecRequest, ExecResult, Resources, SandboxCreate

SPEC = SandboxCreate(image="ghcr.io/example/swe-task:1", labels={"stage": "rl"})


class SimKubelet:
    """Pod start = log-normal start + (cold pull for some pods); reported `lag` late; some pods show a
    transient CreateContainerError first."""

    def __init__(
        self,
        seed: int,
        *,
        median: float,
        sigma: float,
        cold_fraction: float,
        cold_pull: tuple,
        lag: float,
        error_fraction: float,
    ):
        self.rng = random.Random(seed)
        self.median, self.sigma, self.cold_fraction, self.cold_pull = median, sigma, cold_fraction, cold_pull
        self.lag, self.error_fraction = lag, error_fraction
        self.plan: dict[str, tuple[float, float, bool, str]] = {}  # name -> (seen at, ready at, flaky, IP)
        self.by_ip: dict[str, str] = {}  # IP -> pod name
        self.lock = threading.Lock()

    def __call__(self, pod: dict, ticks: int) -> dict | None:
        name = pod["metadata"]["name"]
        with self.lock:
            if name not in self.plan:
                delay = self.rng.lognormvariate(0, self.sigma) * self.median
                if self.rng.random() < self.cold_fraction:
                    delay += self.rng.uniform(*self.cold_pull)
                now, n = time.monotonic(), len(self.plan)
                ip = f"10.{n // 62500 % 250}.{n // 250 % 250}.{n % 250 + 1}"
                self.plan[name] = (now, now + delay + self.lag, self.rng.random() < self.error_fraction, ip)
                self.by_ip[ip] = name
        seen_at, ready_at, flaky, ip = self.plan[name]
        now = time.monotonic()
        if now >= ready_at:
            return running_status(pod, ip)
        if flaky and now < (seen_at + ready_at) / 2:
            return waiting("CreateContainerError", "failed to reserve container name")(pod, ticks)
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}

    def revisit(self, pod: dict) -> float | None:
        """When this pod's status next changes (the fake's ticker visits it then, not every tick)."""
        plan = self.plan.get(pod["metadata"]["name"])
        if plan is None:
            return 0.0
        if (pod.get("status") or {}).get("phase") == "Running":
            return None  # nothing changes by itself any more (judged by the status, not the clock: the
            # clock may have passed ready_at since this visit returned Pending, which must be visited again)
        seen_at, ready_at, flaky, _ = plan
        now, middle = time.monotonic(), (seen_at + ready_at) / 2
        return max(0.0, (middle if flaky and now < middle else ready_at) - now)


class PollingBackend(KubernetesBackend):
    """The previous backend's wait for Running: read the pod until it runs (kept here for comparison)."""

    def _wait_running(self, pod_name: str) -> str:
        deadline, delay = time.monotonic() + self.config.start_timeout_seconds, 0.1
        while time.monotonic() < deadline:
            pod = self._call(
                "read pod", self.core.read_namespaced_pod, pod_name, self.config.namespace, passthrough=is_not_found
            )
            seen = self._assess(pod)
            if seen.state == "running" and seen.pod_ip:
                return seen.pod_ip
            if seen.state == "failed":
                raise RuntimeError(seen.message)
            time.sleep(delay)
            delay = min(0.5, delay * 2)
        raise TimeoutError(pod_name)


class StubNode:
    """The agents of every simulated pod: each answers once its pod has run `boot` seconds, and only to
    the key its Secret holds in the fake API server (or the key a warm-pool claim re-keyed it to)."""

    def __init__(self, fake: FakeKubernetesAPI, kubelet: SimKubelet, boot: float, exec_seconds: float):
        self.fake, self.kubelet, self.boot, self.exec_seconds = fake, kubelet, boot, exec_seconds
        self.rekeyed: dict[str, str] = {}  # IP -> key

    def check(self, endpoint: AgentEndpoint) -> None:
        ip = endpoint.address.rpartition(":")[0]
        name = self.kubelet.by_ip.get(ip)
        plan = self.kubelet.plan.get(name) if name else None
        if plan is None or time.monotonic() < plan[1] - self.kubelet.lag + self.boot:
            raise AgentUnreachableError(f"connection refused: {endpoint.address}")
        key = self.rekeyed.get(ip)
        if key is None:
            secret = self.fake.objects.get(("secrets", "orchard", f"{name}-agent"))
            # the agent boots with the key in the pod's files (the boot key; a warm pod's: its pool key)
            key = base64.b64decode(secret["data"]["agent-boot-secret"]).decode() if secret else None
        if key != endpoint.secret:
            raise AgentUnreachableError("unauthorized: wrong or missing agent secret")


class StubAgent(AgentClientBase):
    """What the service and the warm pool ask of an agent, answered by `StubNode` (ping, exec, rekey)."""

    def __init__(self, node: StubNode, endpoint: AgentEndpoint):
        self.node, self.endpoint = node, endpoint

    async def ping(self, timeout: float = 1.0) -> dict:
        self.node.check(self.endpoint)
        return {"ok": True}

    async def exec(
        self, request: ExecRequest, *, workdir: str, env: dict[str, str], max_output_bytes: int
    ) -> ExecResult:
        self.node.check(self.endpoint)
        await asyncio.sleep(self.node.exec_seconds)
        return ExecResult(exit_code=0, duration_seconds=self.node.exec_seconds, outcome=ExecOutcome.ok)

    async def rekey(self, new_secret: str) -> None:
        self.node.check(self.endpoint)
        self.node.rekeyed[self.endpoint.address.rpartition(":")[0]] = new_secret
        self.endpoint = self.endpoint.model_copy(update={"secret": new_secret})

    async def close(self) -> None:
        pass

    async def _unused(self, *args, **kwargs):
        raise NotImplementedError("the simulation only pings, execs and re-keys")

    read_file = write_file = list_files = put_archive = get_archive = upload = download = _unused
    open_pty = http_request = _unused


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else (values or [0])[0]


async def await_agent(agent: StubAgent) -> None:
    """The service's readiness loop (`service._await_agent`): ping, 5 ms doubling to 100 ms."""
    delay = 0.005
    while True:
        try:
            await agent.ping()
            return
        except AgentUnreachableError:
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)


class ExecProbe:
    """A stub exec every `period` s on a ready sandbox, on its own event loop, for the burst's length."""

    def __init__(self, node: StubNode, ready: list[AgentEndpoint], period: float):
        self.node, self.ready, self.period = node, ready, period
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        request = ExecRequest(command="true")
        while not self.stop.is_set():
            if self.ready:
                began = time.monotonic()
                await StubAgent(self.node, self.ready[-1]).exec(request, workdir="/", env={}, max_output_bytes=1)
                self.latencies.append(time.monotonic() - began)
            await asyncio.sleep(self.period)

    def close(self) -> list[float]:
        self.stop.set()
        self.thread.join()
        return self.latencies


def run(creates: int, cap: int, mode: str, args: argparse.Namespace, tmp: Path) -> dict:
    scale = args.time_scale
    fake = FakeKubernetesAPI(validate=False, tick_seconds=args.tick * scale)
    fake.inflight_limit = args.inflight
    for method in ("POST", "PATCH", "DELETE", "GET", "PUT"):
        for kind in ("pods", "secrets", "networkpolicies"):
            fake.latency[(method, kind)] = args.latency * scale
    kubelet = SimKubelet(
        args.seed,
        median=args.start_median * scale,
        sigma=0.5,
        cold_fraction=args.cold_fraction,
        cold_pull=(2.0 * scale, 6.0 * scale),
        lag=args.status_lag * scale,
        error_fraction=args.error_fraction,
    )
    fake.kubelet = kubelet
    node = StubNode(fake, kubelet, boot=args.agent_boot * scale, exec_seconds=0.005 * scale)
    settings = dict(
        namespace="orchard",
        snapshot_dir=tmp / "snapshots",
        api_pool_size=max(cap, 16) + 8,
        api_qps=args.qps,
        api_burst=args.burst,
        start_timeout_seconds=600,
        retry_attempts=8,
        container_error_grace_seconds=30,
        orphan_sweep_seconds=0,
        agent_ready_timeout_seconds=120,
    )
    pooled = "+pool" in mode
    if pooled:
        settings.update(
            warm_pools=[{"image": SPEC.image, "size": args.pool_size}], warm_pool_refill_concurrency=args.pool_refill
        )

    def backend(cls=KubernetesBackend, **extra) -> KubernetesBackend:
        configuration = k8s.Configuration(host=fake.url)
        configuration.connection_pool_maxsize = settings["api_pool_size"]  # as load_api_client sets it
        return cls(
            KubernetesBackendConfig(**{**settings, **extra}),
            api_client=FastApiClient(configuration),
            resolver=lambda h: ["93.184.216.34"],
            agent_factory=lambda ep: StubAgent(node, ep),
        )

    first = backend(PollingBackend if mode.startswith("poll") else KubernetesBackend)
    fill_seconds = 0.0
    if pooled:
        began = time.monotonic()
        while first.pool.ready() < args.pool_size:
            time.sleep(0.05)
        fill_seconds = time.monotonic() - began
    calls0, throttled0, bytes0 = len(fake.requests), fake.throttled, fake.bytes_out
    ready: list[AgentEndpoint] = []
    probe = ExecProbe(node, ready, 0.02)
    t0 = time.monotonic()
    queued, started, failed = [], [], []

    def create(i: int) -> None:
        began = time.monotonic()
        queued.append(began - t0)
        try:
            endpoint = first.start(f"sb-sim-{i:05d}", SPEC, Resources(), f"secret-of-sandbox-{i:05d}")
            if endpoint.boot_secret is not None:  # the service's take-over: ping with the boot key, re-key
                agent = StubAgent(node, endpoint.model_copy(update={"secret": endpoint.boot_secret}))
                asyncio.run(await_agent(agent))
                asyncio.run(agent.rekey(endpoint.secret))
            asyncio.run(await_agent(StubAgent(node, endpoint)))
            ready.append(endpoint)
            started.append(time.monotonic() - began)
        except Exception as err:  # noqa: BLE001 - counted, the run goes on
            failed.append(f"{type(err).__name__}: {err}"[:200])

    with ThreadPoolExecutor(cap) as pool:
        list(pool.map(create, range(creates)))
    burst_seconds = time.monotonic() - t0
    execs = probe.close()
    requests = [r for r in fake.requests[calls0:] if r["method"] != "WATCH"]
    n_requests, throttled = len(requests), fake.throttled - throttled0
    bytes_out = fake.bytes_out - bytes0
    claimed = first.pool.claimed if pooled else 0
    first.close()  # the service stops (a warm pool deletes its idle pods); its sandboxes stay

    restarted = backend(warm_pools=[])  # a restarted service, before any pool of its own
    t1 = time.monotonic()
    adopted = len(restarted.adopt())  # claimed warm pods too: the claim wrote what adoption reads
    adopt_seconds = time.monotonic() - t1
    restarted.close()
    reaper = backend(warm_pools=[], adopt_on_restart=False)  # a restart that adopts nothing: reaps all
    t1 = time.monotonic()
    orphans = reaper.list_orphans()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(reaper.stop, orphans))
    reap_seconds = time.monotonic() - t1
    left = len(fake.of_kind("pods"))
    reaper.close()
    fake.close()
    totals = [q + s for q, s in zip(queued, started)]
    return dict(
        creates=creates,
        cap=cap,
        mode=mode,
        ok=len(started),
        failed=len(failed),
        claimed=claimed,
        fill_seconds=fill_seconds,
        calls_per_sandbox=n_requests / creates,
        kib_per_sandbox=bytes_out / creates / 1024,
        throttled_pct=100 * throttled / max(1, n_requests),
        amplification=n_requests / max(1, n_requests - throttled),
        queue_mean=statistics.fmean(queued),
        start_mean=statistics.fmean(started or [0]),
        start_p99=pct(started, 99),
        create_mean=statistics.fmean(totals or [0]),
        burst_seconds=burst_seconds,
        exec_p99_ms=1000 * pct(execs, 99),
        execs=len(execs),
        adopt=f"{adopted} in {adopt_seconds:.1f}",
        reaped=len(orphans),
        reap_seconds=reap_seconds,
        pods_left=left,
        first_error=failed[0] if failed else "",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", default="1000", help="comma-separated numbers of creates")
    parser.add_argument("--caps", default="50,150,1000", help="comma-separated create caps (worker threads)")
    parser.add_argument("--modes", default="watch,poll,watch+pool", help="watch, poll, each with +pool or not")
    parser.add_argument("--latency", type=float, default=0.005, help="API server latency per request, s")
    parser.add_argument("--inflight", type=int, default=64, help="APF: concurrent requests before 429")
    parser.add_argument("--qps", type=float, default=200.0, help="the backend's client-side rate limit")
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--start-median", type=float, default=2.0, help="median pod start, s")
    parser.add_argument("--cold-fraction", type=float, default=0.1, help="pods whose image is pulled (2-6 s)")
    parser.add_argument("--status-lag", type=float, default=0.3, help="kubelet status lag, s")
    parser.add_argument("--error-fraction", type=float, default=0.05, help="pods with a transient CreateContainerError")
    parser.add_argument("--agent-boot", type=float, default=0.2, help="agent start after the container runs, s")
    parser.add_argument("--pool-size", type=int, default=150, help="warm pods kept for the burst's spec (+pool)")
    parser.add_argument("--pool-refill", type=int, default=32, help="warm pods started at once by the refill")
    parser.add_argument("--tick", type=float, default=0.1, help="fake kubelet status period, s")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplies every simulated delay")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(
        f"# load before: {open('/proc/loadavg').read().strip()}  cpus: {os.cpu_count()}  "
        f"time scale: {args.time_scale:g}",
        flush=True,
    )
    print(
        "| creates | cap | mode | ok/failed | pool claims | API calls/sandbox | KiB/sandbox | 429 % | amplification | "
        "queue mean s | start mean / p99 s | create mean s | burst s | exec p99 ms | adopt N s | reap N s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for creates in map(int, args.creates.split(",")):
            for cap in map(int, args.caps.split(",")):
                for mode in args.modes.split(","):
                    r = run(creates, cap, mode, args, Path(tmp))
                    claims = f"{r['claimed']} (fill {r['fill_seconds']:.0f} s)" if "+pool" in mode else "-"
                    print(
                        f"| {r['creates']} | {r['cap']} | {r['mode']} | {r['ok']}/{r['failed']} | {claims} | "
                        f"{r['calls_per_sandbox']:.1f} | {r['kib_per_sandbox']:.1f} | {r['throttled_pct']:.1f} | "
                        f"{r['amplification']:.2f} | {r['queue_mean']:.2f} | {r['start_mean']:.2f} / "
                        f"{r['start_p99']:.2f} | {r['create_mean']:.2f} | {r['burst_seconds']:.1f} | "
                        f"{r['exec_p99_ms']:.0f} | {r['adopt']} | "
                        f"{r['reaped']} in {r['reap_seconds']:.1f} ({r['pods_left']} left) |",
                        flush=True,
                    )
                    if r["first_error"]:
                        print(f"#   first failure: {r['first_error']}", file=sys.stderr)
    print(f"# load after: {open('/proc/loadavg').read().strip()}  at {datetime.now(timezone.utc):%H:%M} UTC")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
