"""`make images` (scripts/build-images.sh): the names, the builder it picks, the arguments it passes.

The builds themselves are the slow tests in test_images_build.py; here a PATH with stand-in `docker`,
`podman` and `buildah` commands decides which builder "works", and the stand-ins record their argv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import compile_all
from pipelines.cluster import IMAGE_NAMES, ClusterConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-images.sh"
# Shell tools the script itself uses; the stand-in builders come on top of these.
TOOLS = (
    "bash",
    "dirname",
    "grep",
    "head",
    "tail",
    "tr",
    "timeout",
    "cat",
    "mkdir",
    "du",
    "cut",
    "rm",
    "sed",
    "sha256sum",
)


def _path_with(tmp_path: Path, builders: dict[str, int]) -> str:
    """A PATH holding the script's tools plus builders whose `info` exits with the given status."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    # The interpreter itself, not a version manager's shim (pyenv's needs more than this PATH).
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    for name, info_status in builders.items():
        # `info`/`version` answer like an engine that is up (0) or down (1); a build records its argv.
        (bin_dir / name).write_text(
            "#!/bin/bash\n"
            f'case "$1" in info|version) exit {info_status};; esac\n'
            f'printf "%s\\n" "$*" >> "{tmp_path}/{name}.calls"\n'
        )
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def _run(*args: str, path: str, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "BUILDER",
            "BASE_IMAGE",
            "OFFLINE",
            "WHEELHOUSE",
            "OCI_ARCHIVE_DIR",
            "REGISTRY",
            "TAG",
            "INJECTOR_PLATFORMS",
        )
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env={**clean, "PATH": path, **env}
    )


def test_the_builder_builds_exactly_the_images_the_manifests_and_compiled_pipelines_name(tmp_path):
    listed = _run("--list", path=os.environ["PATH"]).stdout.split()
    assert listed == list(IMAGE_NAMES)

    registry, tag = "registry.example/team", "7"
    compiled = compile_all(tmp_path / "compiled", cluster=ClusterConfig(image_registry=registry, image_tag=tag))
    # Every <registry>/<name>:<tag> anywhere in the KFP YAML, the WorkflowTemplate and the CronWorkflow.
    pattern = re.compile(re.escape(registry) + r"/[a-z0-9.-]+:[\w.-]+")
    pipeline_images = {m for path in compiled.values() for m in pattern.findall(path.read_text())}
    built = {f"{registry}/{name}:{tag}" for name in listed}
    assert pipeline_images and pipeline_images <= built, pipeline_images - built

    if shutil.which("kubectl"):
        from tests.manifests.test_manifests import pod_templates, render

        dev = render("overlays/dev")
        images = {c["image"] for d in dev for t in pod_templates(d) for c in t["spec"]["containers"]}
        images |= {
            e["value"]
            for d in dev
            for t in pod_templates(d)
            for c in t["spec"]["containers"]
            for e in c.get("env", [])
            if e["name"] == "ORCHARD_K8S_INJECTOR_IMAGE"
        }
        assert images <= {f"orchard/{name}:{ClusterConfig().image_tag}" for name in listed}, images
        assert (
            pipeline_images | {i.replace("orchard/", f"{registry}/").replace(":0.1.0", f":{tag}") for i in images}
            == built
        ), "every image the script builds is used by the manifests or the pipelines"


def test_a_docker_cli_without_an_engine_is_skipped_and_no_builder_is_one_clear_line(tmp_path):
    path = _path_with(tmp_path, {"docker": 1})  # the CLI is there, `docker info` fails: no engine
    out = _run("stage-runtime", path=path)
    assert out.returncode == 127
    assert out.stderr.count("\n") == 1, out.stderr
    assert "no working image builder" in out.stderr
    assert "docker installed but not working" in out.stderr and "buildah not installed" in out.stderr
    assert "apt-get install buildah" in out.stderr
    assert not (tmp_path / "docker.calls").exists()

    forced = _run("stage-runtime", path=path, BUILDER="docker")
    assert forced.returncode == 127 and "is its engine running?" in forced.stderr


