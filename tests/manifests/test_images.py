"""`make images`: every image of pipelines/cluster.py, with whichever builder is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipelines.cluster import IMAGE_NAMES

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-image.sh"


def _run(*args: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path, "BUILDER": ""})


def test_without_any_builder_the_message_says_what_to_install(tmp_path):
    # A PATH with the shell tools but no docker, podman or buildah.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "bash"):
        (bin_dir / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True).stdout.strip())
    out = _run("stage-runtime", "orchard/stage-runtime:0.1.0", path=str(bin_dir))
    assert out.returncode == 127
    assert "no image builder found; install one of docker, podman or buildah" in out.stderr


def test_every_image_has_a_dockerfile_that_takes_its_base_as_a_build_argument():
    for name in IMAGE_NAMES:
        dockerfile = REPO / "docker" / ("stage-runtime" if name == "stage-runtime-gpu" else name) / "Dockerfile"
        text = dockerfile.read_text()
        assert "ARG BASE=" in text and "FROM ${BASE}" in text, f"{dockerfile}: base image is not a build argument"
    out = _run("no-such-image", "x/y:1", path=os.environ["PATH"])
    assert out.returncode == 2 and "no Dockerfile for image 'no-such-image'" in out.stderr
