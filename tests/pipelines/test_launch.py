"""Multi-process stages: compiled as a PyTorchJob (KFP launcher step, Argo resource template) from the
stage table, and the launcher's create -> wait -> fail path against a real HTTP server on loopback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml

from components.core.distributed import LaunchConfig
from pipelines import stages
from pipelines.argo.schema import validate_argo
from pipelines.argo.workflow import build_workflow_template
from pipelines.cluster import ClusterConfig
from pipelines.config import resolve
from pipelines.jobs.launcher import JobFailed, PyTorchJobs, kfp_job_entry
from pipelines.jobs.pytorchjob import job_command, pytorchjob_manifest, secret_env, validate_pytorchjob
from tests.pipelines.pytorchjob_api import SUCCEEDS, PyTorchJobAPI, condition, fails

MULTI = ["sft.launch.nproc_per_node=2", "sft.launch.workers=1", "rl.launch.nproc_per_node=2", "resources.gpu=true"]


@pytest.fixture(scope="module")
def multi():
    return resolve("demo", MULTI)


@pytest.fixture(scope="module")
def kfp_docs(tmp_path_factory, multi):
    from kfp import compiler

    from pipelines.kfp.pipeline import build_pipeline

    path = tmp_path_factory.mktemp("kfp") / "p.yaml"
    compiler.Compiler().compile(build_pipeline(defaults=multi), package_path=str(path))
    return list(yaml.safe_load_all(path.read_text())), path


@pytest.fixture(scope="module")
def argo(multi):
    return yaml.safe_load(build_workflow_template(defaults=multi).to_yaml())


def _render(text: str, values: dict[str, str]) -> str:
    """Argo's parameter substitution: every {{name}} replaced by its value (a missing one fails)."""
    return re.sub(r"\{\{([^}]+)\}\}", lambda m: values[m.group(1)], text)


# --- Which stages are jobs ----------------------------------------------------------------------
def test_only_rows_marked_distributed_with_more_than_one_process_are_jobs(multi):
    assert {s.name for s in stages.STAGES if s.launch(multi)} == {"sft", "rl"}
    assert not any(s.launch(resolve("demo")) for s in stages.STAGES), "one process: a single pod as before"
    assert stages.BY_NAME["sft"].launch(multi).processes == 4
    assert stages.BY_NAME["rl"].launch(multi).processes == 2


def test_a_config_asking_for_the_removed_builtin_rl_engine_is_refused():
    from pipelines.config import ConfigError

    with pytest.raises(ConfigError, match="builtin RL engine .* was removed: TRL's GRPOTrainer is the only"):
        resolve("demo", ["rl.engine=builtin"])


def test_the_compiled_config_is_the_runs_default(multi):
    from pipelines.parameters import pipeline_parameters

    params = {p.name: p.default for p in pipeline_parameters(multi, ClusterConfig())}
    overrides = json.loads(params["overrides_json"])
    assert overrides["sft.launch.nproc_per_node"] == 2 and overrides["rl.launch.nproc_per_node"] == 2
    assert resolve(params["preset"], overrides=overrides) == multi  # what the start step rebuilds
    assert (
        json.loads(
            dict((p.name, p.default) for p in pipeline_parameters(resolve("demo"), ClusterConfig()))["overrides_json"]
        )
        == {}
    )


# --- KFP: a launcher step -----------------------------------------------------------------------
def test_kfp_runs_a_multi_process_stage_through_a_launcher_step(kfp_docs):
    from google.protobuf import json_format
    from kfp import components
    from kfp.pipeline_spec import pipeline_spec_pb2

    (spec, platform), path = kfp_docs
    json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())  # the launcher YAML is a valid PipelineSpec
    assert components.load_component_from_file(str(path)).name == "orchard-training"
    tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    executors = spec["deploymentSpec"]["executors"]
    for name, nproc, workers in (("sft", 2, 1), ("rl", 2, 0)):
        params = tasks[name]["inputs"]["parameters"]
        assert params["nproc_per_node"]["runtimeValue"]["constant"] == nproc
        assert params["workers"]["runtimeValue"]["constant"] == workers
        assert params["job_image"]["componentInputParameter"] == "pipelinechannel--gpu_image"
        assert params["run_store"]["taskOutputParameter"]["producerTask"] == "run-store"
        container = executors[f"exec-{name}"]["container"]
        assert container["args"][-1] == f"{name}_job", "the launcher component runs"
        assert "accelerator" not in container.get("resources", {}), "the launcher waits on a CPU; the job has GPUs"
        k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][f"exec-{name}"]
        assert [m["mountPath"] for m in k8s["pvcMount"]] == ["/mnt/run-store"]
        assert tasks[name]["taskInfo"]["name"] == name
    assert {"sft", "rl"} <= set(tasks["deletepvc"]["dependentTasks"]), "the run store outlives the jobs"


