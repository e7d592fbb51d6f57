"""The KFP launcher step: run one training stage as a PyTorchJob, wait for it, hand its outputs on.

KFP has no resource template like Argo's, so a small step does it through the Kubernetes API (the
`kubernetes` client's CustomObjectsApi, which the sandbox service's Kubernetes backend uses too):

1. stage its input artifacts into a run directory on the run's PVC (the job's pods mount it; use
   `access_mode=ReadWriteMany` when `workers` > 0 so pods on other nodes can), with the run's config;
2. create the PyTorchJob (`pipelines/jobs/pytorchjob.py`) in its own namespace;
3. poll it, printing each new condition and replica count to the step's log, until it succeeds,
   fails (the step fails with the operator's reason and message) or passes its deadline (deleted);
4. copy rank 0's outputs to the output artifacts and return the stage's result, as `kfp_entry` does.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from components.core.distributed import LaunchConfig
from pipelines import stages
from pipelines.cluster import SA_NAMESPACE, STORE_MOUNT
from pipelines.layout import RunLayout
from pipelines.jobs.pytorchjob import API_VERSION, job_command, pytorchjob_manifest, secret_env

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "pytorchjobs"


class JobFailed(stages.StageFailed):
    """The PyTorchJob failed, or did not finish in time; the message carries the operator's reason."""


