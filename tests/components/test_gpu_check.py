"""The GPU check (scripts/gpu_check.sh + scripts/gpu_check.py) as far as a CPU machine goes, and the
`rl.use_vllm` switch. The vLLM path itself needs a GPU and vLLM: it has not run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_the_shell_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0


def test_dry_run_checks_every_steps_prerequisites_and_prints_the_plan(tmp_path):
    import torch

    proc = _run("--dry-run", "--out", str(tmp_path / "gc"))
    lines = proc.stdout.splitlines()
    cuda = next(line for line in lines if "a CUDA GPU" in line)
    vllm = next(line for line in lines if line.split("] ")[1].startswith("grpo") and "vllm" in line)
    assert ("[     ok]" in cuda) == torch.cuda.is_available()
    assert ("[     ok]" in vllm) == (vllm.split(": ")[-1] != "not installed" and vllm.split(": ")[-1] >= "0.22")
    assert [line.split(". ")[1].split(":")[0] for line in lines if line.startswith("  ") and ". " in line] == [
        "checkpoint",
        "service",
        "data",
        "sft",
        "grpo",
        "report",
    ]
    missing = sum("MISSING" in line for line in lines)
    assert proc.returncode == (1 if missing else 0)
    assert not (tmp_path / "gc" / "checkpoint").exists(), "a dry run runs nothing"


def test_the_cpu_variant_has_every_prerequisite_here(tmp_path):
    proc = _run("--dry-run", "--device", "cpu", "--no-vllm", "--out", str(tmp_path / "gc"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MISSING" not in proc.stdout and "HF generate" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~5 min on 2 loaded cores: Qwen's 151k-token vocabulary makes even a tiny model slow
def test_the_cpu_variant_runs_every_step_and_prints_the_table(tmp_path):
    """Checkpoint (Qwen vocabulary), sandbox service, tasks + teacher, SFT, GRPO in sandboxes (HF generate)."""
    proc = _run(
        "--device",
        "cpu",
        "--no-vllm",
        "--hidden",
        "32",
        "--layers",
        "1",
        "--tasks",
        "2",
        "--sft-steps",
        "2",
        "--rl-steps",
        "1",
        "--group-size",
        "2",
        "--max-turns",
        "1",
        "--max-new-tokens",
        "16",
        "--max-len",
        "256",
        "--out",
        str(tmp_path / "gc"),
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("gpu_check (cpu") :].splitlines()
    assert [row.split()[0] for row in table[2:]] == ["checkpoint", "data", "sft", "grpo"]
    grpo = table[-1].split()
    assert float(grpo[2]) > 0 and float(grpo[3]) > 0, "tokens/s and episodes/min of the GRPO step"
    assert grpo[4] == "-", "no GPU: no peak GPU memory"
    assert (tmp_path / "gc" / "rl" / "model.safetensors").exists()


def test_use_vllm_switch(tmp_path):
    import importlib.util

    from components.rl.stage import RLConfig, grpo_args

    installed = importlib.util.find_spec("vllm") is not None
    import torch

    auto = grpo_args(RLConfig(use_vllm="auto"), tmp_path)
    assert auto.use_vllm == (installed and torch.cuda.is_available())
    assert grpo_args(RLConfig(), tmp_path).use_vllm is False
    if not (installed and torch.cuda.is_available()):
        with pytest.raises(ValueError, match="rl.use_vllm=true"):
            grpo_args(RLConfig(use_vllm=True), tmp_path)
    else:
        args = grpo_args(RLConfig(use_vllm=True, vllm_gpu_memory_utilization=0.4, max_len=2048), tmp_path)
        assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization, args.vllm_max_model_length) == (
            True,
            "colocate",
            0.4,
            2048,
        )