def test_the_job_a_kfp_launcher_creates_validates(multi):
    stage = stages.BY_NAME["sft"]
    launch = stage.launch(multi)
    cluster = ClusterConfig()
    manifest = pytorchjob_manifest(
        stage,
        launch,
        gpu=True,
        requests=("4", "16Gi"),
        security_context=cluster.pod_security_context(),
        name="orchard-sft-1a2b3c4d",
        image=cluster.image("stage-runtime-gpu"),
        command=job_command("sft", launch, "/mnt/run-store/jobs/orchard-sft-1a2b3c4d", "abc123"),
        claim_name="orchard-training-run-store",
        mount_path="/mnt/run-store",
        secret_env=secret_env("orchard-api-token", "token", "orchard-endpoints", "api-key"),
        node_selector=cluster.gpu_node_selector,
        tolerations=cluster.tolerations_json(),
        deadline_seconds=3600,
    )
    validate_pytorchjob(manifest)
    assert manifest["spec"]["nprocPerNode"] == "2"
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2, "one GPU per process"
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate_pytorchjob(broken)


# --- Argo: a resource template ------------------------------------------------------------------
def test_argo_runs_a_multi_process_stage_as_a_pytorchjob_resource(argo):
    validate_argo(argo)
    templates = {t["name"]: t for t in argo["spec"]["templates"]}
    values = {f"workflow.parameters.{p['name']}": p["value"] for p in argo["spec"]["arguments"]["parameters"]}
    values |= {"workflow.name": "orchard-training-x7k2p", "inputs.parameters.parent_run_id": "abc123"}
    (claim,) = argo["spec"]["volumeClaimTemplates"]
    for name, nproc, workers in (("sft", 2, 1), ("rl", 2, 0)):
        template = templates[name]
        assert "container" not in template
        resource = template["resource"]
        assert resource["action"] == "create" and resource["setOwnerReference"] is True
        assert resource["successCondition"] == "status.replicaStatuses.Master.succeeded > 0"
        # any failed pod fails the step (Argo ORs failure requirements), a Worker's too
        assert resource["failureCondition"] == (
            "status.replicaStatuses.Master.failed > 0,status.replicaStatuses.Worker.failed > 0"
        )
        job = yaml.safe_load(_render(resource["manifest"], values))
        validate_pytorchjob(job)
        assert job["spec"]["nprocPerNode"] == str(nproc)
        # no backoffLimit: the operator then counts the failed pod in replicaStatuses, which the condition reads
        assert "backoffLimit" not in job["spec"]["runPolicy"]
        # the step outlives the job's own deadline (a job failed by its deadline counts no failed pod)
        assert template["activeDeadlineSeconds"] > job["spec"]["runPolicy"]["activeDeadlineSeconds"]
        assert job["metadata"]["labels"]["workflows.argoproj.io/workflow"] == "orchard-training-x7k2p"
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert replicas.get("Worker", {}).get("replicas", 0) == workers
        for replica in replicas.values():
            pod = replica["template"]["spec"]
            (container,) = pod["containers"]
            assert container["image"] == values["workflow.parameters.gpu_image"]
            run_dir = "/data/orchard-training-x7k2p"
            assert container["command"] == [
                "torchrun",
                f"--nproc-per-node={nproc}",
                "-m",
                "pipelines.steps",
                "run",
                name,
                "--run-dir",
                run_dir,
                "--config-file",
                f"{run_dir}/config.json",
                "--parent-run-id",
                "abc123",
            ]
            # the workflow's own volume (Argo names a claim template's PVC <workflow>-<claim>)
            volume = next(v for v in pod["volumes"] if v["name"] == "run-data")
            assert volume["persistentVolumeClaim"]["claimName"] == f"orchard-training-x7k2p-{claim['metadata']['name']}"
            assert pod["nodeSelector"] == json.loads(values["workflow.parameters.gpu_node_selector"])
    assert "container" in templates["distill"], "single-process stages stay pods"


def test_single_process_stages_stay_pods():
    templates = {t["name"]: t for t in yaml.safe_load(build_workflow_template().to_yaml())["spec"]["templates"]}
    assert "container" in templates["sft"] and "resource" not in templates["sft"]


