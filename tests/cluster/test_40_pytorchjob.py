"""Phase 4: SFT and RL as Kubeflow PyTorchJobs across two pods, on the cluster's Training Operator.

The compiled Argo pipeline (preset tiny with `sft.launch.workers=1` and `rl.launch.workers=1`: a Master and
one Worker, one process each, gloo on CPU) runs once and is watched while it runs:

- SFT: once rank 0 has logged an optimizer step, the first job's Worker process is killed. The operator fails
  the job with its reason, the Argo step fails, and the stage's retry policy starts a new job, which
  succeeds. That job's loss curve (MLflow, where rank 0 alone logs) and final weights match one process
  training on the same data and seed with twice the gradient accumulation (the same samples in every
  optimizer step), within the tolerances below.
- RL: TRL's GRPO with both ranks rolling out episodes in sandboxes through the sandbox service's in-cluster
  Service; every rank's episodes are in the stage's output and counted in its result.

Without the operator no job runs (its webhook refuses the job, or nothing picks it up: the watch fails);
without the rendezvous each pod is a world of one and the stage refuses to train (`check_world_size`).
Argo deletes the run volume when the workflow ends, so the stages' files are copied off it (this node's
disk, through the PersistentVolume's path) as soon as each stage succeeds.
"""

from __future__ import annotations

import calendar
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from components.core.tracking import curve
from pipelines.argo.workflow import WORKFLOW_LABEL
from pipelines.cli import compile_all
from tests.cluster.conftest import (
    check_succeeded,
    child_runs,
    kubectl,
    kubectl_json,
    mlflow_client,
    node_seconds,
    parent_run,
    parent_run_id,
    stage_of,
    submit,
    workflow_finished,
)

SFT_LOSS = curve(1, "loss")  # the SFT run's loss curve (the first chart of its run page)

pytestmark = pytest.mark.cluster
EXPERIMENT = "orchard-cluster-pytorchjob"
SFT_STEPS = 24  # long enough that a step logged by rank 0 leaves the job running when the Worker is killed
SETS = ["sft.launch.workers=1", "rl.launch.workers=1", f"sft.steps={SFT_STEPS}", "rl.save_rollouts=true"]
# Two processes vs one with twice the accumulation: the same samples in every step, the gradients summed in
# another order. Step 1 (same weights, same samples) agrees to float precision; Adam then amplifies the
# rounding (a near-zero gradient's sign decides a whole lr-sized move). Measured with torchrun on one host on
# this preset's data (24 steps): loss max rel 5.6e-3, final weights mean |diff| 3.7e-4; ranks that do not
# sync (one process, half the batch) give 8.4e-2 (step 1 already) and 2.2e-3. The bounds sit between.
FIRST_LOSS_REL, LOSS_REL, WEIGHT_MEAN_ABS = 1e-5, 1.5e-2, 1e-3
PICKUP_SECONDS = 180  # a job the operator has not touched by then: no operator is running
JOB_NAME, REPLICA_TYPE = "training.kubeflow.org/job-name", "training.kubeflow.org/replica-type"


@dataclass
class Watched:
    name: str
    copy: Path  # the run directory's files, copied off the run volume
    killed: str | None = None  # the SFT job whose Worker was killed
    jobs: dict[str, dict] = field(default_factory=dict)  # every PyTorchJob of the run, as last seen
    workflow: dict = field(default_factory=dict)


def run_volume(workflow: str) -> Path:
    """Where the workflow's run volume (a local-path PersistentVolume) lives on this node."""
    claim = kubectl_json("-n", "orchard", "get", "pvc", f"{workflow}-run-data")
    pv = kubectl_json("get", "pv", claim["spec"]["volumeName"])["spec"]
    return Path((pv.get("local") or pv.get("hostPath"))["path"])


def succeeded(workflow: dict, stage: str) -> bool:
    return any(
        n["displayName"] == stage and n.get("phase") == "Succeeded"
        for n in workflow.get("status", {}).get("nodes", {}).values()
    )


