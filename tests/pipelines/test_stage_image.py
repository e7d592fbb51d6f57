"""The stage image (docker/stage-runtime) installs every distribution the stages import, and every preset's
runtime needs besides imports.

Found on the test cluster: the image installed the project without its extras, and the rl stage died
with "No module named 'trl'" after every stage before it had run; later, the smol preset's init-policy could
not convert its named model: the image lacked the wheel holding the model's file.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipelines.config import PRESETS

REPO = Path(__file__).resolve().parents[2]
STAGE_CODE = ("components", "pipelines")
# Not stage code: `orchard env serve` (the openenv extra) runs from the project's venv, never in a stage pod.
NOT_IN_STAGES = {"components/envs/openenv_env.py"}
# Imported by stage code only when a setting asks for it, from an image the user provides.
OPTIONAL = {"vllm": "rl.use_vllm on GPU nodes (TRL's colocated vLLM): an image built with vLLM"}


def installed_closure(dist: str, extras: set[str]) -> set[str]:
    """Every distribution `pip install dist[extras]` installs (from the metadata of this environment)."""
    todo, seen = [(dist, frozenset(extras))], set()
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in seen:
            continue
        seen.add((canonicalize_name(name), wanted))
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue  # a requirement whose marker excludes this platform was never installed
        for line in reqs:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def third_party_imports(root: Path) -> dict[str, str]:
    """Top-level module -> a file importing it, for every non-stdlib, non-project import in the stage code."""
    own = {"components", "pipelines", "sandbox_service"}
    found: dict[str, str] = {}
    for sub in STAGE_CODE:
        for path in sorted((root / sub).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in NOT_IN_STAGES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                )
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in own:
                        found.setdefault(top, rel)
    return found


def image_install_set() -> set[str]:
    """Every distribution the stage image installs: the project with STAGE_EXTRAS and their dependencies, plus
    the requirements of STAGE_DATA_EXTRAS (installed without dependencies), as canonical names."""
    from pipelines.image_extras import extra_requirements

    dockerfile = (REPO / "docker" / "stage-runtime" / "Dockerfile").read_text()
    extras = set(re.search(r"^ARG STAGE_EXTRAS=(\S+)$", dockerfile, re.M).group(1).split(","))
    assert '".[${STAGE_EXTRAS}]"' in dockerfile, "the image must install the project with STAGE_EXTRAS"
    data = re.search(r"^ARG STAGE_DATA_EXTRAS=(\S*)$", dockerfile, re.M)
    assert data and 'python -m pipelines.image_extras "${STAGE_DATA_EXTRAS}"' in dockerfile, (
        "the image must install STAGE_DATA_EXTRAS' requirements (pip install --no-deps)"
    )
    data_reqs = extra_requirements([e for e in data.group(1).split(",") if e], REPO / "pyproject.toml")
    return installed_closure("orchard", extras) | {canonicalize_name(Requirement(r).name) for r in data_reqs}


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_stage_image_installs_each_presets_runtime_needs(preset):
    """Every named model a preset's config names anywhere (the smol preset's `model.path`) comes with what it
    needs at run time: the wheel holding its file and what reads it."""
    from components.core.policy.named_models import RUNTIME_DISTRIBUTIONS, is_named
    from pipelines.config import resolve

    named = {v for v in _strings(resolve(preset).model_dump(mode="json")) if is_named(v)}
    if preset == "smol":
        assert named == {"smollm2-135m-instruct"}, named  # the check below is not vacuous
    needs = {canonicalize_name(d) for name in named for d in RUNTIME_DISTRIBUTIONS[name]}
    missing = needs - image_install_set()
    assert not missing, f"preset {preset} needs {sorted(missing)} at run time; the stage image does not install them"


def test_the_stage_image_installs_every_distribution_the_stages_import():
    installed = image_install_set()
    providers = packages_distributions()
    missing = {
        module: where
        for module, where in third_party_imports(REPO).items()
        if module not in OPTIONAL and not {canonicalize_name(d) for d in providers.get(module, [module])} & installed
    }
    assert not missing, f"imported by stage code but not installed in the stage image: {missing}"