def test_it_falls_back_to_podman_then_buildah_and_passes_names_base_and_archive(tmp_path):
    path = _path_with(tmp_path, {"docker": 1, "podman": 1, "buildah": 0})
    archives = tmp_path / "oci"
    out = _run(
        "stage-runtime-gpu",
        "agent-injector",
        path=path,
        REGISTRY="reg.example/x",
        TAG="9",
        BASE_IMAGE="debian-python:local",
        GPU_TORCH="cpu",
        OCI_ARCHIVE_DIR=str(archives),
    )
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "buildah.calls").read_text().splitlines()
    builds = [c for c in calls if " bud " in f" {c} "]
    assert len(builds) == 2
    gpu, injector = builds
    assert "-f docker/stage-runtime/Dockerfile -t reg.example/x/stage-runtime-gpu:9" in gpu
    assert "--build-arg BASE_IMAGE=debian-python:local" in gpu and "TORCH_SPEC" not in gpu  # GPU_TORCH=cpu
    assert "--storage-driver vfs" in gpu and "--isolation chroot" in gpu
    assert "-f docker/agent-injector/Dockerfile -t reg.example/x/agent-injector:9" in injector
    assert "FINAL_BASE_IMAGE" not in injector and "PYTHON_SOURCE" not in injector  # busybox + standalone
    pushes = [c for c in calls if " push " in f" {c} "]
    assert pushes[0].endswith(
        f"reg.example/x/stage-runtime-gpu:9 oci-archive:{archives}/stage-runtime-gpu.oci.tar"
        ":reg.example/x/stage-runtime-gpu:9"
    )

    out = _run("stage-runtime-gpu", path=path, BUILDER="podman")
    assert out.returncode == 127 and "BUILDER=podman does not work here" in out.stderr
    cuda = _run("stage-runtime-gpu", path=_path_with(tmp_path / "p", {"podman": 0}))
    assert cuda.returncode == 0, cuda.stderr
    (build,) = (tmp_path / "p" / "podman.calls").read_text().splitlines()
    assert build.startswith("build ") and "TORCH_SPEC=torch==2.13.0 " in build + " " and "cu128" in build
    assert "BASE_IMAGE" not in build, "without BASE_IMAGE the Dockerfile's public base is used"


def test_offline_uses_the_cached_local_base_the_cpu_torch_and_the_debian_python_injector(tmp_path):
    path = _path_with(tmp_path, {"buildah": 0})
    cache = tmp_path / "cache"
    cache.mkdir()
    key = subprocess.run(
        ["sha256sum", str(SCRIPT.parent / "build-base-rootfs.sh")], capture_output=True, text=True
    ).stdout[:12]
    (cache / f"base-bookworm-py311-{key}.tar").write_bytes(b"cached")  # no mmdebstrap run when it is there
    out = _run(
        "agent-injector",
        "stage-runtime-gpu",
        "stage-runtime",
        path=path,
        OFFLINE="1",
        WHEELHOUSE="",
        ORCHARD_IMAGE_CACHE=str(cache),
    )
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "buildah.calls").read_text()
    injector, gpu = [c for c in calls.splitlines() if " bud " in f" {c} "]
    # stage-runtime has the very arguments of the CPU-torch GPU image: tagged, not built twice.
    assert "--storage-driver vfs tag orchard/stage-runtime-gpu:0.1.0 orchard/stage-runtime:0.1.0" in calls
    base = f"--build-arg BASE_IMAGE=localhost/orchard-base:bookworm-py311-{key}"
    assert base in injector and base in gpu
    assert "--build-arg FINAL_BASE_IMAGE=scratch" in injector and "--build-arg PYTHON_SOURCE=debian" in injector
    assert "TORCH_SPEC" not in gpu and "PIP_OFFLINE" not in gpu  # the CPU wheel; WHEELHOUSE= turned it off


def test_every_dockerfile_takes_its_base_as_a_build_argument_with_a_public_default():
    for name in IMAGE_NAMES:
        dockerfile = REPO / "docker" / ("stage-runtime" if name == "stage-runtime-gpu" else name) / "Dockerfile"
        text = dockerfile.read_text()
        assert "ARG BASE_IMAGE=python:3.1" in text and "FROM ${BASE_IMAGE}" in text, dockerfile
        assert "--mount=type=bind,source=docker/wheelhouse,target=/wheels" in text, dockerfile
    out = _run("no-such-image", path=os.environ["PATH"])
    assert out.returncode == 2 and "unknown image 'no-such-image'; the images are: sandbox-service" in out.stderr


@pytest.mark.parametrize("image", ["sandbox-service", "mlflow"])
def test_requirements_files_resolve_against_the_pins(image):
    """The wheelhouse is filled from these files and constraints.txt; an unpinned extra would float."""

    def norm(name: str) -> str:  # PEP 503: pip treats prometheus_client and prometheus-client alike
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {norm(line.split("==")[0]) for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
    for line in (REPO / "docker" / image / "requirements.txt").read_text().splitlines():
        req = line.split("#")[0].strip()
        if req:
            assert "==" in req or norm(req) in pins, f"{image}: {req} is pinned neither here nor in constraints.txt"


def test_make_images_and_make_compile_take_the_same_registry_and_tag():
    makefile = (REPO / "Makefile").read_text()
    assert 'REGISTRY="$(REGISTRY)" TAG="$(TAG)" ./scripts/build-images.sh' in makefile
    assert "--image-registry $(REGISTRY) --image-tag $(TAG)" in makefile