def sft_steps_logged(client, workflow: dict) -> int:
    """Optimizer steps the running SFT attempt's rank 0 has logged to MLflow (0 before it starts)."""
    parent = parent_run_id(workflow)
    if parent is None:
        return 0
    runs = client.search_runs(
        [client.get_run(parent).info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{parent}' and attributes.status = 'RUNNING'",
    )
    return max(
        (len(client.get_metric_history(r.info.run_id, SFT_LOSS)) for r in runs if stage_of(r) == "sft"), default=0
    )


def kill_worker(job: str) -> str | None:
    """SIGKILL the training process of the job's Worker (not torchrun, the container's first process, which
    then exits failed like after any crash of its child). Returns the pod, None while it is not running."""
    pods = kubectl_json("-n", "orchard", "get", "pods", "-l", f"{JOB_NAME}={job},{REPLICA_TYPE}=worker")["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    if not running:
        return None
    code = (
        "import os, signal\n"
        "me = os.getpid()\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if int(p) not in (1, me) and b'pipelines.steps' in open(f'/proc/{p}/cmdline', 'rb').read():\n"
        "        os.kill(int(p), signal.SIGKILL); print('killed', p)\n"
    )
    out = kubectl("-n", "orchard", "exec", running[0], "-c", "pytorch", "--", "python", "-c", code)
    assert "killed" in out, f"no training process found in {running[0]}: {out}"
    return running[0]


def check_picked_up(jobs: list[dict]) -> None:
    for job in jobs:
        created = calendar.timegm(time.strptime(job["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        if not (job.get("status") or {}).get("conditions") and time.time() - created > PICKUP_SECONDS:
            raise AssertionError(
                f"PyTorchJob {job['metadata']['name']} has no status {PICKUP_SECONDS} s after it was "
                "created: is the Training Operator running? (kubectl -n kubeflow get deploy)"
            )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Watched:
    compiled = compile_all(tmp_path_factory.mktemp("pipelines"), preset="tiny", sets=SETS)
    spec = yaml.safe_load(compiled["argo_template"].read_text())["spec"]
    for p in spec["arguments"]["parameters"]:
        if p["name"] == "experiment":
            p["value"] = EXPERIMENT
    watched = Watched(name=submit(spec, "orchard-pytorchjob-"), copy=tmp_path_factory.mktemp("run"))
    client, started, copied = mlflow_client(), time.monotonic(), set()
    while True:
        watched.workflow = kubectl_json("-n", "orchard", "get", "workflow", watched.name)
        jobs = kubectl_json("-n", "orchard", "get", "pytorchjobs", "-l", f"{WORKFLOW_LABEL}={watched.name}")["items"]
        watched.jobs.update({j["metadata"]["name"]: j for j in jobs})
        check_picked_up(jobs)
        sft_jobs = [j for j in jobs if j["metadata"]["labels"].get("orchard.dev/stage") == "sft"]
        if watched.killed is None and len(sft_jobs) == 1 and sft_steps_logged(client, watched.workflow) >= 1:
            job = sft_jobs[0]["metadata"]["name"]
            if pod := kill_worker(job):
                watched.killed = job
                print(f"\n[check] killed the training process of {pod} (job {job}) after rank 0 logged a step")
        for stage in ("sft", "rl"):
            if stage not in copied and succeeded(watched.workflow, stage):
                root = run_volume(watched.name) / watched.name
                for part in ("config.json", "results", "accumulate", "init-policy", stage):
                    src, dst = root / part, watched.copy / part
                    shutil.copytree(src, dst, dirs_exist_ok=True) if src.is_dir() else shutil.copy2(src, dst)
                copied.add(stage)
        if workflow_finished(watched.name):
            break
        assert time.monotonic() - started < 3600, f"workflow {watched.name} still running after an hour"
        time.sleep(2)
    watched.workflow = kubectl_json("-n", "orchard", "get", "workflow", watched.name)
    check_succeeded(watched.workflow, started)
    assert copied == {"sft", "rl"}, copied
    return watched


def stage_jobs(watched: Watched, stage: str) -> list[dict]:
    jobs = [j for j in watched.jobs.values() if j["metadata"]["labels"].get("orchard.dev/stage") == stage]
    return sorted(jobs, key=lambda j: j["metadata"]["creationTimestamp"])


def condition(job: dict, kind: str) -> dict | None:
    return next(
        (c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind and c["status"] == "True"), None
    )


def attempts(watched: Watched, stage: str) -> list[dict]:
    """The Argo step's attempts (a retried step's children), in order."""
    nodes = watched.workflow["status"]["nodes"]
    (step,) = [n for n in nodes.values() if n["displayName"] == stage and n["type"] == "Retry"]
    return sorted((nodes[c] for c in step.get("children", [])), key=lambda n: n["startedAt"])


def test_a_killed_worker_fails_its_job_with_the_operators_reason_and_the_retry_runs_a_new_job(run):
    assert run.killed, "the first SFT job ended before rank 0 logged a step: its Worker was never killed"
    first, *rest = stage_jobs(run, "sft")
    assert first["metadata"]["name"] == run.killed
    failed = condition(first, "Failed")
    assert failed and failed["reason"] == "PyTorchJobFailed", first.get("status")
    assert "Worker replica(s) failed" in failed["message"], failed
    assert [condition(j, "Succeeded") is not None for j in rest] == [True], [j.get("status") for j in rest]
    tries = attempts(run, "sft")
    assert [t["phase"] for t in tries] == ["Failed", "Succeeded"], [(t["phase"], t.get("message")) for t in tries]
    assert "Worker.failed" in tries[0].get("message", ""), tries[0].get("message")
    print(f"\n[check] job {run.killed}: {failed['message']} -> new job {rest[0]['metadata']['name']} succeeded")


def test_sft_across_two_pods_trains_like_one_process_and_rank_0_alone_logs(run, tmp_path):
    from safetensors.torch import load_file

    from components.core.distributed import LaunchConfig
    from components.core.tracking import TrackingConfig
    from components.sft.stage import train_sft
    from pipelines.config import PipelineConfig
    from mlflow.tracking import MlflowClient

    client = mlflow_client()
    parent = parent_run(client, run.workflow, EXPERIMENT)
    sft_runs = [r for r in child_runs(client, parent) if stage_of(r) == "sft"]
    finished = [r for r in sft_runs if r.info.status == "FINISHED"]
    # one run per attempt (the killed one did not finish), and rank 1 opened none
    assert len(finished) == 1 and len(sft_runs) == 2, [(r.info.run_id, r.info.status) for r in sft_runs]
    assert finished[0].data.metrics["world_size"] == 2
    cluster_loss = [
        m.value for m in sorted(client.get_metric_history(finished[0].info.run_id, SFT_LOSS), key=lambda m: m.step)
    ]
    assert len(cluster_loss) == SFT_STEPS, f"{len(cluster_loss)} loss points for {SFT_STEPS} steps: one rank logs"

    config = PipelineConfig.model_validate_json((run.copy / "config.json").read_text())
    assert config.sft.launch.processes == 2
    cluster = json.loads((run.copy / "results" / "sft.json").read_text())
    # Equal steps need epochs that end on a whole global batch (else the ranks' samplers pad the last one).
    samples = int(cluster["metrics"]["samples"])
    assert samples % (2 * config.sft.batch_size) == 0, f"{samples} samples, global batch {2 * config.sft.batch_size}"
    one = config.sft.model_copy(update={"grad_accum": 2 * config.sft.grad_accum, "launch": LaunchConfig()})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train_sft(
        one,
        run.copy / "accumulate" / "training",
        tmp_path / "model",
        base_model_dir=run.copy / "init-policy" / "model",
        tracking=TrackingConfig(tracking_uri=uri, experiment="one-process"),
    )
    local = MlflowClient(uri)
    (ref,) = local.search_runs([local.get_experiment_by_name("one-process").experiment_id])
    one_loss = [m.value for m in sorted(local.get_metric_history(ref.info.run_id, SFT_LOSS), key=lambda m: m.step)]
    assert cluster_loss[0] == pytest.approx(one_loss[0], rel=FIRST_LOSS_REL)
    assert cluster_loss == pytest.approx(one_loss, rel=LOSS_REL)
    assert cluster_loss[-1] < cluster_loss[0]
    a, b = (
        load_file(run.copy / "sft" / "model" / "model.safetensors"),
        load_file(tmp_path / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys()
    drift = sum((a[k] - b[k]).abs().sum().item() for k in a) / sum(a[k].numel() for k in a)
    assert drift < WEIGHT_MEAN_ABS, f"final weights differ from one process's by {drift} on average"
    node = attempts(run, "sft")[-1]
    print(
        f"\n[figure] sft, {SFT_STEPS} steps: 2 pods (PyTorchJob) step {node_seconds(node):.0f} s, training "
        f"{cluster['train_seconds']:.1f} s; one process here {result.train_seconds:.1f} s; loss "
        f"{cluster_loss[0]:.4f} -> {cluster_loss[-1]:.4f} (max rel diff "
        f"{max(abs(x - y) / abs(y) for x, y in zip(cluster_loss, one_loss)):.1e}), weights mean |diff| {drift:.1e}"
    )


def test_rl_across_two_pods_rolls_out_on_every_rank_and_the_result_holds_both(run):
    from components.core.data.schema import Outcome
    from components.core.data.parquet_store import TrajectoryStore

    result = json.loads((run.copy / "results" / "rl.json").read_text())
    episodes = TrajectoryStore(run.copy / "rl" / "model" / "rollouts").read()
    by_rank: dict[int, list] = {}
    for t in episodes:
        by_rank.setdefault(t.metadata.get("rank"), []).append(t)
    assert set(by_rank) == {0, 1}, {r: len(ts) for r, ts in by_rank.items()}
    # each rank reached the sandbox service (through its Service: the pipeline's sandbox_url) and got a verdict
    for rank, ts in by_rank.items():
        assert any(t.outcome is not Outcome.infra_error for t in ts), (rank, [t.outcome_reason for t in ts])
    assert result["trajectories"] == len(episodes), (result["trajectories"], len(episodes))
    records = [
        json.loads(line) for line in (run.copy / "rl" / "model" / "rollout_records.jsonl").read_text().splitlines()
    ]
    # the sampler records gathered from every rank count every stored episode, and name only stored ones
    assert sum(r["generated"] for r in records) == len(episodes), "the result's rollout records miss a rank's"
    assert {i for r in records for i in r["group_attempt_ids"] if i} <= {t.id for t in episodes}
    assert [condition(j, "Succeeded") is not None for j in stage_jobs(run, "rl")] == [True]
    client = mlflow_client()
    rl_runs = [r for r in child_runs(client, parent_run(client, run.workflow, EXPERIMENT)) if stage_of(r) == "rl"]
    assert [r.info.status for r in rl_runs] == ["FINISHED"], "rank 0 alone opens the stage's MLflow run"
    node = attempts(run, "rl")[-1]
    print(
        f"\n[figure] rl: 2 pods (PyTorchJob) step {node_seconds(node):.0f} s, training "
        f"{result['metrics']['train_seconds']:.1f} s, {len(episodes)} episodes "
        f"({', '.join(f'rank {r}: {len(ts)}' for r, ts in sorted(by_rank.items()))})"
    )
