"""A service run from a virtualenv reached through symlinks: its sandboxes still find `python` (the venv's,
by its resolved path), whichever link leads there."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import sandbox_service
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService


@pytest.fixture(scope="module")
def real_venv():
    """A fresh venv under /tmp that can run the service: this one's packages and checkout on its path."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="orchard-venv-") as tmp:
        venv = Path(tmp) / "real" / "venv"
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
        site_dir = next((venv / "lib").glob("python3*")) / "site-packages"
        checkout = Path(sandbox_service.__file__).resolve().parents[1]
        (site_dir / "orchard-host.pth").write_text("\n".join([str(checkout), *site.getsitepackages()]) + "\n")
        yield Path(tmp), venv


@pytest.mark.parametrize("link", ["the venv itself", "a directory above it"])
def test_sandbox_runs_the_venv_python_by_its_resolved_path(real_venv, link):
    tmp, venv = real_venv
    if link == "the venv itself":  # .venv -> /tmp/.../real/venv
        link_path, python = tmp / "dot-venv", tmp / "dot-venv" / "bin" / "python"
        os.symlink(venv, link_path)
    else:  # /tmp/.../proj -> /tmp/.../real, venv at proj/venv
        link_path, python = tmp / "proj", tmp / "proj" / "venv" / "bin" / "python"
        os.symlink(tmp / "real", link_path)
    try:
        with (
            EmbeddedService(ServiceConfig(token="unused"), python=str(python)) as service,
            service.client() as client,
            client.create() as sandbox,
        ):
            result = sandbox.exec("command -v python && python -c 'import sys; print(sys.prefix)'")
    finally:
        os.unlink(link_path)
    assert result.exit_code == 0, result.stdout + result.stderr
    found, prefix = result.stdout.split()
    assert found == str(venv.resolve() / "bin" / "python")
    assert prefix == str(venv.resolve())
