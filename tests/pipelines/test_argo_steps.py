"""The Argo WorkflowTemplate's own container commands, run here in DAG order (no cluster, no images).

Argo is not available on this machine, so this plays its part for the things our YAML decides:
it renders each task's `{{...}}` parameters the way Argo would (workflow parameters, inputs, the
start step's output parameters), runs the container's command and args as a local process with the
shared volume mapped to a temp dir and the sandbox token provided as the Secret would be, and then
runs the exit handler. What it does not cover: scheduling, the PVC, pod resources, real images.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

from pipelines.argo.workflow import build_workflow_template
from pipelines.config import PipelineConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

_REF = re.compile(r"\{\{\s*([\w.\-]+)\s*\}\}")


def _render(text: str, scope: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in scope:
            raise KeyError(f"unresolved Argo reference {m.group(0)} in {text[:120]!r}")
        return scope[m.group(1)]

    return _REF.sub(sub, text)


def _toposort(tasks: dict[str, dict]) -> list[str]:
    done: list[str] = []
    while len(done) < len(tasks):
        ready = [
            n
            for n, t in tasks.items()
            if n not in done and all(d in done for d in (t.get("depends") or "").replace("&&", " ").split())
        ]
        assert ready, "cycle in the DAG"
        done.extend(sorted(ready))
    return done


def test_argo_dag_commands_run_end_to_end(tmp_path, sandbox_service, micro_config):
    config = micro_config
    doc = yaml.safe_load(build_workflow_template(defaults=config).to_yaml())
    spec = doc["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    dag = {t["name"]: t for t in templates[spec["entrypoint"]]["dag"]["tasks"]}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    scope = {f"workflow.parameters.{p['name']}": str(p["value"]) for p in spec["arguments"]["parameters"]}
    scope.update(
        {
            "workflow.parameters.sandbox_url": sandbox_service.url,
            "workflow.parameters.mlflow_uri": uri,
            "workflow.parameters.overrides_json": config.model_dump_json(),
            "workflow.name": "wf-test",
        }
    )
    data, outputs = tmp_path / "data", tmp_path / "outputs"
    env = {**os.environ, "ORCHARD_SANDBOX_TOKEN": sandbox_service.token}  # secretKeyRef orchard-api-token/token

    def run(template: dict, local: dict[str, str]) -> None:
        container = template["container"]
        argv = [
            _render(a, local).replace("/data", str(data)).replace("/tmp/outputs", str(outputs))
            for a in container["command"] + container.get("args", [])
        ]
        assert argv[0] == "python"
        proc = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{template['name']} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    for name in _toposort(dag):
        task = dag[name]
        template = templates[task["template"]]
        local = dict(scope)
        for p in template.get("inputs", {}).get("parameters", []):
            if "default" in p:
                local[f"inputs.parameters.{p['name']}"] = p["default"]
        for p in task.get("arguments", {}).get("parameters", []):
            local[f"inputs.parameters.{p['name']}"] = _render(str(p["value"]), scope)
        run(template, local)
        for p in template.get("outputs", {}).get("parameters", []):
            value = Path(p["valueFrom"]["path"].replace("/tmp/outputs", str(outputs))).read_text()
            scope[f"tasks.{name}.outputs.parameters.{p['name']}"] = value
            if p.get("globalName"):
                scope[f"workflow.outputs.parameters.{p['globalName']}"] = value
    run(templates[spec["onExit"]], {**scope, "workflow.status": "Succeeded"})

    run_dir = data / "wf-test"
    assert (run_dir / "report.md").exists() and "| rl |" in (run_dir / "report.md").read_text()
    parent_id = scope["tasks.start.outputs.parameters.parent_run_id"]
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["orchard.runner"] == "argo"
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    from pipelines.stages import STAGES

    assert sorted(c.info.run_name for c in children) == sorted(s.name for s in STAGES)
    assert json.loads((run_dir / "results" / "distill.json").read_text())["metrics"]["n_trajectories"] == 2
    started = PipelineConfig.model_validate_json(scope["tasks.start.outputs.parameters.config_json"])
    assert started.provision.n_train == 2 and started.sandbox_url == sandbox_service.url
