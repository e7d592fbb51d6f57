"""Entry point of a PyTorchJob pod: `torchrun train_entry.py stage.json`.

stage.json names the stage and its inputs:
    {"stage": "sft", "config": {...SFTConfig fields...}, "trajectories_dir": "/data/...",
     "out_model_dir": "/data/...", "base_model_dir": null}

SFT trains with transformers' Trainer, which joins the process group torchrun set up (the operator
provides MASTER_ADDR, WORLD_SIZE, RANK), so every rank runs the same call and Trainer shards the data
and averages gradients. RL is a single-process loop in this project: run it with Worker replicas 0
and nprocPerNode "1"; this script refuses a larger world instead of training N unsynchronised copies.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: torchrun train_entry.py STAGE_JSON", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stage = job.get("stage")
    if stage == "sft":
        from components.sft import SFTConfig, train_sft

        result = train_sft(SFTConfig(**job.get("config", {})), job["trajectories_dir"], job["out_model_dir"],
                           base_model_dir=job.get("base_model_dir"))
    elif stage == "rl":
        if world > 1:
            print(f"train_entry: the RL stage is single-process; this job has WORLD_SIZE={world}. "
                  "Set Worker replicas to 0 and nprocPerNode to \"1\".", file=sys.stderr)
            return 2
        from components.rl import RLConfig, train_rl

        result = train_rl(RLConfig(**job.get("config", {})), job["tasks_dir"], job["model_dir"], job["out_model_dir"])
    else:
        print(f"train_entry: unknown stage {stage!r}; use 'sft' or 'rl'", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.model_dump(mode="json")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
