"""The artifact layout of one pipeline run, shared by the local runner and the Argo steps.

KFP gives every artifact its own URI; locally and on Argo (one volume per workflow) the same
artifacts live under one run directory, one sub-directory per stage output of the stage table
(`pipelines/stages.py`):

    runs/<timestamp>/
      config.json                  the PipelineConfig of the run
      <stage>/<output>/            e.g. provision/tasks, distill/trajectories, sft/model, evaluate-rl/results
      results/<stage>.json         each stage's typed result (what the report reads)
      report.md                    the results table
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

    def artifact(self, stage: str, output: str) -> Path:
        return self.root / stage / output

    def result_path(self, step: str) -> Path:
        return self.root / "results" / f"{step}.json"

    def read_result(self, step: str) -> dict | None:
        path = self.result_path(step)
        return json.loads(path.read_text()) if path.exists() else None

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
