"""Claw harness comparison, end to end (slow; prints the table the issue asks for):

one environment, two harnesses (function-call tools vs shell + CLI docs). For each harness:
teacher trajectories on train tasks (harness.run_episode) -> SFT of the tiny model
(components.sft.stage.train_sft) -> held-out evaluation with k=3 attempts (pass@1, pass@3), next to the
scripted teacher's own held-out figures. Writes build/recipe_results/claw_<harness>_sft<steps>.json.

    ORCHARD_CLAW_SFT_STEPS=200 .venv/bin/python -m pytest -q -m slow tests/recipes/test_claw_training.py -s
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.statistics.passk import mean_pass_at_k
from components.core.policy.base import GenerationConfig
from components.core.data.schema import Outcome
from components.core.data.parquet_store import TrajectoryStore
from components.recipes import get_recipe
from components.recipes.claw.teacher import ScriptedTeacher

N_TRAIN, N_HELDOUT, K = 24, 8, 3
SFT_STEPS = int(os.environ.get("ORCHARD_CLAW_SFT_STEPS", "60"))
OUT = Path(__file__).parents[2] / "build/recipe_results"


def _run_all(jobs, recipe, make_policy, client, cfg, workers: int = 2):
    def one(job):
        task, attempt = job
        return run_episode(task, recipe, make_policy(task, attempt), client, cfg)

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def _summary(trajs) -> dict[str, float]:
    by_task = defaultdict(list)
    for t in trajs:
        if t.outcome is not Outcome.infra_error:
            by_task[t.task_id].append(t.resolved)
    counts = [(len(v), sum(v)) for v in by_task.values()]
    return {
        "pass@1": mean_pass_at_k(counts, 1)[0],
        f"pass@{K}": mean_pass_at_k(counts, K)[0],
        "infra_errors": sum(t.outcome is Outcome.infra_error for t in trajs),
        "parse_errors_per_step": sum(1 for t in trajs for s in t.steps if s.role == "assistant" and s.policy_error)
        / max(1, sum(t.num_assistant_steps for t in trajs)),
        "mean_steps": sum(t.num_assistant_steps for t in trajs) / len(trajs),
    }


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("harness", ["tools", "shell"])
def test_harness_choice_changes_results_on_the_same_environment(sandbox_client, tmp_path, harness):
    from components.core.policy.local import LocalTransformersPolicy
    from components.sft.stage import SFTConfig, train_sft

    recipe = get_recipe("claw", harness=harness)
    train, heldout = recipe.tasks("train", N_TRAIN), recipe.tasks("heldout", N_HELDOUT)
    teach = HarnessConfig(max_steps=8)
    distilled = _run_all(
        [(t, 0) for t in train],
        recipe,
        lambda task, a: ScriptedTeacher(error_rate=0.2, seed=zlib.crc32(task.id.encode())),
        sandbox_client,
        teach,
    )
    store = TrajectoryStore(tmp_path / "trajectories")
    store.append(distilled)
    teacher_eval = _run_all(
        [(t, a) for t in heldout for a in range(K)],
        recipe,
        lambda task, a: ScriptedTeacher(error_rate=0.2, seed=a),
        sandbox_client,
        teach,
    )
    sft = train_sft(
        SFTConfig(mode="resolved_only", steps=SFT_STEPS, batch_size=4, max_len=1536, learning_rate=3e-3, num_threads=1),
        store.dir,
        tmp_path / "model",
    )
    # One policy, one worker: loading checkpoints from two threads at once is not safe.
    student = LocalTransformersPolicy(sft.model_dir)
    evaluate_cfg = HarnessConfig(max_steps=6, generation=GenerationConfig(max_new_tokens=160, temperature=0.7))
    student_eval = _run_all(
        [(t, a) for t in heldout for a in range(K)],
        recipe,
        lambda task, a: student,
        sandbox_client,
        evaluate_cfg,
        workers=1,
    )
    result = {
        "harness": harness,
        "train_trajectories": len(distilled),
        "train_resolved": sum(t.resolved for t in distilled),
        "sft_steps": sft.steps,
        "sft_first_loss": sft.first_loss,
        "sft_final_loss": sft.final_loss,
        "sft_train_seconds": sft.train_seconds,
        "teacher_e0.2_heldout": _summary(teacher_eval),
        "student_heldout": _summary(student_eval),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"claw_{harness}_sft{SFT_STEPS}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    assert result["student_heldout"]["infra_errors"] == 0
    assert sft.final_loss < sft.first_loss
    assert len(student_eval) == K * N_HELDOUT and all(t.num_assistant_steps >= 1 for t in student_eval)
