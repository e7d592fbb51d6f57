"""The evaluation stage: metrics on hand-built attempts, then real episodes for each kind of policy."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from components.core.episode.harness import HarnessConfig
from components.core.policy.policies import OpenAIPolicyConfig
from components.core.policy.base import GenerationConfig
from components.core.data.schema import EnvironmentSpec, Outcome, Task, Trajectory, VerifierSpec
from components.core.data.parquet_store import TaskStore
from components.core.tracking import TrackingConfig
from components.core.statistics.intervals import paired_difference_ci, task_mean_ci, task_rate_ci
from components.evaluate import EvalConfig, evaluate, summarize_attempts

COIN = "python3 -c 'import os, sys; sys.exit(os.urandom(1)[0] % 2)'"
COIN_TASK = Task(
    id="coin",
    recipe="swe",
    split="heldout",
    prompt="Submit.",
    environment=EnvironmentSpec(files={"README.md": "a coin\n"}),
    verifier=VerifierSpec(kind="command", command=COIN),
)


def traj(task_id: str, outcome: Outcome, steps: int = 0, tokens: int = 0) -> Trajectory:
    from components.core.data.schema import Step

    return Trajectory(
        task_id=task_id,
        recipe="swe",
        policy_id="p",
        outcome=outcome,
        completion_tokens=tokens,
        steps=[Step(index=i, role="assistant", content="") for i in range(steps)],
    )


def test_infra_errors_leave_every_denominator():
    tasks = [Task(id=i, recipe="swe", split="heldout", prompt="") for i in ("a", "b", "c")]
    R, U, X = Outcome.resolved, Outcome.unresolved, Outcome.infra_error
    attempts = (
        [traj("a", R, 2, 10), traj("a", U, 4, 30), traj("a", X), traj("a", R, 2, 20), traj("a", U, 2, 20)]
        + [traj("b", U, 1, 5), traj("b", X)]
        + [traj("c", X)]
    )
    rows, m = summarize_attempts(tasks, attempts, k=2)
    assert (m["attempts"], m["valid_attempts"], m["infra_errors"]) == (8, 5, 3)
    assert m["resolved_rate"] == pytest.approx(2 / 5) and m["infra_error_rate"] == pytest.approx(3 / 8)
    assert m["mean_steps"] == pytest.approx(11 / 5) and m["mean_completion_tokens"] == pytest.approx(85 / 5)
    a, b, c = rows
    assert a["pass_at_1"] == pytest.approx(0.5) and a["pass_at_2"] == pytest.approx(1 - 1 / 6)
    assert b["valid_attempts"] == 1 and math.isnan(b["pass_at_2"])  # fewer than k valid attempts
    assert c["valid_attempts"] == 0 and math.isnan(c["pass_at_1"])
    assert m["pass_at_2"] == pytest.approx(1 - 1 / 6) and m["pass_at_k_tasks"] == 1
    assert m["pass_at_1"] == pytest.approx((0.5 + 0.0) / 2)


def test_mean_share_of_hidden_tests_passing_over_verified_attempts():
    from components.core.data.schema import TestReport

    def graded(task_id, outcome, passed, total):
        report = TestReport(hidden_passed=passed, hidden_total=total) if total is not None else None
        return traj(task_id, outcome).model_copy(update={"test_report": report})

    tasks = [Task(id=i, recipe="swe", split="heldout", prompt="") for i in ("a", "b")]
    R, U, X = Outcome.resolved, Outcome.unresolved, Outcome.infra_error
    attempts = [
        graded("a", R, 2, 2),
        graded("a", U, 1, 2),
        graded("b", U, 0, 4),
        graded("b", U, 1, 4),
        graded("b", X, 3, 4),  # an infrastructure error never counts, whatever its report says
        graded("b", U, 0, None),
    ]  # no hidden tests (a command verifier): not in the mean
    rows, m = summarize_attempts(tasks, attempts, k=1)
    assert m["hidden_pass_fraction_n"] == 4 and m["hidden_pass_fraction_mean"] == pytest.approx(
        (1 + 0.5 + 0 + 0.25) / 4
    )
    assert m["hidden_pass_fraction_unresolved_n"] == 3
    assert m["hidden_pass_fraction_unresolved_mean"] == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert [r["hidden_pass_fraction"] for r in rows] == [pytest.approx(0.75), pytest.approx(0.125)]


def test_resolved_rate_plot_draws_each_family_with_its_interval_and_n():
    from matplotlib.container import ErrorbarContainer

    from components.evaluate import plot_resolved_rates

    rows = [
        {"family": "a", "valid_attempts": 4, "resolved": 4},
        {"family": "a", "valid_attempts": 4, "resolved": 0},
        {"family": "b", "valid_attempts": 2, "resolved": 1},
        {"family": "c", "valid_attempts": 0, "resolved": 0},
    ]
    fig = plot_resolved_rates(rows, "p")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "all"]  # c: no valid attempt, no bar
    assert [round(b.get_height(), 6) for b in ax.patches] == [50.0, 50.0, 50.0]
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (lo_a, hi_a), (lo_b, hi_b), _ = [tuple(p[1] for p in seg) for seg in bars.lines[2][0].get_segments()]
    from components.core.statistics.intervals import task_rate_ci

    expected = [100 * x for x in task_rate_ci([(4, 4), (4, 0)]) + task_rate_ci([(2, 1)])]
    assert [lo_a, hi_a, lo_b, hi_b] == pytest.approx(expected)
    assert lo_a < 5 and hi_a > 95 and hi_b - lo_b > 90  # two tasks, or one task of two attempts, say little
    assert [t.get_text() for t in ax.texts] == ["n=8", "n=2", "n=10"]


def _wilson_width(successes: int, n: int, z: float = 1.96) -> float:
    p = successes / n
    return 2 * z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)


def test_intervals_cluster_attempts_by_task():
    # 20 tasks x 8 attempts, every task all-or-nothing: the information is 20 tasks, not 160 attempts.
    clustered = [(8, 8)] * 10 + [(8, 0)] * 10
    lo, hi = task_rate_ci(clustered)
    assert lo < 0.5 < hi
    # A bootstrap over attempts pooled across tasks would be about as narrow as Wilson on n=160 (~0.15).
    assert hi - lo > 2 * _wilson_width(80, 160)
    assert hi - lo == pytest.approx(_wilson_width(10, 20), rel=0.3)  # about what 20 independent draws give
    # The same 160 attempts spread evenly over tasks carry nearly the attempt-level information.
    spread = [(8, 4)] * 20
    lo_s, hi_s = task_rate_ci(spread)
    assert hi_s - lo_s == pytest.approx(_wilson_width(80, 160), rel=0.2)  # binomial noise, never [0.5, 0.5]
    assert task_rate_ci([(0, 0), (4, 4), (4, 0)]) == task_rate_ci([(4, 4), (4, 0)])  # no-attempt tasks carry nothing
    assert all(math.isnan(x) for x in task_rate_ci([(0, 0)]))
    lo_m, hi_m = task_mean_ci([1.0] * 10 + [0.0] * 10 + [float("nan")])
    assert lo_m < 0.5 < hi_m and hi_m - lo_m > 0.3


def test_the_paired_interval_sees_a_consistent_small_gain_that_unpaired_rates_hide():
    import random

    rng = random.Random(0)
    base = {f"t{i}": rng.random() for i in range(200)}  # tasks of very different difficulty
    better = {t: min(1.0, v + 0.05) for t, v in base.items()}
    diff, lo, hi, n = paired_difference_ci(better, base)
    assert n == 200 and 0 < lo <= diff <= hi
    lo_a, hi_a = task_mean_ci(list(better.values()))
    lo_b, hi_b = task_mean_ci(list(base.values()))
    assert lo_a < hi_b  # unpaired intervals overlap: they could not tell the two apart
    same = paired_difference_ci(base, dict(base))
    assert same[0] == 0.0 and same[1] < 0 < same[2]
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference_ci({"a": 1.0}, {"b": 1.0})


def test_scripted_teacher_reference_with_infra_failures(sandbox_service, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    from components.recipes import get_recipe

    (task,) = get_recipe("swe").tasks("heldout", 1, seed=0)
    # The same task on an image that does not exist: every attempt is an infrastructure failure.
    broken = task.model_copy(update={"id": "zz-broken"}, deep=True)
    broken.environment.image = "nonexistent-task-image"
    TaskStore(tmp_path / "tasks").write([task, broken])
    config = EvalConfig(
        policy="scripted", scripted_error_rate=0.0, k=2, infra_retries=1, sandbox=sandbox_service.connection()
    )
    # One sqlite store per session (basetemp is shared): creating its tables costs seconds.
    db = tmp_path_factory.getbasetemp() / "rl-eval-mlflow.db"
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{db}", experiment="eval-test")
    result = evaluate(config, tmp_path / "tasks", None, tmp_path / "eval", tracking=tracking)

    assert (result.tasks, result.attempts, result.valid_attempts) == (2, 4, 2)
    assert result.resolved_rate == 1.0 and result.pass_at_k == 1.0 and result.pass_at_k_tasks == 1
    assert (result.infra_errors, result.infra_retries_used) == (2, 2)
    assert result.infra_error_rate == pytest.approx(2 / 4)
    assert result.mean_steps >= 3 and result.policy_id.startswith("scripted")
    assert result.hidden_pass_fraction_n == 2 and result.mean_hidden_pass_fraction == 1.0  # resolved: all pass
    per_task = pd.read_parquet(result.per_task_path)
    assert list(per_task.task_id) == sorted(per_task.task_id) and len(per_task) == 2
    assert per_task.set_index("task_id").loc["zz-broken", "valid_attempts"] == 0
    assert json.loads((tmp_path / "eval" / "eval_result.json").read_text())["resolved"] == 2

    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    (run,) = mlflow.search_runs(experiment_names=["eval-test"], output_format="list")
    assert run.data.metrics["resolved_rate"] == 1.0 and run.data.metrics["infra_errors"] == 2
    assert run.data.metrics["hidden_pass_fraction_mean"] == 1.0 and run.data.metrics["hidden_pass_fraction_n"] == 2
    assert {"per_task.parquet", "resolved_rate.png"} <= {
        a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)
    }
    (inp,) = run.inputs.dataset_inputs  # the evaluated tasks, as a dataset input
    assert inp.dataset.name == "swe-heldout" and inp.tags[0].value == "evaluation"
    assert run.data.metrics["resolved_rate_ci95_low"] <= 1.0 <= run.data.metrics["resolved_rate_ci95_high"]


class _SubmitEndpoint:
    """An OpenAI-compatible endpoint on loopback whose model always submits."""

    def __init__(self):
        self.requests = 0
        self.temperatures: list[float | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                outer.temperatures.append(request.get("temperature"))
                content = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
                body = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_local_model_and_endpoint_policies(sandbox_service, tmp_path):
    from components.core.policy.modeling import ModelConfig, TokenizerConfig, save_policy
    from components.tiny_model import build_tiny_model, build_tokenizer

    TaskStore(tmp_path / "tasks").write([COIN_TASK])
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=0))
    save_policy(build_tiny_model(ModelConfig(), tokenizer), tokenizer, tmp_path / "model")
    harness = HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=8))
    local = evaluate(
        EvalConfig(k=2, harness=harness, sandbox=sandbox_service.connection()),
        tmp_path / "tasks",
        tmp_path / "model",
        tmp_path / "eval-local",
    )
    assert local.policy_id.startswith("local:") and local.valid_attempts == 2 and local.infra_errors == 0
    assert local.mean_completion_tokens > 0

    endpoint = _SubmitEndpoint()
    try:
        config = EvalConfig(
            policy="openai",
            k=2,
            harness=harness,
            sandbox=sandbox_service.connection(),
            endpoint=OpenAIPolicyConfig(base_url=endpoint.url, model="fake", api_key_env=None),
        )
        remote = evaluate(config, tmp_path / "tasks", None, tmp_path / "eval-remote")
    finally:
        endpoint.server.shutdown()
    assert remote.policy_id == "openai:fake" and remote.valid_attempts == 2 and endpoint.requests == 2
    assert remote.mean_steps == 1.0 and 0.0 <= remote.resolved_rate <= 1.0


def test_config_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="needs endpoint"):
        EvalConfig(policy="openai")
    TaskStore(tmp_path / "tasks").write([COIN_TASK])
    with pytest.raises(ValueError, match="needs model_dir"):
        evaluate(EvalConfig(), tmp_path / "tasks", None, tmp_path / "out")
    with pytest.raises(ValueError, match="no 'train' tasks"):
        evaluate(EvalConfig(split="train"), tmp_path / "tasks", None, tmp_path / "out")


def test_greedy_attempt_beside_the_sampled_ones(sandbox_service, tmp_path):
    """`greedy=True`: one more attempt per task at temperature 0, reported as greedy_* and in its own store;
    the k sampled attempts (at the configured temperature) alone make pass@1."""
    TaskStore(tmp_path / "tasks").write([COIN_TASK, COIN_TASK.model_copy(update={"id": "coin2"})])
    endpoint = _SubmitEndpoint()
    try:
        config = EvalConfig(
            policy="openai",
            k=3,
            temperature=0.9,
            greedy=True,
            sandbox=sandbox_service.connection(),
            harness=HarnessConfig(max_steps=1),
            endpoint=OpenAIPolicyConfig(base_url=endpoint.url, model="fake", api_key_env=None),
        )
        result = evaluate(config, tmp_path / "tasks", None, tmp_path / "eval")
    finally:
        endpoint.server.shutdown()
    assert sorted(endpoint.temperatures) == [0.0, 0.0] + [0.9] * 6
    assert result.attempts == 6 and result.greedy_valid == 2 and 0 <= result.greedy_resolved <= 2
    per_task = pd.read_parquet(result.per_task_path)
    assert per_task.greedy_resolved.sum() == result.greedy_resolved and (per_task.attempts == 3).all()
    from components.core.data.parquet_store import TrajectoryStore

    assert len(TrajectoryStore(tmp_path / "eval" / "trajectories_greedy").read()) == 2


def test_units_are_reported_beside_tasks_and_the_validation_split_can_be_evaluated(sandbox_service, tmp_path):
    """Provision writes a validation split (for tuning, never the held-out one) that evaluation runs on; a
    repository with two issue texts is one unit: reported beside n and used by the interval."""
    from components.provision import ProvisionConfig, provision_environment

    provision_environment(
        ProvisionConfig(n_train=1, n_heldout=1, n_validation=2, check_sandbox=False), tmp_path / "tasks"
    )
    first, _ = sorted(TaskStore(tmp_path / "tasks").read(split="validation"), key=lambda t: t.id)
    # the same repository with another issue text, whose verdict always fails: a unit half solved
    again = first.model_copy(
        update={
            "id": first.id + "-again",
            "prompt": first.prompt + " Please.",
            "verifier": VerifierSpec(kind="command", command="false"),
        }
    )
    TaskStore(tmp_path / "tasks").write([again])
    config = EvalConfig(
        policy="scripted", scripted_error_rate=0.0, k=1, split="validation", sandbox=sandbox_service.connection()
    )
    result = evaluate(config, tmp_path / "tasks", None, tmp_path / "eval")
    assert (result.tasks, result.units, result.resolved) == (3, 2, 2)
    per_task = pd.read_parquet(result.per_task_path).sort_values("task_id")
    assert per_task.set_index("task_id").loc[again.id, "unit"] == first.unit
    assert result.metrics["units"] == 2
    counts = list(zip(per_task.valid_attempts, per_task.resolved))
    assert result.resolved_rate_ci95 == task_rate_ci(counts, units=list(per_task.unit))
    assert result.resolved_rate_ci95 != task_rate_ci(counts)  # clustered by the repository, not by task
