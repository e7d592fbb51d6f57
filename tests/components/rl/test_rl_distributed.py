"""RL under a real 2-process launch (torchrun, gloo on CPU): TRL's GRPOTrainer with every rank rolling
out its own groups in real sandboxes; side effects (MLflow run, checkpoint, result) happen once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ENTRY = """
import json, sys
from components.core.tracking import TrackingConfig
from components.rl.stage import RLConfig, train_rl
config = RLConfig.model_validate_json(sys.argv[1])
result = train_rl(config, sys.argv[2], sys.argv[3], sys.argv[4],
                  tracking=TrackingConfig(tracking_uri=sys.argv[5], experiment="grpo-ddp"))
print("RESULT " + result.model_dump_json())
"""


def _config(sandbox_service, **update):
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.base import GenerationConfig
    from components.rl.config import RLConfig
    from components.rl.sampling import RolloutConfig

    return RLConfig(
        **{
            **dict(
                steps=2,
                learning_rate=1e-3,
                seed=3,
                num_threads=1,
                rollout=RolloutConfig(
                    group_size=2, max_rollouts_per_prompt=8, stride=2, rho_min=0.5, rho_max=0.5, batch_prompts=1
                ),
                harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=12)),
                sandbox=sandbox_service.connection(),
                launch={"nproc_per_node": 2},
            ),
            **update,
        }
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # 2 torchrun processes + sandboxes; ~1 min idle, more on a loaded machine
def test_two_process_grpo_trains_once_logs_once_and_saves_once(rl_inputs, sandbox_service, tmp_path):
    import mlflow
    import torch

    from components.core.policy.modeling import load_policy
    from components.rl.sampling import PromptRecord

    config = _config(sandbox_service)
    script = tmp_path / "entry.py"
    script.write_text(ENTRY)
    out, uri = tmp_path / "rl", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        config.model_dump_json(),
        str(rl_inputs / "tasks"),
        str(rl_inputs / "sft"),
        str(out),
        uri,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    for r in results:
        r["metrics"].pop("train_seconds")  # each rank's own clock
    assert len(results) == 2 and results[0] == results[1], "every rank returns the same (gathered) result"
    result = results[0]
    assert result["steps_done"] + result["steps_without_update"] == 2

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("grpo-ddp").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs for one training"
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"], "one checkpoint"
    written = json.loads((out / "rl_result.json").read_text())
    written["metrics"].pop("train_seconds")
    assert written == result
    # two ranks x one prompt per step x two steps: every rank's sampler choices are in the records
    records = [PromptRecord.model_validate_json(line) for line in open(result["records_path"])]
    assert len(records) == 4
    assert result["trajectories"] == sum(r.generated for r in records)
    # an optimizer step trained on a reward when a group was kept on any rank (records' step: the call)
    assert result["steps_done"] == len({r.step for r in records if r.kept})
    before, _ = load_policy(rl_inputs / "sft")
    after, _ = load_policy(out)
    if any(r.kept for r in records):  # a kept group has mixed rewards: the shared update moved the weights
        assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
