"""The artifact layout of one pipeline run, shared by the local runner and the Argo steps.

KFP gives every artifact its own URI; locally and on Argo (one PVC per workflow) the same
artifacts live under one run directory, one sub-directory per artifact:

    runs/<timestamp>/
      config.json            the PipelineConfig of the run
      tasks/                 provision   -> TaskStore (train + heldout)
      base_model/            init_policy -> the untrained policy (save_pretrained)
      trajectories/          distill     -> TrajectoryStore of teacher trajectories
      credited/              credit      -> TrajectoryStore with per-step credit
      sft_model/             sft         -> checkpoint
      rl_model/              rl          -> checkpoint
      eval/<arm>/            evaluate    -> per-task parquet + summary (arm: untrained, sft, rl, teacher)
      results/<step>.json    each step's typed result (what the next step reads)
      report.md              the results table
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel


class RunLayout:
    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @classmethod
    def new(cls, runs_dir: str | Path = "runs") -> "RunLayout":
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
        return cls(Path(runs_dir) / stamp)

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks"

    @property
    def base_model(self) -> Path:
        return self.root / "base_model"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def credited(self) -> Path:
        return self.root / "credited"

    @property
    def sft_model(self) -> Path:
        return self.root / "sft_model"

    @property
    def rl_model(self) -> Path:
        return self.root / "rl_model"

    def eval_dir(self, arm: str) -> Path:
        return self.root / "eval" / arm

    def result_path(self, step: str) -> Path:
        return self.root / "results" / f"{step}.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    def write_result(self, step: str, result: BaseModel | dict) -> Path:
        path = self.result_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = result.model_dump_json(indent=2) if isinstance(result, BaseModel) else json.dumps(result, indent=2)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: a crash never leaves a half-written result
        return path