def test_kfp_local_refuses_a_multi_process_stage(multi):
    from pipelines.kfp.pipeline import build_pipeline

    with pytest.raises(ValueError, match="needs a cluster"):
        build_pipeline(defaults=multi, for_cluster=False)


# --- The launcher against the API ---------------------------------------------------------------
def _manifest(name: str = "orchard-sft-test") -> dict:
    stage = stages.BY_NAME["sft"]
    launch = LaunchConfig(nproc_per_node=2, workers=1)
    return pytorchjob_manifest(
        stage,
        launch,
        gpu=True,
        requests=("4", "16Gi"),
        name=name,
        image="orchard/stage-runtime-gpu:0.1.0",
        command=job_command("sft", launch, "/mnt/run-store/jobs/x", "run1"),
        claim_name="store",
        mount_path="/mnt/run-store",
        secret_env=secret_env("tok", "token", "ep", "api-key"),
        node_selector={"orchard.dev/pool": "gpu"},
        tolerations=[],
    )


def test_launcher_creates_the_job_and_follows_it_to_success():
    lines: list[str] = []
    with PyTorchJobAPI(SUCCEEDS) as api:
        jobs = PyTorchJobs("orchard", api.api_client())
        name = jobs.create(_manifest())
        status = jobs.wait(name, timeout_s=30, poll_s=0.01, log=lines.append)
    assert status["conditions"][-1]["type"] == "Succeeded"
    assert ("POST", "/apis/kubeflow.org/v1/namespaces/orchard/pytorchjobs") in api.requests
    assert [line.split(": ")[1].split()[0] for line in lines if "=True" in line] == [
        "Created=True",
        "Running=True",
        "Succeeded=True",
    ], lines
    assert any("replicas" in line and '"active": 1' in line for line in lines), "replica counts are streamed"


def test_launcher_fails_with_the_jobs_reason():
    with PyTorchJobAPI(fails("OOMKilled", "Master pod orchard-sft-test-master-0 was OOMKilled")) as api:
        jobs = PyTorchJobs("orchard", api.api_client())
        name = jobs.create(_manifest())
        with pytest.raises(JobFailed, match=r"failed \(OOMKilled\): Master pod .* was OOMKilled") as err:
            jobs.wait(name, timeout_s=30, poll_s=0.01, log=lambda _: None)
    assert isinstance(err.value, stages.StageFailed)  # the step fails like any failed stage


def test_launcher_deletes_a_job_past_its_deadline():
    running = [{"conditions": [condition("Created", t=1), condition("Running", t=2)]}]
    with PyTorchJobAPI(running) as api:
        jobs = PyTorchJobs("orchard", api.api_client())
        name = jobs.create(_manifest())
        with pytest.raises(JobFailed, match="did not finish within"):
            jobs.wait(name, timeout_s=0.05, poll_s=0.01, log=lambda _: None)
    assert api.deleted == [name]


