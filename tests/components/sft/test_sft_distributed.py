"""SFT under a real 2-process launch (torchrun, gloo on CPU): the same training as one process with
twice the gradient accumulation, and side effects (MLflow run, checkpoint) happen once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[3]
ENTRY = """
import json, sys
from components.core.tracking import TrackingConfig
from components.sft.stage import SFTConfig, train_sft
config = SFTConfig(**json.loads(sys.argv[1]))
train_sft(config, sys.argv[2], sys.argv[3], tracking=TrackingConfig(tracking_uri=sys.argv[4], experiment="ddp"))
"""


def _trajectories(n: int) -> list[Trajectory]:
    out = []
    for i in range(n):
        call = ToolCall(name="read_file", arguments={"path": f"pkg/mod_{i}.py"})
        steps = [
            Step(index=0, role="system", content="You fix bugs."),
            Step(index=1, role="user", content=f"Fix function number {i} " + "in the module " * (i % 3)),
            Step(
                index=2,
                role="assistant",
                tool_call=call,
                content=f'<tool_call>{{"name": "read_file", "arguments": {{"path": "pkg/mod_{i}.py"}}}}</tool_call>',
            ),
            Step(index=3, role="tool", content=f"def f{i}(x):\n    return x + {i}\n", tool_call_id=call.id),
        ]
        out.append(
            Trajectory(task_id=f"t{i}", recipe="swe", policy_id="teacher", steps=steps, outcome=Outcome.resolved)
        )
    return out


def _run(tmp: Path, name: str, nproc: int, config: dict, data: Path) -> tuple[list[float], Path, str]:
    script = tmp / "entry.py"
    script.write_text(ENTRY)
    out, uri = tmp / name, f"sqlite:///{tmp / name}.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        json.dumps(config),
        str(data),
        str(out),
        uri,
    ]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ddp").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs for one training"
    history = sorted(client.get_metric_history(runs[0].info.run_id, "learning/1_loss"), key=lambda m: m.step)
    assert runs[0].data.metrics["world_size"] == nproc
    return [m.value for m in history], out, proc.stderr


@pytest.mark.slow
def test_two_processes_train_like_one_with_twice_the_accumulation(tmp_path):
    data = tmp_path / "data"
    TrajectoryStore(data).append(_trajectories(16))
    base = {
        "mode": "resolved_only",
        "steps": 4,
        "batch_size": 2,
        "bucketing": False,
        "learning_rate": 1e-3,
        "warmup_steps": 0,
        "num_threads": 1,
        "max_len": 256,
        "seed": 3,
        "model": {"tokenizer": {"corpus_recipes": []}, "seed": 3},
    }
    ddp, ddp_dir, _ = _run(tmp_path, "ddp", 2, {**base, "grad_accum": 1}, data)
    single, single_dir, _ = _run(tmp_path, "single", 1, {**base, "grad_accum": 2}, data)
    assert len(ddp) == len(single) == 4
    assert ddp == pytest.approx(single, rel=2e-3, abs=2e-3)
    assert ddp[-1] < ddp[0]
    # one checkpoint, from the main process, equal to the single-process one
    assert sorted(p.name for p in ddp_dir.glob("*.safetensors")) == ["model.safetensors"]
    from safetensors.torch import load_file

    a, b = load_file(ddp_dir / "model.safetensors"), load_file(single_dir / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-3


@pytest.mark.parametrize("name,kind", [("ddp", "MULTI_GPU"), ("fsdp2", "FSDP"), ("zero3", "DEEPSPEED")])
def test_shipped_accelerate_configs_load(name, kind):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    assert config.distributed_type.name == kind and config.mixed_precision == "bf16"
    if kind == "FSDP":  # save_pretrained needs the full state dict gathered on the main process
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if kind == "DEEPSPEED":
        assert config.deepspeed_config["zero_stage"] == 3 and config.deepspeed_config["zero3_save_16bit_model"]


def test_bf16_and_gradient_checkpointing_train(tmp_path):
    import torch

    from components.core.policy.modeling import load_policy
    from components.sft.stage import SFTConfig, train_sft

    data = tmp_path / "data"
    TrajectoryStore(data).append(_trajectories(4))
    config = SFTConfig(
        mode="resolved_only",
        steps=2,
        batch_size=2,
        max_len=256,
        bf16=True,
        gradient_checkpointing=True,
        learning_rate=1e-2,
        warmup_steps=0,
        model={"tokenizer": {"corpus_recipes": []}},
    )
    result = train_sft(config, data, tmp_path / "model")
    assert torch.isfinite(torch.tensor([result.first_loss, result.final_loss])).all()
    model, _ = load_policy(tmp_path / "model")
    assert next(model.parameters()).dtype == torch.float32  # mixed precision: master weights stay fp32
