"""Every image builds here, offline, into an OCI archive, and the archives run what the cluster runs.

`OFFLINE=1 scripts/build-images.sh` (no registry, no GitHub, no package index: the mmdebstrap base and
docker/wheelhouse) writes one `oci-archive` per image of pipelines/cluster.py. Each archive is then
unpacked and run the way a container runtime would (its config's user, env, working directory) in a
private mount and pid namespace around a chroot: crun cannot start containers on this host (its cgroups
are hybrid), and the point is what is *in* the image. Checked: the stage runtime runs the Argo
WorkflowTemplate's own start and close-run commands (MLflow in sqlite on a /data volume), the agent
injector's init command fills a volume whose Python runs the agent's imports in a root with nothing else
(no libc, no shell), the service and MLflow images start their programs. Needs root, buildah (or a
working docker/podman), mmdebstrap and a Debian mirror; 20-40 min on this loaded 2-core machine.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
import yaml

from pipelines import stages
from pipelines.argo.workflow import build_workflow_template
from pipelines.cluster import IMAGE_NAMES, VERSION

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(4 * 3600),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"),
    pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap builds the offline base"),
]


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> Path:
    out = Path(os.environ.get("ORCHARD_TEST_OCI_DIR") or tmp_path_factory.mktemp("oci"))
    if not all((out / f"{name}.oci.tar").exists() for name in IMAGE_NAMES):  # a kept dir skips the build
        env = {**os.environ, "OFFLINE": "1", "OCI_ARCHIVE_DIR": str(out), "REGISTRY": "orchard", "TAG": VERSION}
        proc = subprocess.run(
            ["nice", "-n", "15", "bash", str(REPO / "scripts/build-images.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=4 * 3600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _blob(layout: tarfile.TarFile, digest: str) -> bytes:
    return layout.extractfile("blobs/" + digest.replace(":", "/")).read()


def image_manifest(archive: Path) -> tuple[dict, dict, dict]:
    """(index, manifest, config) of a one-image OCI archive."""
    with tarfile.open(archive) as layout:
        index = json.loads(layout.extractfile("index.json").read())
        (entry,) = index["manifests"]
        manifest = json.loads(_blob(layout, entry["digest"]))
        config = json.loads(_blob(layout, manifest["config"]["digest"]))
    return index, manifest, config


def unpack(archive: Path, root: Path) -> dict:
    """Apply the image's layers in order onto `root`; returns the image config.

    By hand (tarfile) rather than umoci/skopeo, which this machine lacks: what kind or a registry would
    receive is exactly this archive, so unpacking it without the builder's store is the honest check.
    """
    _, manifest, config = image_manifest(archive)
    root.mkdir(parents=True)
    with tarfile.open(archive) as layout:
        for layer in manifest["layers"]:
            data = _blob(layout, layer["digest"])
            if layer["mediaType"].endswith("gzip"):
                data = gzip.decompress(data)
            layer_tar = root.parent / "layer.tar"
            layer_tar.write_bytes(data)
            with tarfile.open(layer_tar) as tar:
                members = []
                for m in tar.getmembers():  # OCI whiteouts: delete what a lower layer had
                    name = Path(m.name)
                    if name.name == ".wh..wh..opq":
                        for child in (root / name.parent).glob("*"):
                            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
                    elif name.name.startswith(".wh."):
                        gone = root / name.parent / name.name[4:]
                        if gone.is_dir() and not gone.is_symlink():
                            shutil.rmtree(gone)
                        elif gone.exists() or gone.is_symlink():
                            gone.unlink()
                    else:
                        members.append(m)
                tar.extractall(root, members=members, numeric_owner=True, filter="fully_trusted")
            layer_tar.unlink()
    return config


def run_in(
    root: Path,
    argv: list[str],
    config: dict | None = None,
    binds: dict[str, Path] | None = None,
    timeout: float = 600,
    background: bool = False,
):
    """Run argv in `root` as the image config says (user, env, workdir), /proc and /dev mounted, binds added."""
    cfg = (config or {}).get("config", {})
    user = cfg.get("User") or "0"
    userspec = user if ":" in user else f"{user}:{user}"
    env = cfg.get("Env") or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    workdir = cfg.get("WorkingDir") or "/"
    steps = [
        f"mkdir -p {root}/proc {root}/dev {root}/tmp",
        f"mount -t proc proc {root}/proc",
        f"mount --rbind /dev {root}/dev",
    ]
    for dst, src in (binds or {}).items():
        steps += [f"mkdir -p {root}{dst}", f"mount --bind {src} {root}{dst}"]
    # env from the *host* (chroot runs it before entering): the root may have no env, no shell at all.
    inner = shlex.join(["chroot", f"--userspec={userspec}", str(root), *argv])
    script = " && ".join(steps) + f" && cd {root}{workdir} && exec env -i {shlex.join(env)} {inner}"
    cmd = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script]
    if background:
        # Its own session: killing the group kills unshare and the namespace's PID 1, so everything in it.
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_every_image_builds_offline_into_an_oci_archive_with_the_cluster_name(archives):
    for name in IMAGE_NAMES:
        archive = archives / f"{name}.oci.tar"
        assert archive.stat().st_size > 1_000_000, archive
        index, manifest, config = image_manifest(archive)
        ref = index["manifests"][0].get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        assert ref.endswith(f"orchard/{name}:{VERSION}"), (name, ref)
        assert config["architecture"] == "amd64" and config["os"] == "linux" and manifest["layers"]


def test_stage_runtime_runs_the_workflow_templates_start_and_close_steps(archives, tmp_path):
    config = unpack(archives / "stage-runtime.oci.tar", tmp_path / "root")
    assert config["config"]["User"] == "10001" and config["config"]["WorkingDir"] == "/app"
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the shared run volume; the image's user is 10001
    template = yaml.safe_load(build_workflow_template().to_yaml())
    params = {p["name"]: str(p["value"]) for p in template["spec"]["arguments"]["parameters"]}
    params.update(preset="tiny", mlflow_uri="sqlite:////data/mlflow.db")
    (start,) = [t for t in template["spec"]["templates"] if t["name"] == stages.START]
    argv = [
        re.sub(r"\{\{workflow\.parameters\.(\w+)\}\}", lambda m: params[m.group(1)], a)
        for a in start["container"]["command"] + start["container"]["args"]
    ]
    argv = [a.replace("/tmp/outputs", "/data/outputs") for a in argv]
    assert argv[:3] == ["python", "-m", "pipelines.steps"]
    proc = run_in(tmp_path / "root", argv, config, binds={"/data": data})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = (data / "outputs" / "parent_run_id").read_text()
    config_json = (data / "outputs" / "config_json").read_text()

    close = run_in(
        tmp_path / "root",
        [
            "python",
            "-m",
            "pipelines.steps",
            stages.CLOSE,
            "--run-dir",
            "/data/run",
            "--status",
            "Succeeded",
            "--config-json",
            config_json,
            "--parent-run-id",
            run_id,
        ],
        config,
        binds={"/data": data},
    )
    assert close.returncode == 0, close.stdout[-3000:] + close.stderr[-3000:]
    run = mlflow.MlflowClient(f"sqlite:///{data / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["orchard.runner"] == "argo"

    torch = run_in(tmp_path / "root", ["python", "-c", "import torch; print(torch.__version__)"], config)
    assert torch.returncode == 0 and torch.stdout.strip() == "2.13.0+cpu", torch.stdout + torch.stderr


def test_agent_injector_fills_a_volume_whose_python_runs_in_an_otherwise_empty_root(archives, tmp_path):
    config = unpack(archives / "agent-injector.oci.tar", tmp_path / "injector")
    volume = tmp_path / "volume"
    volume.mkdir()
    volume.chmod(0o777)
    # The init container: the image's own CMD, as its user, into the emptyDir.
    init = run_in(tmp_path / "injector", config["config"]["Cmd"], config, binds={"/orchard": volume})
    assert init.returncode == 0, init.stdout + init.stderr
    assert (volume / "python" / "bin" / "python3").exists() and (volume / "agent" / "sandbox_service").is_dir()

    # A task image with no Python, no libc and no shell: only the volume at the pods' agent_mount_path.
    task = tmp_path / "task"
    task.mkdir()
    code = (
        "import sys; sys.path.insert(0, '/orchard/agent'); import ssl, sandbox_service.agent.server, "
        "sandbox_service.agent.__main__; print(sys.version_info[:2], ssl.OPENSSL_VERSION)"
    )
    proc = run_in(task, ["/orchard/python/bin/python3", "-I", "-S", "-c", code], binds={"/orchard": volume})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OpenSSL" in proc.stdout
    assert sorted(p.name for p in task.iterdir()) == ["dev", "orchard", "proc", "tmp"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_image_serves_and_the_service_image_starts(archives, tmp_path):
    config = unpack(archives / "mlflow.oci.tar", tmp_path / "mlflow")
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    port = _free_port()
    server = run_in(
        tmp_path / "mlflow",
        [
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            "sqlite:////mlflow/db.sqlite",
            "--workers",
            "1",
        ],
        config,
        binds={"/mlflow": store},
        background=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.read().strip() == b"OK"
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not answer in 300 s"
                time.sleep(2)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)

    config = unpack(archives / "sandbox-service.oci.tar", tmp_path / "service")
    assert config["config"]["Cmd"] == ["orchard-sandbox", "serve"]
    proc = run_in(tmp_path / "service", ["orchard-sandbox", "serve", "--help"], config)
    assert proc.returncode == 0 and "--port" in proc.stdout, proc.stdout + proc.stderr
    proc = run_in(
        tmp_path / "service",
        ["python", "-c", "import sandbox_service.server.app, sandbox_service.backends.kubernetes.backend, torch"],
        config,
    )
    assert "No module named 'torch'" in proc.stderr, "the service image carries no training stack"
