"""The agent injector builds for amd64 and arm64 nodes (issue 22, item 7).

No image is built here (no registry access, no binfmt/QEMU for arm64). What is checked: the
Dockerfile's architecture mapping asks uv for the right python-build-standalone asset per
TARGETARCH (the RUN step's own shell, with `uv` recording its request), the download stage runs on
the build platform and the import check on the target's, and `PLATFORMS=` makes build-image.sh call
each builder's multi-platform form (stub builders record their arguments).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "agent-injector" / "Dockerfile"


def _run_step(containing: str) -> str:
    """The Dockerfile RUN instruction containing `containing`, as one shell command."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    (step,) = [line[len("RUN "):] for line in text.splitlines() if line.startswith("RUN ") and containing in line]
    return step


@pytest.mark.parametrize("arch, asset", [("amd64", "cpython-3.12-linux-x86_64-gnu"),
                                         ("arm64", "cpython-3.12-linux-aarch64-gnu")])
def test_the_python_download_follows_the_target_architecture(tmp_path, arch, asset):
    step = _run_step("uv python install")
    stub = tmp_path / "uv"  # records the request, then stops the step before it touches /opt
    stub.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/request\nkill -TERM $PPID\n")
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "TARGETARCH": arch, "PYTHON_VERSION": "3.12",
           "PYTHON_LIBC": "gnu"}
    subprocess.run(["sh", "-c", step], env=env, capture_output=True, text=True, timeout=30)
    assert (tmp_path / "request").read_text().split() == ["python", "install", "--install-dir", "/opt/pbs", asset]


def test_an_unsupported_architecture_fails_the_build_with_a_message(tmp_path):
    out = subprocess.run(["sh", "-c", _run_step("uv python install")], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "TARGETARCH": "s390x"})
    assert out.returncode == 1 and "no standalone Python for architecture s390x (amd64, arm64)" in out.stderr


def test_only_the_check_stage_runs_the_targets_interpreter():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (.+)$", text, re.M)
    assert stages == ["--platform=$BUILDPLATFORM ${BASE} AS fetch", "${BASE} AS check", "${FINAL_BASE}"]
    check = text[text.index("AS check"):]
    assert "/opt/orchard/python/bin/python3 -I -S" in check and "COPY --from=check /opt/orchard /opt/orchard" in check


def _stub_builders(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "podman", "buildah"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho \"{tool} $*\" >> {tmp_path}/calls\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("builder, build, archive", [
    ("buildah", "buildah --storage-driver vfs bud --quiet --platform linux/amd64,linux/arm64 -f "
                "docker/agent-injector/Dockerfile --manifest r/agent-injector:1 .",
     "buildah --storage-driver vfs manifest push --quiet --all r/agent-injector:1 oci-archive:{out}:r/agent-injector:1"),
    ("podman", "podman build --platform linux/amd64,linux/arm64 -f docker/agent-injector/Dockerfile "
               "--manifest r/agent-injector:1 .",
     "podman manifest push --all r/agent-injector:1 oci-archive:{out}:r/agent-injector:1"),
    ("docker", "docker buildx build --platform linux/amd64,linux/arm64 -f docker/agent-injector/Dockerfile "
               "-t r/agent-injector:1 --push .", None),
])
def test_platforms_builds_one_manifest_list_with_each_builder(tmp_path, builder, build, archive):
    bin_dir = _stub_builders(tmp_path)
    out_dir = tmp_path / "images"
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh"), "agent-injector", "r/agent-injector:1"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BUILDER": builder,
             "PLATFORMS": "linux/amd64,linux/arm64", "OCI_ARCHIVE_DIR": str(out_dir), "BASE": ""})
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    expected = [build] + ([archive.format(out=out_dir / "agent-injector.oci.tar")] if archive else [])
    assert calls == expected


def test_make_images_passes_platforms_to_the_injector_only(tmp_path):
    out = subprocess.run(["make", "-n", "images", "INJECTOR_PLATFORMS=linux/amd64,linux/arm64"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = re.findall(r'PLATFORMS="([^"]*)"\s+\./scripts/build-image\.sh (\S+)', out.stdout)
    assert dict((name, platforms) for platforms, name in calls) == {
        "sandbox-service": "", "agent-injector": "linux/amd64,linux/arm64", "mlflow": "", "stage-runtime": "",
        "stage-runtime-gpu": ""}
