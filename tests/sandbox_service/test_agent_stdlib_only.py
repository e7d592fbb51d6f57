"""The agent package imports with the standard library alone (it is injected into arbitrary images)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_agent_module_imports_without_site_packages(tmp_path):
    # Only sandbox_service/__init__.py and the agent package on the path, as in the injector image.
    root = tmp_path / "agent"
    (root / "sandbox_service").mkdir(parents=True)
    (root / "sandbox_service" / "__init__.py").write_text((REPO / "sandbox_service" / "__init__.py").read_text())
    subprocess.run(["cp", "-r", str(REPO / "sandbox_service" / "agent"), str(root / "sandbox_service")], check=True)
    modules = sorted(p.stem for p in (REPO / "sandbox_service" / "agent").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys; sys.path.insert(0, %r)\n" % str(root)
        + "for m in %r: importlib.import_module('sandbox_service.agent.' + m)\n" % modules
        + "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('pydantic', 'cryptography', 'httpx', 'fastapi'))\n"  # noqa: E501
        + "print('third-party:', bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {"client", "client_base", "tls"}.isdisjoint(modules), "control-plane code is outside agent/"
