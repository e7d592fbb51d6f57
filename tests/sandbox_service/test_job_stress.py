"""20,000 commands through `/published` and `/v1` against one service: each command costs the same at the
end as at the start, and `/healthz` answers throughout (the bookkeeping of finished jobs is O(1) per job).

Before, the published route scanned every remembered command past 4,096 of them, looking each job up by
scanning every job: command 4,097 took seconds and `/healthz` stopped answering."""

from __future__ import annotations

import concurrent.futures as cf
import statistics
import threading
import time

import httpx
import pytest

from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService

COMMANDS = 20_000
SANDBOXES = 8
THREADS = 8
KEPT = 1000  # max_finished_jobs: small, so the count bound prunes all along


class HealthWatch(threading.Thread):
    """Polls `/healthz` until stopped; records every answer's latency (None: no answer within 5 s)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.latencies, self.stop = url, [], threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(self.url + "/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - started if ok else None)
                self.stop.wait(0.25)


@pytest.mark.slow
def test_twenty_thousand_commands_keep_latency_flat_and_healthz_answering():
    config = ServiceConfig(token="unused", max_finished_jobs=KEPT)
    with (
        EmbeddedService(config) as service,
        httpx.Client(base_url=service.url, timeout=60, limits=httpx.Limits(max_connections=THREADS * 2)) as http,
    ):
        published = {"X-API-Key": service.token}
        native = {"Authorization": f"Bearer {service.token}"}
        ids = [
            http.post("/published/sandboxes", json={"image": "python:3.11-slim"}, headers=published).json()[
                "sandbox_id"
            ]
            for _ in range(SANDBOXES)
        ]
        for sandbox_id in ids:
            assert http.get(f"/published/sandboxes/{sandbox_id}/wait", headers=published).json()["ready"]

        def one(i: int) -> tuple[float, str]:
            """Command i, in one of three ways: published exec with wait, published job + wait, /v1 job + wait."""
            sandbox_id, started = ids[i % SANDBOXES], time.perf_counter()
            if i % 3 == 0:
                body = http.post(
                    f"/published/sandboxes/{sandbox_id}/exec",
                    json={"command": f"echo {i}", "wait": True},
                    headers=published,
                ).json()
            elif i % 3 == 1:
                job = http.post(
                    f"/published/sandboxes/{sandbox_id}/exec",
                    json={"command": f"echo {i}", "wait": False},
                    headers=published,
                ).json()
                body = http.get(f"/published/jobs/{job['job_id']}/wait", headers=published).json()
                assert body["command"] == f"echo {i}"
            else:
                job = http.post(
                    f"/v1/sandboxes/{sandbox_id}/exec", json={"command": f"echo {i}", "wait": False}, headers=native
                ).json()
                body = http.get(f"/v1/jobs/{job['id']}/wait", headers=native).json()["result"]
            assert body["stdout"] == f"{i}\n", body
            return time.perf_counter() - started, body.get("job_id", "")

        watch = HealthWatch(service.url)
        watch.start()
        started = time.perf_counter()
        try:
            with cf.ThreadPoolExecutor(THREADS) as pool:
                results = list(pool.map(one, range(COMMANDS)))
        finally:
            watch.stop.set()
            watch.join()
        elapsed = time.perf_counter() - started

        latencies = [lat for lat, _ in results]
        first = statistics.median(latencies[:1000])
        last = statistics.median(latencies[-1000:])
        worst = max(latencies)
        print(
            f"\n{COMMANDS} commands in {elapsed:.1f} s ({COMMANDS / elapsed:.0f}/s); median latency first 1,000 "
            f"{first * 1000:.1f} ms, last 1,000 {last * 1000:.1f} ms, worst {worst:.2f} s; /healthz worst "
            f"{max(x for x in watch.latencies if x is not None) * 1000:.0f} ms over {len(watch.latencies)} polls"
        )
        assert last < 3 * first + 0.05, f"latency grew: median {first:.3f} s at first, {last:.3f} s at the end"
        assert worst < 10, f"a command took {worst:.1f} s"
        assert watch.latencies and None not in watch.latencies, "/healthz did not answer within 5 s"

        # The count bound held: the first job is gone (404, saying why), a recent one is still there.
        first_job = next(job_id for _, job_id in results if job_id)
        gone = http.get(f"/published/jobs/{first_job}", headers=published)
        assert gone.status_code == 404 and f"latest {KEPT}" in gone.json()["detail"]
        recent = next(job_id for _, job_id in reversed(results) if job_id)
        assert http.get(f"/published/jobs/{recent}", headers=published).json()["status"] == "succeeded"
        kept = sum(
            float(line.rsplit(" ", 1)[1])
            for line in http.get("/metrics", headers=native).text.splitlines()
            if line.startswith("orchard_jobs{")
        )
        assert kept <= KEPT
        for sandbox_id in ids:
            http.delete(f"/published/sandboxes/{sandbox_id}", headers=published)
