"""The retraining data store: new task seeds per run, disjoint ids, shard lists, windows, two writers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from components.core.data.retrain_store import DataStore, read_training_list, store_path
from components.core.data.schema import EpisodeStatus, Outcome, Step, Trajectory
from components.core.data.parquet_store import StoreError, TrajectoryStore
from components.recipes.swe.generator import generate_tasks

REPO = Path(__file__).resolve().parents[2]


def _train(seed: int, n: int = 3):
    return generate_tasks("train", n, seed)


def _trajs(tasks) -> list[Trajectory]:
    return [
        Trajectory(
            task_id=t.id,
            recipe="swe",
            policy_id="teacher",
            outcome=Outcome.resolved,
            status=EpisodeStatus.completed,
            reward=1.0,
            steps=[Step(index=0, role="user", content=t.prompt)],
        )
        for t in tasks
    ]


def _run(store: DataStore, run_id: str, heldout, window: int | None = None):
    seed, tasks = store.claim(run_id, "swe", _train, heldout)
    return seed, tasks, store.add(run_id, "swe", tasks, _trajs(tasks), window_runs=window)


def test_each_run_draws_new_tasks_and_trains_on_every_shard(tmp_path):
    store, heldout = DataStore(tmp_path / "store"), generate_tasks("heldout", 2, 0)
    seed1, tasks1, run1 = _run(store, "run-1", heldout)
    seed2, tasks2, run2 = _run(store, "run-2", heldout)
    assert seed1 != seed2 and not {t.id for t in tasks1} & {t.id for t in tasks2}
    assert not {t.id for t in tasks1 + tasks2} & {t.id for t in heldout}
    assert run1.trained_on == run1.trajectory_shards and len(run1.trajectory_shards) == 1
    assert run2.trained_on == run1.trajectory_shards + run2.trajectory_shards
    manifest = store.read()
    assert [r.run_id for r in manifest.runs] == ["run-1", "run-2"]
    assert [r.train_seed for r in manifest.runs] == [seed1, seed2]
    assert manifest.run("run-2").task_ids == [t.id for t in tasks2]
    # the training set: exactly the listed shards, as a TrajectoryStore, with its lineage file
    out = store.materialize(run2.trained_on, tmp_path / "training", run_id="run-2")
    assert {t.task_id for t in TrajectoryStore(out).read()} == {t.id for t in tasks1 + tasks2}
    assert read_training_list(out) == {"store": str(store.root), "run_id": "run-2", "shards": run2.trained_on}


def test_a_retried_step_reuses_its_claim_and_its_shards(tmp_path):
    store, heldout = DataStore(tmp_path / "store"), generate_tasks("heldout", 2, 0)
    seed, tasks, entry = _run(store, "run-1", heldout)
    assert store.claim("run-1", "swe", _train, heldout) == (seed, tasks)
    again = store.add("run-1", "swe", tasks, _trajs(tasks))
    assert again == entry and len(store.read().runs) == 1


def test_a_window_trains_on_the_last_runs_only(tmp_path):
    store, heldout = DataStore(tmp_path / "store"), generate_tasks("heldout", 2, 0)
    _, _, run1 = _run(store, "run-1", heldout)
    _, _, run2 = _run(store, "run-2", heldout)
    _, _, run3 = _run(store, "run-3", heldout, window=2)
    assert run3.trained_on == run2.trajectory_shards + run3.trajectory_shards
    assert not set(run1.trajectory_shards) & set(run3.trained_on)


def test_heldout_tasks_stay_out_of_training_across_runs(tmp_path):
    store = DataStore(tmp_path / "store")
    _, tasks1, _ = _run(store, "run-1", generate_tasks("heldout", 2, 0))
    # a run whose held-out tasks were an earlier run's training tasks is refused, not trained
    with pytest.raises(StoreError, match="were training tasks of an earlier run"):
        store.claim("run-2", "swe", _train, tasks1[:1])
    # a seed whose tasks would include a held-out task is skipped
    seed, tasks = store.claim("run-3", "swe", _train, _train(1)[:1])
    assert seed == 2 and not {t.id for t in tasks} & {_train(1)[0].id}


def test_the_store_refuses_another_recipe_and_object_store_uris(tmp_path):
    store = DataStore(tmp_path / "store")
    _run(store, "run-1", [])
    with pytest.raises(StoreError, match="holds 'swe' tasks"):
        store.claim("run-2", "gui", _train, [])
    with pytest.raises(StoreError, match="s3:// is not supported"):
        store_path("s3://bucket/store")
    assert store_path(f"file://{tmp_path}") == tmp_path
    with pytest.raises(StoreError, match="claimed no tasks"):
        store.add("never-claimed", "swe", [], [])


def test_two_writer_processes_do_not_lose_claims_or_shards(tmp_path):
    """Two processes claim and add 12 runs each at once: every run, seed and shard survives."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from tests.components.test_data_store import _run
        from components.core.data.retrain_store import DataStore
        store = DataStore({str(tmp_path / "store")!r})
        ready = Path({str(tmp_path)!r})
        (ready / sys.argv[1]).touch()
        while not ((ready / "a").exists() and (ready / "b").exists()):  # start together, imports done
            time.sleep(0.01)
        for i in range(12):
            _run(store, f"{{sys.argv[1]}}-{{i}}", [])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, name]) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    manifest = DataStore(tmp_path / "store").read()
    assert len(manifest.runs) == 24 and all(r.added_at for r in manifest.runs)
    assert len({r.train_seed for r in manifest.runs}) == 24
    ids = [t for r in manifest.runs for t in r.task_ids]
    assert len(ids) == len(set(ids)) == 24 * 3
    shards = [s for r in manifest.runs for s in r.trajectory_shards]
    assert len(set(shards)) == 24 and all((tmp_path / "store" / s).exists() for s in shards)
    assert sorted(r.added_order for r in manifest.runs) == list(range(1, 25))
    last = max(manifest.runs, key=lambda r: r.added_order)
    assert sorted(last.trained_on) == sorted(shards)  # the last writer saw everyone's shards
    json.loads((tmp_path / "store" / "store.json").read_text())  # one whole manifest, never a torn one
