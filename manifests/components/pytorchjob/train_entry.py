"""Entry point of a PyTorchJob pod: `torchrun train_entry.py stage.json`.

stage.json names the stage and its inputs:
    {"stage": "sft", "config": {...SFTConfig fields...}, "trajectories_dir": "/data/...",
     "out_model_dir": "/data/...", "base_model_dir": null}

SFT trains with transformers' Trainer, which joins the process group torchrun set up (the operator
provides MASTER_ADDR, WORLD_SIZE, RANK), so every rank runs the same call and Trainer shards the data
and averages gradients. RL in more than one process needs `"engine": "trl"` in its config (TRL's
GRPOTrainer: every rank rolls out its share of the groups, gradients are averaged); the builtin
engine is one process and `train_rl` refuses a larger world instead of training N unsynchronised copies.
(The pipelines launch their own PyTorchJobs, `pipelines/pytorchjob.py`; this file is for a job by hand.)
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
        from components.rl import RLConfig, train_rl

        config = RLConfig(**job.get("config", {}))
        if world > 1 and config.engine != "trl":
            print(f"train_entry: this job has WORLD_SIZE={world} but the RL config's engine is {config.engine!r}; "
                  "set \"engine\": \"trl\" (or run one process: Worker replicas 0, nprocPerNode \"1\")",
                  file=sys.stderr)
            return 2
        result = train_rl(config, job["tasks_dir"], job["model_dir"], job["out_model_dir"])
    else:
        print(f"train_entry: unknown stage {stage!r}; use 'sft' or 'rl'", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.model_dump(mode="json")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
