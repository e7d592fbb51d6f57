"""Parquet stores: round trips, HF datasets loading, versioned rows, atomic shard writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.data.schema import SCHEMA_VERSION, EpisodeStatus, Outcome, Step, ToolCall, Trajectory, Verification
from components.core.data.schema import TestReport as Report
from components.core.data.parquet_store import SHARD_GLOB, StoreError, TaskStore, TrajectoryStore
from components.recipes.swe.generator import generate_tasks

REPO = Path(__file__).resolve().parents[2]


def make_traj(i: int, outcome: Outcome = Outcome.resolved) -> Trajectory:
    call = ToolCall(name="bash", arguments={"command": f"echo {i}", "nested": {"k": [1, 2]}})
    steps = [
        Step(index=0, role="system", content="sys"),
        Step(index=1, role="user", content="fix it", sandbox_state_id="snap-1"),
        Step(
            index=2,
            role="assistant",
            content='<tool_call>{"name": "bash"}</tool_call>',
            tool_call=call,
            token_ids=[5, 6, 7],
            duration_seconds=0.25,
            value_estimate=0.5,
            credit=0.1,
            credited=True,
        ),
        Step(index=3, role="tool", content="ünïcode out", tool_call_id=call.id, tool_name="bash"),
    ]
    return Trajectory(
        task_id=f"task-{i % 3}",
        recipe="swe",
        policy_id="p",
        steps=steps,
        outcome=outcome,
        status=EpisodeStatus.completed,
        test_report=Report(passed=2, failed=1, output="x"),
        tools=[{"type": "function", "function": {"name": "bash"}}],
        reward=1.0,
        prompt_tokens=10,
        completion_tokens=3,
        metadata={"family": "off_by_one", "n": [1]},
    )


def test_trajectory_round_trip_and_appends(tmp_path):
    store = TrajectoryStore(tmp_path / "trajs")
    first = [make_traj(i) for i in range(3)]
    second = [make_traj(9, Outcome.infra_error)]
    shard = store.append(first)
    store.append(second)
    assert shard.exists() and len(store.shards()) == 2
    back = store.read()
    assert sorted(back, key=lambda t: t.id) == sorted(first + second, key=lambda t: t.id)
    assert json.loads((tmp_path / "trajs" / "_manifest.json").read_text())["kind"] == "trajectories"
    assert store.task_ids_done() == {"task-0", "task-1", "task-2"}  # infra errors are retried
    assert store.attempts_done(include_infra_errors=True)["task-0"] == 2


def test_pandas_and_hf_datasets_load_the_directory(tmp_path):
    import datasets

    store = TrajectoryStore(tmp_path)
    store.append([make_traj(i) for i in range(2)])
    store.append([make_traj(i) for i in range(2, 5)])
    df = pd.read_parquet(tmp_path)
    assert len(df) == 5 and set(df["schema_version"]) == {SCHEMA_VERSION}
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / SHARD_GLOB), split="train")
    assert len(ds) == 5
    steps = json.loads(ds[0]["steps"])
    assert steps[2]["tool_call"]["arguments"]["nested"] == {"k": [1, 2]}
    assert len(store.to_pandas()) == 5


def test_v0_shard_still_loads(tmp_path):
    store = TrajectoryStore(tmp_path)
    store.append([make_traj(1)])
    # A shard as the v0 prototype wrote it: no schema_version/split/status/tools, `error` for the reason.
    v0 = pa.Table.from_pylist(
        [
            {
                "id": "traj-old",
                "task_id": "t-old",
                "recipe": "swe",
                "policy_id": "old",
                "outcome": "unresolved",
                "error": "hidden test failed",
                "reward": 0.0,
                "final_answer": None,
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "wall_seconds": 1.0,
                "attempt": 0,
                "created_at": "2026-01-01T00:00:00Z",
                "steps": json.dumps([{"index": 0, "role": "user", "content": "hi"}]),
                "test_report": None,
                "metadata": "{}",
            }
        ]
    )
    pq.write_table(v0, tmp_path / "part-00000000000000000000-v0.parquet")
    old = {t.id: t for t in store.read()}["traj-old"]
    assert old.outcome is Outcome.unresolved and old.outcome_reason == "hidden test failed"
    assert (
        old.schema_version == SCHEMA_VERSION
        and old.verification is None
        and old.split == "train"
        and old.status is EpisodeStatus.completed
    )
    newer = pa.Table.from_pylist([{**v0.to_pylist()[0], "schema_version": 99}])
    pq.write_table(newer, tmp_path / "part-99999999999999999999-v99.parquet")
    with pytest.raises(StoreError, match="schema_version 99"):
        store.read()


def test_v1_shard_loads_without_a_verification_record_and_v2_round_trips_it(tmp_path):
    store = TrajectoryStore(tmp_path)
    audited = make_traj(1).model_copy(
        update={
            "verification": Verification(
                verifier="swe-clean-room",
                version="2",
                ignored=[{"path": "conftest.py", "reason": "test-runner configuration"}],
            )
        }
    )
    store.append([audited])
    row = pq.read_table(store.shards()[0]).to_pylist()[0]
    v1 = {**{k: v for k, v in row.items() if k != "verification"}, "id": "traj-v1", "schema_version": 1}
    pq.write_table(pa.Table.from_pylist([v1]), tmp_path / "part-00000000000000000000-v1.parquet")
    got = {t.id: t for t in store.read()}
    assert got["traj-v1"].verification is None and got["traj-v1"].schema_version == SCHEMA_VERSION
    assert got[audited.id].verification == audited.verification


def test_task_store_round_trip_and_split_filter(tmp_path):
    train, held = generate_tasks("train", 4, 0), generate_tasks("heldout", 2, 0)
    store = TaskStore(tmp_path)
    store.write(train)
    store.write(held)
    assert store.read() == train + held
    assert store.read(split="heldout") == held
    assert store.get(train[1].id) == train[1]
    with pytest.raises(StoreError, match="holds 'tasks'"):
        TrajectoryStore(tmp_path).read()


WRITER = textwrap.dedent("""
    import sys, time
    import pyarrow.parquet as pq
    import components.core.data.parquet_store as store
    real = pq.write_table
    def slow_write(table, where, **kw):
        where.write(b"PAR1 partial bytes of a shard")  # the first bytes reach the disk ...
        where.flush()
        print("writing", flush=True)
        time.sleep(60)  # ... and the writer is killed here
        real(table, where, **kw)
    store.pq.write_table = slow_write
    sys.path.insert(0, sys.argv[2])
    from test_store import make_traj
    store.TrajectoryStore(sys.argv[1]).append([make_traj(7)])
""")


def test_killed_writer_leaves_no_torn_shard(tmp_path):
    store = TrajectoryStore(tmp_path / "s")
    store.append([make_traj(1)])
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "s"), str(Path(__file__).parent)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    leftovers = [p.name for p in (tmp_path / "s").iterdir()]
    assert any(name.endswith(".tmp") for name in leftovers), leftovers  # the partial file exists ...
    assert len(store.shards()) == 1  # ... but is never a shard
    assert [t.task_id for t in store.read()] == ["task-1"]
    assert len(pd.read_parquet(tmp_path / "s" / store.shards()[0].name)) == 1
