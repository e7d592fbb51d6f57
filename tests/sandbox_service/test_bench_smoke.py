"""The benchmark script runs end to end (tiny counts; the figures themselves come from `make bench`)."""

from __future__ import annotations

import json

from sandbox_service.tools import bench


def test_bench_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "bench.json"
    figures = bench.main(
        ["--execs", "20", "--paced", "3", "--creates", "3", "--stress", "6", "--concurrency", "3", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    assert figures["exec"]["n"] == 20 and figures["exec"]["rest_p50_ms"] > 0 and figures["exec"]["ratio_p50"] > 0
    assert figures["paced_exec"]["n"] == 3 and figures["paced_exec"]["ratio_p50"] > 0
    cpu = figures["exec"]["cpu_per_exec"]
    assert cpu["client_ms"] > 0 and cpu["agent_and_command_ms"] > 0 and cpu["bare_ms"] > 0
    assert figures["stress"]["success_rate"] == 1.0 and figures["stress"]["live_after"] == 0
    assert figures["leaks"]["count"] == 0
