"""The agent injector builds for amd64 and arm64 nodes on scripts/build-images.sh.

No image is built here (the builds are test_images_build.py's slow tests; no binfmt/QEMU for arm64).
What is checked: the Dockerfile's architecture mapping asks uv for the right python-build-standalone
asset per TARGETARCH (the RUN step's own shell, with a stand-in `uv` recording its request), the
standalone download runs on the build platform while the debian bundle and the import check run on the
target's, and `INJECTOR_PLATFORMS=` makes build-images.sh call each builder's manifest-list form for the
injector only (stand-in builders record their argv).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.manifests.test_images import _path_with, _run

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "agent-injector" / "Dockerfile"
PLATFORMS = "linux/amd64,linux/arm64"


def _stages() -> dict[str, str]:
    """FROM line -> the stage's text (up to the next FROM)."""
    parts = re.split(r"^FROM (.+)$", DOCKERFILE.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _run_step(containing: str) -> str:
    """The Dockerfile RUN instruction containing `containing`, as one shell command."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    (step,) = [line[len("RUN ") :] for line in text.splitlines() if line.startswith("RUN ") and containing in line]
    return step.replace("--mount=type=bind,source=docker/wheelhouse,target=/wheels ", "")


def _fetch(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The fetch step in sh with stand-in `pip` and `uv`: uv records its request, then stops the step
    before it touches /opt."""
    bin_dir = tmp_path / "fake"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho pip "$@" >> {tmp_path}/calls\n')
    (bin_dir / "uv").write_text(f'#!/bin/sh\necho uv "$@" >> {tmp_path}/calls\nkill -TERM $PPID\n')
    for tool in ("pip", "uv"):
        (bin_dir / tool).chmod(0o755)
    return subprocess.run(
        ["sh", "-c", _run_step("uv python install")],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "UV_VERSION": "0.13.8",
            "PYTHON_VERSION": "3.12",
            "PYTHON_LIBC": "gnu",
            **env,
        },
    )


@pytest.mark.parametrize(
    "arch, asset", [("amd64", "cpython-3.12-linux-x86_64-gnu"), ("arm64", "cpython-3.12-linux-aarch64-gnu")]
)
def test_the_standalone_download_follows_the_target_architecture(tmp_path, arch, asset):
    _fetch(tmp_path, TARGETARCH=arch, PYTHON_SOURCE="standalone", PIP_OFFLINE="1")
    pip, uv = (tmp_path / "calls").read_text().splitlines()
    assert pip == "pip install --no-cache-dir --find-links /wheels uv==0.13.8"
    assert uv.split() == ["uv", "python", "install", "--install-dir", "/opt/pbs", asset]


def test_an_unsupported_architecture_or_source_fails_the_build_with_a_message(tmp_path):
    arch = _fetch(tmp_path / "arch", TARGETARCH="s390x", PYTHON_SOURCE="standalone")
    assert arch.returncode == 1 and "no standalone Python for architecture s390x (amd64, arm64)" in arch.stderr
    source = _fetch(tmp_path / "source", PYTHON_SOURCE="conda")
    assert source.returncode == 1 and "PYTHON_SOURCE=conda: use standalone or debian" in source.stderr


def test_the_debian_source_downloads_nothing_on_the_build_platform(tmp_path):
    out = _fetch(tmp_path, TARGETARCH="arm64", PYTHON_SOURCE="debian")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "calls").exists()


def test_the_download_runs_on_the_build_platform_and_the_rest_on_the_targets():
    stages = _stages()
    assert list(stages) == [
        "--platform=$BUILDPLATFORM ${BASE_IMAGE} AS fetch",
        "${BASE_IMAGE} AS check",
        "${FINAL_BASE_IMAGE}",
    ]
    fetch, check, final = stages.values()
    assert "uv python install" in fetch and "bundle-debian-python.sh" not in fetch
    # The debian bundle copies the base's own interpreter: it must run where the base is the target's.
    assert "sh /tmp/bundle-debian-python.sh" in check and "COPY --from=fetch /opt/orchard /opt/orchard" in check
    assert check.count('"$AGENT_MOUNT_PATH/python/bin/python3" -I -S') == 1
    assert "cp /bin/busybox /opt/cp-bin/cp" in check  # the scratch image's cp is the target's busybox
    assert re.findall(r"^COPY --from=(\S+)", final, re.M) == ["check", "check"]


@pytest.mark.parametrize(
    "builder, expected",
    [
        (
            "buildah",
            [
                "--storage-driver vfs manifest rm r/agent-injector:1",
                "--storage-driver vfs bud --quiet --layers=false --isolation chroot --platform "
                + PLATFORMS
                + " -f docker/agent-injector/Dockerfile --manifest r/agent-injector:1 .",
                "--storage-driver vfs manifest push --quiet --all r/agent-injector:1 oci-archive:{out}:r/agent-injector:1",  # noqa: E501
            ],
        ),
        (
            "podman",
            [
                "manifest rm r/agent-injector:1",
                f"build --platform {PLATFORMS} -f docker/agent-injector/Dockerfile --manifest r/agent-injector:1 .",
                "manifest push --all r/agent-injector:1 oci-archive:{out}:r/agent-injector:1",
            ],
        ),
        (
            "docker",
            [f"buildx build --platform {PLATFORMS} -f docker/agent-injector/Dockerfile -t r/agent-injector:1 --push ."],
        ),
    ],
)
def test_injector_platforms_builds_one_manifest_list_with_each_builder(tmp_path, builder, expected):
    path = _path_with(tmp_path, {builder: 0})
    archives = tmp_path / "oci"
    out = _run(
        "mlflow",
        "agent-injector",
        path=path,
        BUILDER=builder,
        REGISTRY="r",
        TAG="1",
        INJECTOR_PLATFORMS=PLATFORMS,
        OCI_ARCHIVE_DIR=str(archives),
        BUILDAH_STORAGE_DRIVER="vfs",
    )
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / f"{builder}.calls").read_text().splitlines()
    mlflow = [c for c in calls if "r/mlflow:1" in c]
    assert mlflow and not any("--platform" in c or "manifest" in c for c in mlflow), "only the injector is multi-arch"
    injector = [c for c in calls if "r/agent-injector:1" in c]
    assert injector == [c.format(out=archives / "agent-injector.oci.tar") for c in expected]
    if builder == "docker":
        assert "docker pushed r/agent-injector:1 (a manifest list); no archive of it written" in out.stderr


def test_the_local_base_refuses_a_foreign_platform_before_building(tmp_path):
    path = _path_with(tmp_path, {"buildah": 0})
    out = _run("agent-injector", path=path, BASE_IMAGE="local", INJECTOR_PLATFORMS=PLATFORMS)
    assert out.returncode == 2
    assert "with BASE_IMAGE=local: the local base is linux/" in out.stderr and "use a public BASE_IMAGE" in out.stderr
    assert not (tmp_path / "buildah.calls").exists()


def test_make_images_passes_injector_platforms(tmp_path):
    out = subprocess.run(
        ["make", "-n", "images", f"INJECTOR_PLATFORMS={PLATFORMS}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f'INJECTOR_PLATFORMS="{PLATFORMS}" REGISTRY="orchard" TAG="0.1.0" ./scripts/build-images.sh' in out.stdout