def test_the_api_refuses_an_invalid_job():
    from kubernetes.client.exceptions import ApiException

    broken = _manifest()
    broken["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    with PyTorchJobAPI() as api, pytest.raises(ApiException) as err:
        PyTorchJobs("orchard", api.api_client()).create(broken)
    assert err.value.status == 422


class _Artifact(SimpleNamespace):
    path: str


class _Metrics:
    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log_metric(self, key: str, value: float) -> None:
        self.logged[key] = value


def _entry_args(tmp_path: Path) -> dict:
    (tmp_path / "credited").mkdir()
    (tmp_path / "credited" / "part-0.parquet").write_text("rows")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    return dict(
        inputs={
            "credited": _Artifact(path=str(tmp_path / "credited")),
            "base_model": _Artifact(path=str(tmp_path / "base")),
        },
        outputs={"model": _Artifact(path=str(tmp_path / "out" / "model"))},
        launch=LaunchConfig(nproc_per_node=2, workers=1),
        image="orchard/stage-runtime-gpu:0.1.0",
        run_store="orchard-run-store",
        mount_path=str(tmp_path / "store"),
        timeout_seconds=60,
        placement={
            "sandbox_token_secret": "tok",
            "sandbox_token_key": "token",
            "endpoint_secret": "ep",
            "endpoint_key": "api-key",
            "gpu_node_selector": {},
            "gpu_tolerations": [],
        },
        poll_seconds=0.01,
    )


def test_kfp_launcher_stages_inputs_runs_the_job_and_hands_its_outputs_on(tmp_path, multi):
    seen: dict = {}

    def pods(job: dict) -> None:  # rank 0 of the job: reads the staged run dir, writes the outputs
        command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
        run_dir = Path(command[command.index("--run-dir") + 1])
        seen["config"] = json.loads((run_dir / "config.json").read_text())
        seen["staged"] = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        (run_dir / "sft" / "model").mkdir(parents=True)
        (run_dir / "sft" / "model" / "model.safetensors").write_text("weights")
        (run_dir / "results").mkdir()
        (run_dir / "results" / "sft.json").write_text(json.dumps({"steps": 20, "metrics": {"final_loss": 1.5}}))

    metrics = _Metrics()
    with PyTorchJobAPI(SUCCEEDS, on_create=pods) as api:
        out = kfp_job_entry(
            "sft",
            multi.model_dump_json(),
            "run1",
            metrics=metrics,
            jobs=PyTorchJobs("orchard", api.api_client()),
            **_entry_args(tmp_path),
        )
    assert json.loads(out) == {"steps": 20, "metrics": {"final_loss": 1.5}}
    assert seen["config"]["sft"]["launch"] == {"nproc_per_node": 2, "workers": 1}
    assert seen["staged"] == ["accumulate/training/part-0.parquet", "config.json", "init-policy/model/config.json"]
    assert (tmp_path / "out" / "model" / "model.safetensors").read_text() == "weights"
    assert metrics.logged == {"final_loss": 1.5}
    assert not list((tmp_path / "store" / "jobs").iterdir()), "the job's run dir is removed once handed on"


def test_kfp_launcher_fails_the_step_when_the_job_fails(tmp_path, multi):
    with PyTorchJobAPI(fails("Error", "torchrun exited with 1")) as api:
        with pytest.raises(JobFailed, match="torchrun exited with 1"):
            kfp_job_entry(
                "sft",
                multi.model_dump_json(),
                "run1",
                metrics=_Metrics(),
                jobs=PyTorchJobs("orchard", api.api_client()),
                **_entry_args(tmp_path),
            )


def test_kfp_launcher_refuses_a_config_other_than_the_compiled_one(tmp_path):
    with PyTorchJobAPI() as api:
        with pytest.raises(stages.StageFailed, match="compiled as a PyTorchJob of 4 processes"):
            kfp_job_entry(
                "sft",
                resolve("demo").model_dump_json(),
                "run1",
                metrics=_Metrics(),
                jobs=PyTorchJobs("orchard", api.api_client()),
                **_entry_args(tmp_path),
            )
    assert not api.requests, "nothing was created"


@pytest.mark.parametrize("name", ["sft", "rl"])
def test_a_launcher_component_hands_its_parameters_to_the_entry(name, monkeypatch):
    """The component body (what KFP runs) splits its parameters into the row's artifacts, the launch and the
    placement."""
    from pipelines.jobs import launcher
    from pipelines.kfp.components import launcher_components
    from pipelines.cluster import STORE_MOUNT

    calls: list = []
    monkeypatch.setattr(launcher, "kfp_job_entry", lambda *a, **kw: calls.append((a, kw)) or "result")
    stage = stages.BY_NAME[name]
    artifacts = {arg: _Artifact(path=f"/in/{arg}") for arg in stage.inputs} | {"model": _Artifact(path="/out/model")}
    metrics = _Metrics()
    assert (
        launcher_components()[name].python_func(
            config_json="{}",
            parent_run_id="run1",
            metrics=metrics,
            run_store="pvc-1",
            job_image="img:1",
            nproc_per_node=2,
            workers=1,
            timeout_seconds=60,
            sandbox_token_secret="tok",
            endpoint_secret="ep",
            secret_keys={"sandbox_token_key": "token", "endpoint_key": "api-key"},
            gpu_node_selector={"gpu": "y"},
            gpu_tolerations=[{"key": "gpu"}],
            pod_security_context={"fsGroup": 10001},
            **artifacts,
        )
        == "result"
    )
    ((args, kwargs),) = calls
    assert args == (
        name,
        "{}",
        "run1",
        {arg: artifacts[arg] for arg in stage.inputs},
        {"model": artifacts["model"]},
        metrics,
    )
    assert kwargs == dict(
        launch=LaunchConfig(nproc_per_node=2, workers=1),
        image="img:1",
        run_store="pvc-1",
        mount_path=STORE_MOUNT,
        timeout_seconds=60,
        placement={
            "sandbox_token_secret": "tok",
            "sandbox_token_key": "token",
            "endpoint_secret": "ep",
            "endpoint_key": "api-key",
            "gpu_node_selector": {"gpu": "y"},
            "gpu_tolerations": [{"key": "gpu"}],
            "security_context": {"fsGroup": 10001},
        },
    )


def test_a_launcher_refuses_artifacts_its_row_does_not_have():
    from pipelines.jobs.launcher import kfp_job_step

    with pytest.raises(TypeError, match="make the component's signature match its row"):
        kfp_job_step(
            "sft",
            config_json="{}",
            parent_run_id="",
            metrics=None,
            run_store="",
            job_image="",
            nproc_per_node=2,
            workers=0,
            timeout_seconds=1,
            sandbox_token_secret="",
            endpoint_secret="",
            secret_keys={},
            gpu_node_selector={},
            gpu_tolerations=[],
            tasks=None,
            model=None,
        )


def test_a_stage_refuses_to_run_in_another_number_of_processes(multi, monkeypatch):
    from pipelines.steps import StepContext, run_stage

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(stages.StageFailed, match=r"asks for 4 process\(es\) \(sft.launch\) but it runs in 1"):
        run_stage("sft", StepContext(multi, None), {}, {})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(stages.StageFailed, match="asks for 1 process"):
        run_stage("sft", StepContext(resolve("demo"), None), {}, {})


# --- The whole path: launcher -> job -> the job's own command, run here -------------------------
from tests.components.conftest import rl_inputs  # noqa: E402,F401 (the RL fixture: tasks + a tiny policy)


@pytest.mark.slow
@pytest.mark.timeout(900)  # 2 torchrun processes + sandboxes; ~1 min idle, more on a loaded machine
def test_a_launched_rl_job_runs_its_command_in_two_processes(rl_inputs, sandbox_service, tmp_path):  # noqa: F811
    """The fake operator runs the Master's command itself (torchrun, 2 gloo processes, this machine):
    the staged run dir, `--config-file`, rank-0-only result and the outputs copied back are all real."""
    import os
    import socket
    import subprocess
    import sys

    config = resolve(
        "tiny",
        [
            "rl.launch.nproc_per_node=2",
            "rl.steps=1",
            "rl.rollout_budget=null",
            "rl.rollout.max_rollouts_per_prompt=8",
            "rl.rollout.rho_min=0.5",
            "rl.rollout.rho_max=0.5",
            "rl.harness.max_steps=1",
            "rl.harness.generation.max_new_tokens=12",
            "rl.num_threads=1",
            f"sandbox_url={sandbox_service.url}",
        ],
    )
    procs: dict[str, subprocess.Popen] = {}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def pods(job: dict) -> None:
        command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # torchrun of this venv
            "ORCHARD_SANDBOX_TOKEN": sandbox_service.connection().token or "",
            # what the operator exports for torchrun on a one-node job
            "PET_NNODES": "1",
            "PET_NODE_RANK": "0",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        log = open(tmp_path / "job.log", "w")
        procs[job["metadata"]["name"]] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def status_of(job: dict) -> dict:
        proc = procs[job["metadata"]["name"]]
        if proc.poll() is None:
            return {"conditions": [condition("Created", t=1), condition("Running", t=2)]}
        if proc.returncode == 0:
            return SUCCEEDS[-1]
        return fails("Error", f"torchrun exited with {proc.returncode}")[-1]

    metrics = _Metrics()
    args = _entry_args(tmp_path) | {
        "inputs": {
            "tasks": _Artifact(path=str(rl_inputs / "tasks")),
            "sft_model": _Artifact(path=str(rl_inputs / "sft")),
        },
        "launch": LaunchConfig(nproc_per_node=2),
        "timeout_seconds": 600,
        "poll_seconds": 1.0,
    }
    with PyTorchJobAPI(status_of=status_of, on_create=pods) as api:
        try:
            out = kfp_job_entry(
                "rl",
                config.model_dump_json(),
                "",
                metrics=metrics,
                jobs=PyTorchJobs("orchard", api.api_client()),
                **args,
            )
        except JobFailed:
            raise AssertionError((tmp_path / "job.log").read_text()[-4000:]) from None
        finally:
            for proc in procs.values():
                proc.kill() if proc.poll() is None else None
    result = json.loads(out)
    assert result["steps_done"] + result["steps_without_update"] == 1
    assert sorted(p.name for p in (tmp_path / "out" / "model").glob("*.safetensors")) == ["model.safetensors"]
    records = [
        json.loads(line) for line in (tmp_path / "out" / "model" / "rollout_records.jsonl").read_text().splitlines()
    ]
    assert len(records) == 2, "one prompt per rank, both ranks' records in the one output"
    assert result["steps_done"] == int(any(r["kept"] for r in records))  # the step trained if either rank kept a group
    assert result["trajectories"] > 0 and metrics.logged["steps_done"] == result["steps_done"]
