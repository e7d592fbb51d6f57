"""Time the two per-unit costs that dominate the full SFT ablation's runtime, for the estimate in docs/results-log.md.

    python scripts/time_sft_ablation.py WORK_DIR OUT_DIR [--steps 12]

WORK_DIR is a finished (e.g. `--quick`) ablation work dir: its credited trajectories train `--steps` SFT
steps with the full config's batch and length, then the result plays its held-out tasks with the full
config's evaluation settings (k attempts, turns, tokens per turn), one torch thread as in each ablation
job. Prints seconds per SFT step and per held-out episode; multiply by the full run's counts
(docs/results-log.md, Figures). Distillation and credit costs are read off a fraction run's progress bars.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    import torch

    from components.sft.stage import train_sft
    from components.sft.ablation import AblationConfig
    from components.sft.ablation.run import _evaluate
    from sandbox_service.embedded import EmbeddedService

    torch.set_num_threads(1)
    full = AblationConfig()
    cfg = full.sft.model_copy(update={"mode": "whole", "steps": args.steps, "warmup_steps": 0})
    result = train_sft(cfg, args.work_dir / "credited", args.out_dir / "model")
    print(json.dumps({"sft_seconds_per_step": result.train_seconds / args.steps}), flush=True)
    with EmbeddedService() as service:
        t0 = time.perf_counter()
        _evaluate(
            full, 0, service.connection(), args.work_dir / "tasks", args.out_dir / "model", args.out_dir / "eval", None
        )
        seconds = time.perf_counter() - t0
    import pandas as pd

    episodes = int(pd.read_parquet(args.out_dir / "eval" / "per_task.parquet")["attempts"].sum())
    print(json.dumps({"episodes": episodes, "seconds_per_episode": seconds / episodes}))


if __name__ == "__main__":
    main()
