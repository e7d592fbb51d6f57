"""Entry point of a PyTorchJob pod: `torchrun train_entry.py stage.json`.

stage.json names the stage and its inputs:
    {"stage": "sft", "config": {...SFTConfig fields...}, "trajectories_dir": "/data/...",
     "out_model_dir": "/data/...", "base_model_dir": null}

SFT trains with transformers' Trainer, which joins the process group torchrun set up (the operator
provides MASTER_ADDR, WORLD_SIZE, RANK), so every rank runs the same call and Trainer shards the data
and averages gradients. RL trains with TRL's GRPOTrainer the same way: every rank rolls out its share
of the groups, gradients are averaged. A config the stage refuses ends the job with its message (exit 2).
(The pipelines launch their own PyTorchJobs, `pipelines/jobs/pytorchjob.py`; this file is for a job by hand.)
"""

from __future__ import annotations

import json
import os
import sys


def _stage(stage: str):
    """(config class, run(config, job)) of a stage this entry point trains."""
    if stage == "sft":
        from components.sft.stage import SFTConfig, train_sft

        return SFTConfig, lambda config, job: train_sft(
            config, job["trajectories_dir"], job["out_model_dir"], base_model_dir=job.get("base_model_dir")
        )
    from components.rl.stage import RLConfig, train_rl

    return RLConfig, lambda config, job: train_rl(config, job["tasks_dir"], job["model_dir"], job["out_model_dir"])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: torchrun train_entry.py STAGE_JSON", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    from pydantic import ValidationError

    stage = job.get("stage")
    if stage not in ("sft", "rl"):
        print(f"train_entry: unknown stage {stage!r}; use 'sft' or 'rl'", file=sys.stderr)
        return 2
    config_class, run = _stage(stage)
    try:
        config = config_class(**job.get("config", {}))
    except ValidationError as err:
        print(f"train_entry: the {stage} config in {argv[1]} is invalid: {err}", file=sys.stderr)
        return 2
    result = run(config, job)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.model_dump(mode="json")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
