"""Snapshot, fork and restore of a sandbox holding a repository-sized tree, through the service's API.

    python scripts/bench_snapshots.py [--files 2000] [--file-kb 16] [--repeats 10]

A sandbox writes `files` files of `file-kb` KiB; after a warm-up round, each repeat snapshots it, forks the
snapshot into a new sandbox (create with from_snapshot, until ready), reads the fork's disk use (its
memory-backed tmpfs: what it pays for the snapshot's files) and restores the first sandbox to the
snapshot. Each repeat starts from a new sandbox with the tree in its own upper layer, and also snapshots
the fork after it changed one file. Prints, as JSON, each operation's wall p50 and the service's CPU per
operation (its own plus its reaped children: `cp`; a mean, the counters tick in 10 ms). CPU, not wall, is
the figure to compare on a shared machine; run the base commit's checkout beside it for a ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import psutil

from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.models import SandboxCreate

LABELS = {"bench": "snapshots"}
MAKE_TREE = (
    "import os, sys\n"
    "n, kb = int(sys.argv[1]), int(sys.argv[2])\n"
    "for i in range(n):\n"
    "    d = f'/workspace/repo/pkg{i % 50}'\n"
    "    os.makedirs(d, exist_ok=True)\n"
    "    with open(f'{d}/m{i}.py', 'wb') as f:\n"
    "        f.write(os.urandom(kb * 1024))\n"
)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--file-kb", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {"snapshot": [], "fork": [], "snapshot_of_fork": [], "restore": []}
    fork_disk_kb = []
    with (
        EmbeddedService(ServiceConfig(token="unused"), check_leaks=False) as service,
        service.client(timeout=300) as client,
    ):
        proc = max(psutil.Process().children(), key=lambda p: p.create_time())  # the service just started

        def cpu() -> float:
            t = proc.cpu_times()
            return t.user + t.system + t.children_user + t.children_system

        def timed(name: str, call):
            w0, c0 = time.perf_counter(), cpu()
            result = call()
            if name:
                samples[name].append((time.perf_counter() - w0, cpu() - c0))
            return result

        resources = {"memory_mb": 2048, "disk_mb": 1536}
        for i in range(args.repeats + 1):
            name = lambda op: op if i else ""  # noqa: E731 - the first round warms up, unrecorded
            source = client.create(SandboxCreate(labels=LABELS, resources=resources))
            source.write_file("/workspace/make_tree.py", MAKE_TREE.encode())
            made = source.exec(["python3", "/workspace/make_tree.py", str(args.files), str(args.file_kb)], timeout=600)
            assert made.ok, made
            snap = timed(name("snapshot"), source.snapshot)
            spec = SandboxCreate(labels=LABELS, from_snapshot=snap.id, resources=resources)
            fork = timed(name("fork"), lambda: client.create(spec))
            used = fork.exec("df -k /workspace | tail -1").stdout.split()[2]
            assert fork.exec("ls /workspace/repo | wc -l").stdout.strip() == str(min(50, args.files))
            assert fork.exec("echo changed > /workspace/repo/pkg0/m0.py").ok
            timed(name("snapshot_of_fork"), fork.snapshot)
            if i:
                fork_disk_kb.append(int(used))
            fork.delete()
            timed(name("restore"), lambda: source.restore(snap.id))
            source.delete()
    out = {
        "tree": {"files": args.files, "file_kb": args.file_kb, "mb": round(args.files * args.file_kb / 1024, 1)},
        "repeats": args.repeats,
        **{
            op: {
                "wall_p50_ms": round(statistics.median(w for w, _ in runs) * 1e3, 1),
                "service_cpu_ms": round(sum(c for _, c in runs) / len(runs) * 1e3, 1),  # a mean: 10 ms ticks
            }
            for op, runs in samples.items()
        },
        "fork_disk_used_kb_p50": statistics.median(fork_disk_kb),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