class PyTorchJobs:
    """Create, read, wait for and delete PyTorchJobs in one namespace."""

    def __init__(
        self, namespace: str, api_client: Any = None, *, request_timeout_s: float = 30.0, max_api_errors: int = 5
    ):
        from kubernetes import client

        self.namespace = namespace
        self.api = client.CustomObjectsApi(api_client)
        self.request_timeout_s = request_timeout_s
        self.max_api_errors = max_api_errors  # consecutive failed reads before giving up

    @classmethod
    def in_cluster(cls) -> PyTorchJobs:
        """The pod's own namespace and ServiceAccount (it needs create/get/delete on pytorchjobs)."""
        from kubernetes import config

        config.load_incluster_config()
        return cls(SA_NAMESPACE.read_text().strip())

    def create(self, manifest: dict) -> str:
        created = self.api.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, manifest, _request_timeout=self.request_timeout_s
        )
        return created["metadata"]["name"]

    def get(self, name: str) -> dict:
        return self.api.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=self.request_timeout_s
        )

    def delete(self, name: str) -> None:
        self.api.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=self.request_timeout_s
        )

    def wait(self, name: str, *, timeout_s: float, poll_s: float = 5.0, log: Callable[[str], None] = print) -> dict:
        """Poll until the job succeeds (returns its status) or fails (raises JobFailed with the reason)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        deadline = time.monotonic() + timeout_s
        seen: set[tuple] = set()
        replicas: dict | None = None
        errors = 0
        while True:
            try:
                status = self.get(name).get("status") or {}
                errors = 0
            except (ApiException, HTTPError) as err:
                if isinstance(err, ApiException) and err.status in (401, 403, 404):
                    raise JobFailed(
                        f"PyTorchJob {self.namespace}/{name}: the API answered {err.status} "
                        f"{err.reason} ({(err.body or '')[:300]})"
                    ) from err
                errors += 1  # a flaky API server is not a failed job: retry a few polls
                if errors >= self.max_api_errors:
                    raise JobFailed(
                        f"PyTorchJob {self.namespace}/{name}: {errors} reads in a row failed (last: {err})"
                    ) from err
                log(f"pytorchjob {name}: reading its status failed ({err}); retrying")
                status = {}
            for cond in status.get("conditions") or []:
                key = (cond.get("type"), cond.get("status"), cond.get("reason"), cond.get("lastTransitionTime"))
                if key not in seen:
                    seen.add(key)
                    log(
                        f"pytorchjob {name}: {cond.get('type')}={cond.get('status')} "
                        f"{cond.get('reason', '')}: {cond.get('message', '')}".rstrip(": ")
                    )
            if status.get("replicaStatuses") and status["replicaStatuses"] != replicas:
                replicas = status["replicaStatuses"]
                log(f"pytorchjob {name}: replicas {json.dumps(replicas, sort_keys=True)}")
            final = _finished(status)
            if final is not None:
                if final["type"] == "Succeeded":
                    return status
                raise JobFailed(
                    f"PyTorchJob {self.namespace}/{name} failed ({final.get('reason', 'no reason')}): "
                    f"{final.get('message', 'no message')}; see its pods' logs "
                    f"(kubectl -n {self.namespace} logs -l training.kubeflow.org/job-name={name})"
                )
            if time.monotonic() >= deadline:
                self.delete(name)
                raise JobFailed(
                    f"PyTorchJob {self.namespace}/{name} did not finish within {timeout_s:.0f} s; "
                    "deleted it (raise the stage's timeout or give it more processes)"
                )
            time.sleep(poll_s)


def _finished(status: dict) -> dict | None:
    """The Succeeded or Failed condition when it is true (the operator appends conditions in order)."""
    for cond in reversed(status.get("conditions") or []):
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return cond
    return None


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def kfp_job_entry(
    name: str,
    config_json: str,
    parent_run_id: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    metrics: Any,
    *,
    launch: LaunchConfig,
    image: str,
    run_store: str,
    mount_path: str,
    timeout_seconds: int,
    placement: dict,
    jobs: PyTorchJobs | None = None,
    poll_seconds: float = 10.0,
) -> str:
    """The body of a stage's launcher component (steps 1-4 of the module docstring).

    `placement`: sandbox_token_secret/key, endpoint_secret/key, gpu_node_selector, gpu_tolerations,
    security_context (the job pods' securityContext, optional)."""
    from pipelines.steps import StepContext, log_record_metrics

    stage = stages.BY_NAME[name]
    ctx = StepContext.from_json(config_json, parent_run_id)
    wanted = getattr(ctx.config, stage.config).launch
    if wanted.processes != launch.processes:
        raise stages.StageFailed(
            f"stage {name} was compiled as a PyTorchJob of {launch.processes} processes but this run's config asks "
            f"for {wanted.processes} ({stage.config}.launch); keep {stage.config}.launch in overrides_json or "
            "recompile the pipeline with the new setting"
        )
    job = f"orchard-{name}-{uuid.uuid4().hex[:8]}"
    layout = RunLayout(Path(mount_path) / "jobs" / job)
    for arg, ref in stage.inputs.items():
        _copy(Path(inputs[arg].path), layout.artifact(*ref.split(".", 1)))
    layout.config.write_text(config_json)
    manifest = pytorchjob_manifest(
        stage,
        launch,
        gpu=stage.wants_gpu(ctx.config),
        requests=stage.requests(ctx.config),
        security_context=placement.get("security_context"),
        name=job,
        image=image,
        command=job_command(name, launch, str(layout.root), parent_run_id),
        claim_name=run_store,
        mount_path=mount_path,
        deadline_seconds=timeout_seconds,
        secret_env=secret_env(
            placement["sandbox_token_secret"],
            placement["sandbox_token_key"],
            placement["endpoint_secret"],
            placement["endpoint_key"],
        ),
        node_selector=placement["gpu_node_selector"],
        tolerations=placement["gpu_tolerations"],
    )
    jobs = jobs or PyTorchJobs.in_cluster()
    print(f"creating PyTorchJob {jobs.namespace}/{job}: {launch.nodes} node(s) x {launch.nproc_per_node} process(es)")
    jobs.create(manifest)
    jobs.wait(job, timeout_s=timeout_seconds, poll_s=poll_seconds)
    record = layout.read_result(name)
    if record is None:
        raise stages.StageFailed(f"PyTorchJob {job} succeeded but wrote no result at {layout.result_path(name)}")
    for out, artifact in outputs.items():
        _copy(layout.artifact(name, out), Path(artifact.path))
    shutil.rmtree(layout.root, ignore_errors=True)  # the artifacts now hold it; the PVC is the run's scratch
    log_record_metrics(record, metrics)
    return json.dumps(record)


def kfp_job_step(
    name: str,
    *,
    config_json: str,
    parent_run_id: str,
    metrics: Any,
    run_store: str,
    job_image: str,
    nproc_per_node: int,
    workers: int,
    timeout_seconds: int,
    sandbox_token_secret: str,
    endpoint_secret: str,
    secret_keys: dict,
    gpu_node_selector: dict,
    gpu_tolerations: list,
    pod_security_context: dict | None = None,
    **artifacts: Any,
) -> str:
    """The body of every launcher component (`kfp_components.launcher_components`): their parameters as KFP
    passes them, i.e. the stage's own input and output artifacts (by the row's names) plus the job's
    launch and placement, assembled into a `kfp_job_entry` call."""
    stage = stages.BY_NAME[name]
    if set(artifacts) != set(stage.inputs) | set(stage.outputs):
        raise TypeError(
            f"launcher for stage {name}: got artifacts {sorted(artifacts)}, its row has inputs "
            f"{sorted(stage.inputs)} and outputs {sorted(stage.outputs)} (pipelines/stages.py); "
            "make the component's signature match its row"
        )
    return kfp_job_entry(
        name,
        config_json,
        parent_run_id,
        {arg: artifacts[arg] for arg in stage.inputs},
        {out: artifacts[out] for out in stage.outputs},
        metrics,
        launch=LaunchConfig(nproc_per_node=nproc_per_node, workers=workers),
        image=job_image,
        run_store=run_store,
        mount_path=STORE_MOUNT,
        timeout_seconds=timeout_seconds,
        placement={
            "sandbox_token_secret": sandbox_token_secret,
            "endpoint_secret": endpoint_secret,
            "gpu_node_selector": gpu_node_selector,
            "gpu_tolerations": gpu_tolerations,
            "security_context": pod_security_context,
            **secret_keys,
        },
    )
