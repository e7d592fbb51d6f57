"""The import architecture: the layers hold (`lint-imports`, contracts in pyproject.toml) and no module imports
itself back through others, counting imports inside functions and under `if TYPE_CHECKING`.

pipelines (the DAG) sits above components (the stages), which sit above sandbox_service (the environment layer);
a lower layer imports nothing of a higher one. A cycle is reported as the chain of imports that closes it, each
with its file line, so the fix is to move the shared definition to the module it belongs in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipelines", "sandbox_service", "tests")


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One cycle through the component's first module (a shortest one), as `a -> b (file line: code) -> ... -> a`."""
    members, start = set(component), component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in parents:
        following = []
        for node in frontier:
            for child in sorted(graph.find_modules_directly_imported_by(node) & members):
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    chain = [start]
    while True:
        chain.append(parents[chain[-1]])
        if chain[-1] == start:
            break
    chain.reverse()
    steps = [start]
    for importer, imported in zip(chain, chain[1:]):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = f" ({details[0]['line_number']}: {details[0]['line_contents']})" if details else ""
        steps.append(f"-> {imported}{where}")
    return " ".join(steps)


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = [describe_cycle(graph, component) for component in strongly_connected(graph)]
    assert not cycles, "import cycles (move the shared definition to the module it belongs in):\n" + "\n".join(cycles)


def test_import_contracts():
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint) if lint.exists() else shutil.which("lint-imports") or "lint-imports", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"lint-imports failed:\n{proc.stdout}\n{proc.stderr}"


CODE = ("components", "pipelines", "sandbox_service")
MAX_FLAT_MODULES = 17  # "about 15": a folder past it is split by job (backends/local, core/policy, pipelines/kfp, ...)


def test_no_package_folder_holds_more_than_about_15_modules():
    crowded = {
        str(folder.relative_to(ROOT)): n
        for package in CODE
        for folder in [ROOT / package, *(ROOT / package).rglob("*")]
        if folder.is_dir()
        and (folder / "__init__.py").exists()
        and (n := len(list(folder.glob("*.py")))) > MAX_FLAT_MODULES
    }
    assert not crowded, f"split these folders by job: {crowded}"


def test_one_client_talks_to_openai_compatible_endpoints():
    """Policies, the judge and the preflight check share `components/core/policy/endpoint.py` (its key handling,
    timeouts and retries); a second hand-written client of /chat/completions fails here."""
    own = ROOT / "components" / "core" / "policy" / "endpoint.py"
    others = [
        str(path.relative_to(ROOT))
        for package in CODE
        for path in (ROOT / package).rglob("*.py")
        if path != own and re.search(r"(httpx|_http)\.\w+\([^)]*chat/completions", path.read_text())
    ]
    assert not others, f"use components.core.policy.endpoint.ChatEndpoint in {others}"


def test_one_progress_library():
    """Bars are tqdm's (the Hugging Face stack's, switched off together when piped: components/core/console.py);
    rich draws tables and lines, never a second kind of bar or spinner."""
    others = [
        str(path.relative_to(ROOT))
        for package in CODE
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"rich\.progress|rich\.status|console\.status\(", path.read_text())
    ]
    assert not others, f"use tqdm for progress in {others}"
