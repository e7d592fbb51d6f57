"""Credit labeling: rise segments on hand-built curves, the LLM judge against a real loopback
endpoint, the stage end to end, and the Monte-Carlo estimator in real sandboxes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.core.data.schema import EpisodeStatus, Outcome, Step, Task, ToolCall, Trajectory
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig
from components.credit.stage import CreditConfig, label_credit
from components.credit.base import CreditEstimationError
from components.credit.judge import JudgeConfig, LLMJudgeEstimator, parse_answer
from components.credit.segments import SegmentConfig, interpolate, segments, select_segments, smooth


# ---------------------------------------------------------------------------------------------
# Segment selection
# ---------------------------------------------------------------------------------------------
def test_rise_segments_on_hand_built_curves():
    # V(s_0..s_6): rise, rise, flat, drop, rise of exactly epsilon, tiny rise below epsilon
    values = [0.1, 0.3, 0.5, 0.5, 0.2, 0.25, 0.26]
    assert select_segments(values) == [True, True, False, False, True, False]
    assert segments(select_segments(values)) == [(0, 1), (4, 4)]
    assert select_segments(values, SegmentConfig(min_length=2)) == [True, True, False, False, False, False]
    assert select_segments(values, SegmentConfig(epsilon=0.25)) == [False] * 6
    assert select_segments([0.4, 0.4, 0.4]) == [False, False]  # flat: nothing to imitate
    assert select_segments([1.0, 0.5, 0.0]) == [False, False]  # monotone decline
    assert select_segments([0.0, 1.0]) == [True]
    assert select_segments([0.5]) == []


def test_smoothing_removes_a_one_step_blip_and_interpolation_fills_between_key_steps():
    noisy = [0.0, 0.5, 0.0, 0.0, 0.0]  # a single lucky estimate
    assert select_segments(noisy) == [True, False, False, False]
    assert smooth(noisy, 3) == pytest.approx([0.25, 1 / 6, 1 / 6, 0.0, 0.0])
    assert select_segments(noisy, SegmentConfig(smoothing_window=3, epsilon=0.1)) == [False] * 4
    steady = [0.0, 0.2, 0.4, 0.6, 0.8]
    assert select_segments(steady, SegmentConfig(smoothing_window=3)) == [True] * 4
    assert interpolate({0: 0.0, 2: 1.0, 4: 0.0}, 5) == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert interpolate({1: 0.3}, 3) == [0.3, 0.3, 0.3]


def test_a_rise_must_clear_its_own_noise_bar():
    values = [0.2, 0.5, 0.5, 0.8]  # two rises of 0.3
    quiet, noisy = [0.05, 0.0, 0.05], [0.2, 0.0, 0.05]  # SE(c_t) of each step
    assert select_segments(values, SegmentConfig(z=2.0), quiet) == [True, False, True]
    # 0.3 < 2 * 0.2: a rise no larger than its noise is not credited
    assert select_segments(values, SegmentConfig(z=2.0), noisy) == [False, False, True]
    assert select_segments(values, SegmentConfig(z=0.0), noisy) == [True, False, True]
    assert select_segments(values, SegmentConfig(z=2.0), [None, None, None]) == [
        True,
        False,
        True,
    ]  # unknown SE: epsilon
    with pytest.raises(ValueError, match="3 steps"):
        select_segments(values, SegmentConfig(), [0.1])


def test_paired_credit_stderr_from_continuation_outcomes():
    """SE(mean paired difference) / (b - a), the differences' variance pooled with one pseudo-pair at 1/2:
    (sum of squared deviations + 1/2) / n."""
    from components.credit.monte_carlo import independent_credit_stderr, paired_credit_stderr

    # keys 0, 2, 3: the same seeds succeed at 0 and 2 (paired differences all zero), then the terminal 0.
    outcomes = {0: [1.0, 0.0, 1.0, 0.0], 2: [1.0, 0.0, 1.0, 0.0], 3: [0.0] * 4}
    se = paired_credit_stderr([0, 2, 3], outcomes, 3)
    # Four agreeing pairs are not noise-free: the pseudo-pair's variance alone, (0 + 1/2) / 4.
    assert se[0] == se[1] == pytest.approx((0.5 / 4 / 4) ** 0.5 / 2)
    assert se[2] == pytest.approx(((1 + 0.5) / 4 / 4) ** 0.5)  # differences (-1, 0, -1, 0): squares sum to 1
    # Key states two steps apart: the interpolated curve rises (V_2 - V_0) / 2 per step, so each step's SE
    # is the paired difference's SE halved. Differences (1, 0, 0, -1): squares sum to 2.
    spread = paired_credit_stderr([0, 2], {0: [0.0, 0.0, 1.0, 1.0], 2: [1.0, 0.0, 1.0, 0.0]}, 2)
    assert spread == [pytest.approx(((2 + 0.5) / 4 / 4) ** 0.5 / 2)] * 2
    # an infra failure (None) drops only its own pair; no complete pair: unknown; one pair: the pseudo-pair alone
    assert paired_credit_stderr([0, 1], {0: [1.0, None, 0.0], 1: [1.0, 1.0, 1.0]}, 1) == [pytest.approx(0.5)]
    assert paired_credit_stderr([0, 1], {0: [1.0, None], 1: [None, 1.0]}, 1) == [None]
    assert (
        paired_credit_stderr([0, 3], {0: [1.0, None], 1: [1.0, 1.0], 3: [0.0, 1.0]}, 3)
        == [pytest.approx(0.5**0.5 / 3)] * 3
    )
    indep = independent_credit_stderr([0, 2], [0.2, None, 0.2], 2)
    assert indep == [pytest.approx(0.08**0.5 / 2)] * 2


# ---------------------------------------------------------------------------------------------
# LLM judge against a loopback OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------
class FakeOpenAI:
    """A real HTTP server on 127.0.0.1 answering /v1/chat/completions from a script of replies."""

    def __init__(self, replies: list[tuple[int, str]]):
        self.replies = list(replies)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, content = outer.replies.pop(0) if outer.replies else (500, "script exhausted")
                payload = (
                    {"choices": [{"message": {"role": "assistant", "content": content}}]}
                    if status == 200
                    else {"error": content}
                )
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def _trajectory(n_actions: int = 3, outcome=Outcome.unresolved, task_id: str = "task-1") -> Trajectory:
    steps = [Step(index=0, role="system", content="You fix bugs."), Step(index=1, role="user", content="Fix add.")]
    for k in range(n_actions):
        call = ToolCall(name="bash", arguments={"command": f"echo {k}"})
        steps.append(
            Step(
                index=len(steps),
                role="assistant",
                content=f'<tool_call>{{"name": "bash"}}</tool_call> {k}',
                tool_call=call,
            )
        )
        steps.append(Step(index=len(steps), role="tool", content=f"out {k}", tool_call_id=call.id, tool_name="bash"))
    return Trajectory(task_id=task_id, recipe="swe", policy_id="teacher", steps=steps, outcome=outcome)


def _answer(initial, pairs):
    return json.dumps({"initial": initial, "steps": [{"step": s, "p_resolve": p} for s, p in pairs]})


def test_judge_answer_schema_is_strict():
    assert parse_answer(_answer(0.1, [(2, 0.5), (4, 0.2)]), [2, 4]).initial == 0.1
    assert parse_answer("```json\n" + _answer(0.1, [(2, 0.5)]) + "\n```", [2]).steps[0].p_resolve == 0.5
    for bad, why in [
        ("The agent did well.", "not a JSON object"),
        (_answer(0.1, [(2, 0.5)]), "steps must be exactly"),
        (_answer(0.1, [(2, 0.5), (2, 0.5)]), "steps must be exactly"),
        (_answer(0.1, [(2, 1.5), (4, 0.2)]), "schema"),
        (json.dumps({"initial": 0.1, "steps": [], "extra": 1}), "schema"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_answer(bad, [2, 4])


def test_judge_retries_malformed_answers_and_server_errors(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sekret")
    traj = _trajectory(3)
    task = Task(id="task-1", recipe="swe", split="train", prompt="Fix add.")
    good = _answer(0.2, [(2, 0.3), (4, 0.6), (6, 0.1)])
    replies = [(503, "overloaded"), (200, "I think it is fine"), (200, _answer(0.2, [(2, 0.3)])), (200, good)]
    with FakeOpenAI(replies) as server:
        judge = LLMJudgeEstimator(
            JudgeConfig(
                base_url=server.base_url, model="judge-1", api_key_env="JUDGE_KEY", max_attempts=3, http_retries=2
            )
        )
        estimate = judge.estimate(traj, task)
        judge.close()
    assert estimate.values == [0.2, 0.3, 0.6, 0.1]
    assert estimate.step_indices == [2, 4, 6] and estimate.estimator == "judge"
    assert judge.rejected_answers == 2
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sekret"
    assert first["body"]["model"] == "judge-1" and first["body"]["response_format"] == {"type": "json_object"}
    prompt = first["body"]["messages"][1]["content"]
    assert "[step 4] assistant" in prompt and "FINAL RESULT: unresolved" in prompt
    # the rejection reason is fed back to the judge
    assert "Rejected" in server.requests[-1]["body"]["messages"][-1]["content"]


def test_judge_gives_up_after_max_attempts():
    with FakeOpenAI([(200, "no json")] * 2) as server:
        judge = LLMJudgeEstimator(JudgeConfig(base_url=server.base_url, model="m", api_key_env=None, max_attempts=2))
        with pytest.raises(CreditEstimationError, match="2 malformed answers"):
            judge.estimate(_trajectory(1), Task(id="task-1", recipe="swe", split="train", prompt="x"))


def test_label_credit_with_the_judge_end_to_end(tmp_path):
    tasks = [Task(id=f"task-{i}", recipe="swe", split="train", prompt=f"Fix {i}.") for i in range(3)]
    TaskStore(tmp_path / "tasks").write(tasks)
    resolved = _trajectory(2, Outcome.resolved, "task-0")
    unresolved = _trajectory(3, Outcome.unresolved, "task-1")
    broken = _trajectory(2, Outcome.unresolved, "task-2")
    infra = _trajectory(1, Outcome.infra_error, "task-2").model_copy(update={"status": EpisodeStatus.aborted})
    TrajectoryStore(tmp_path / "trajs").append([resolved, unresolved, broken, infra])
    replies = [(200, _answer(0.1, [(2, 0.5), (4, 0.52), (6, 0.0)])), (200, "junk"), (200, "junk")]
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="credit-test")
    with FakeOpenAI(replies) as server:
        config = CreditConfig(
            estimator="judge", judge=JudgeConfig(base_url=server.base_url, model="m", api_key_env=None, max_attempts=2)
        )
        result = label_credit(config, tmp_path / "trajs", tmp_path / "tasks", tmp_path / "out", tracking=tracking)
    assert (result.resolved, result.unresolved, result.infra_error) == (1, 2, 1)
    assert result.labelled == 1 and result.failed == 1
    out = {t.task_id + t.outcome.value: t for t in TrajectoryStore(tmp_path / "out").read()}
    whole = out["task-0resolved"]
    assert all(s.credited for s in whole.steps if s.role == "assistant")
    labelled = out["task-1unresolved"]
    acts = [s for s in labelled.steps if s.role == "assistant"]
    assert [s.credited for s in acts] == [True, False, False]
    assert [s.value_estimate for s in acts] == [0.5, 0.52, 0.0]
    assert [round(s.credit, 6) for s in acts] == [0.4, 0.02, -0.52]
    assert labelled.metadata["credit"]["segments"] == [[0, 0]]
    failed = out["task-2unresolved"]
    assert "malformed" in failed.metadata["credit_error"] and not any(s.credited for s in failed.steps)
    assert out["task-2infra_error"].steps == infra.steps
    assert result.metrics["credited_step_fraction"] == pytest.approx(1 / 5)

    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    run = mlflow.search_runs(experiment_names=["credit-test"], output_format="list")[0]
    assert run.data.params["estimator"] == "judge" and run.data.params["segments.epsilon"] == "0.05"
    assert run.data.metrics["labelled"] == 1.0


# ---------------------------------------------------------------------------------------------
# Monte-Carlo continuations in real sandboxes, from states of known solvability
# ---------------------------------------------------------------------------------------------
class ActionScript:
    """A policy that plays a fixed list of tool calls (to build a trajectory with known states)."""

    policy_id = "action-script"

    def __init__(self, calls: list[ToolCall]):
        self.calls = calls

    def generate(self, messages, config):
        from components.core.policy.base import Generation
        from components.core.rendering.protocol import format_tool_call

        turn = sum(1 for m in messages if m.role == "assistant")
        return Generation(text=format_tool_call(self.calls[turn]))


def _known_solvability_trajectory(client, task, recipe):
    """destroy the package (unsolvable) -> restore it from git (solvable) -> submit the unfixed repo."""
    from components.core.episode.harness import HarnessConfig, run_episode

    pkg = task.metadata["package"]
    calls = [
        ToolCall(name="bash", arguments={"command": f"rm -rf {pkg}"}),
        ToolCall(name="bash", arguments={"command": "git checkout -- ."}),
        ToolCall(name="submit", arguments={}),
    ]
    return run_episode(task, recipe, ActionScript(calls), client, HarnessConfig(snapshot_every_step=True, max_steps=6))


@pytest.mark.parametrize("use_snapshots,k", [(True, 1), (True, 3), pytest.param(False, 2, marks=pytest.mark.slow)])
def test_monte_carlo_recovers_known_values_and_credits_the_repair(sandbox_client, use_snapshots, k):
    from components.credit.stage import apply_estimate
    from components.credit.monte_carlo import MonteCarloConfig, MonteCarloEstimator
    from components.recipes import get_recipe

    recipe = get_recipe("swe", difficulty=1)
    task = recipe.tasks("train", 1, seed=3)[0]
    traj = _known_solvability_trajectory(sandbox_client, task, recipe)
    assert traj.outcome is Outcome.unresolved and traj.status is EpisodeStatus.completed
    assert all(s.sandbox_state_id for s in traj.steps if s.role == "tool")
    # An error-free teacher resolves from every intact state and never from a destroyed one.
    estimator = MonteCarloEstimator(
        MonteCarloConfig(k=k, teacher_error_rate=0.0, max_steps=6, parallel=3, use_snapshots=use_snapshots),
        recipe,
        sandbox_client,
    )
    estimate = estimator.estimate(traj, task)
    assert estimate.values == [1.0, 0.0, 1.0, 0.0]
    assert estimate.samples == [k, k, k, 0]  # the state after submit is terminal: no continuation
    assert estimate.stderr == [0.0] * 4
    assert estimator.continuations == 3 * k and estimator.infra_failures == 0
    # k = 1 gives no spread to estimate the credit's SE from: the pseudo-pair's stands in and nothing clears
    # the noise bar; the error-free teacher is exact, so this test turns the bar off for k = 1.
    if k == 1:
        assert estimate.credit_stderr == [pytest.approx(0.5**0.5)] * 3
        assert not any(s.credited for s in apply_estimate(traj, estimate, SegmentConfig()).steps)
    labelled = apply_estimate(traj, estimate, SegmentConfig(z=0.0) if k == 1 else SegmentConfig())
    assert [s.credited for s in labelled.steps if s.role == "assistant"] == [False, True, False]


def test_common_random_numbers_cancel_the_teachers_noise_between_equal_states(sandbox_client):
    """Two no-op steps leave the state as it was: with common random numbers every continuation j
    replays the same teacher decisions from s_0, s_1 and s_2, so both credits are exactly 0 (their SE only the
    pseudo-pair's), although each value on its own is a noisy mean of a teacher that fails half the time."""
    from components.core.episode.harness import HarnessConfig, run_episode
    from components.credit.stage import apply_estimate
    from components.credit.monte_carlo import MonteCarloConfig, MonteCarloEstimator
    from components.recipes import get_recipe

    recipe = get_recipe("swe", difficulty=1)
    task = recipe.tasks("train", 1, seed=3)[0]
    calls = [
        ToolCall(name="bash", arguments={"command": "echo one"}),
        ToolCall(name="bash", arguments={"command": "echo two"}),
        ToolCall(name="submit", arguments={}),
    ]
    traj = run_episode(
        task, recipe, ActionScript(calls), sandbox_client, HarnessConfig(snapshot_every_step=True, max_steps=6)
    )
    config = MonteCarloConfig(k=6, teacher_error_rate=0.6, max_steps=8, parallel=3)
    estimate = MonteCarloEstimator(config, recipe, sandbox_client).estimate(traj, task)
    v0, v1, v2, v3 = estimate.values
    assert 0.0 < v0 < 1.0, "the teacher must be noisy for this test to mean anything"
    assert v0 == v1 == v2 and v3 == 0.0
    assert estimate.credit_stderr[:2] == [pytest.approx((0.5 / 6 / 6) ** 0.5)] * 2  # six agreeing pairs
    assert estimate.credit_stderr[2] > estimate.credit_stderr[0]
    labelled = apply_estimate(traj, estimate, SegmentConfig())
    assert not any(s.credited for s in labelled.steps if s.role == "assistant")
    assert labelled.metadata["credit"]["credit_stderr"] == estimate.credit_stderr


@pytest.mark.slow
def test_monte_carlo_value_is_the_resolved_share_of_its_seeded_continuations(sandbox_client):
    from components.core.episode.harness import HarnessConfig, run_episode
    from components.credit.monte_carlo import MonteCarloConfig, MonteCarloEstimator
    from components.recipes import get_recipe, get_scripted_teacher

    recipe = get_recipe("swe", difficulty=1)
    task = recipe.tasks("train", 1, seed=3)[0]
    traj = _trajectory(0, Outcome.unresolved, task.id)  # only the task statement: V(s_0) alone
    traj.status = EpisodeStatus.truncated
    traj.steps.append(Step(index=2, role="assistant", content="I give up.", policy_error="no tool call"))
    traj.steps.append(Step(index=3, role="tool", content="Error: no tool call found."))
    config = MonteCarloConfig(k=6, teacher_error_rate=0.6, max_steps=8, parallel=3)
    estimate = MonteCarloEstimator(config, recipe, sandbox_client).estimate(traj, task)
    # The same six seeded teachers run from scratch, outside the estimator:
    harness = HarnessConfig(max_steps=8)
    wins = [
        run_episode(task, recipe, get_scripted_teacher("swe", 0.6, j), sandbox_client, harness).resolved
        for j in range(6)
    ]
    assert 0 < sum(wins) < 6, "a teacher that always or never resolves cannot test the estimate"
    p = sum(wins) / 6
    assert estimate.values[0] == pytest.approx(p) and estimate.samples[0] == 6
    assert estimate.stderr[0] == pytest.approx((p * (1 - p) / 6) ** 0.5)


@pytest.mark.parametrize("common_random_numbers", [True, False])
def test_one_continuation_per_state_does_not_fall_back_to_epsilon(common_random_numbers):
    """A flat value curve (every state resolves with probability 1/2) estimated from k = 1 continuation:
    with epsilon as the only bar about a quarter of the steps were credited by chance."""
    import random

    from components.credit.monte_carlo import independent_credit_stderr, paired_credit_stderr, value_stderr

    rng = random.Random(0)
    steps = credited = by_epsilon = 0
    for _ in range(400):
        T, keys = 6, list(range(7))
        outcomes = {t: [float(rng.random() < 0.5)] for t in keys}
        values = [outcomes[t][0] for t in keys]
        se = (
            paired_credit_stderr(keys, outcomes, T)
            if common_random_numbers
            else independent_credit_stderr(keys, [value_stderr(v, 1) for v in values], T)
        )
        assert all(s is not None and s > 0 for s in se)
        credited += sum(select_segments(values, SegmentConfig(), se))
        by_epsilon += sum(select_segments(values, SegmentConfig(), None))  # no SE: epsilon alone
        steps += T
    assert credited / steps < 0.05 < 0.2 < by_epsilon / steps


class _FlatTeacher:
    """Continuations whose success probability is `p` from every state, drawn independently at each state (an
    LLM teacher given two different prefixes; common random numbers cannot couple them): a flat value curve,
    so every credited step is noise. Stands in for `MonteCarloEstimator._continue` (one continuation's verified
    outcome); everything above it (key states, terminal values, interpolation, SE, segments) is the real code."""

    def __init__(self, p: float, seed: int):
        import random

        self.p, self.rng = p, random.Random(seed)

    def estimator(self, config):
        import random

        from components.credit.monte_carlo import MonteCarloEstimator

        teacher = self

        class Flat(MonteCarloEstimator):
            def estimate(self, trajectory, task):
                self.nonce = teacher.rng.random()  # per trajectory, drawn here: continuations run in threads
                return super().estimate(trajectory, task)

            def _continue(self, task, prefix, snapshot, seed):  # seed: continuation j's, the same at every state
                draw = random.Random(f"{self.nonce}/{len(prefix)}/{seed}").random()
                return Outcome.resolved if draw < teacher.p else Outcome.unresolved

        return Flat(config, recipe=None, client=None, policy_factory=lambda seed: None)


def _credited_share_on_a_flat_curve(credit, p: float, trajectories: int = 300, seed: int = 0) -> float:
    """Credited share of the assistant steps of unresolved trajectories shaped like the demo's (3-12 assistant
    steps, half submitted (terminal value 0), half cut by the step limit), under `credit` (a CreditConfig)."""
    import random

    from components.credit.stage import apply_estimate

    rng, teacher = random.Random(seed), _FlatTeacher(p, seed)
    estimator = teacher.estimator(credit.monte_carlo)
    task = Task(id="task-1", recipe="swe", split="train", prompt="Fix add.")
    credited = steps = 0
    for _ in range(trajectories):
        traj = _trajectory(rng.randint(3, 12))
        traj.status = rng.choice([EpisodeStatus.completed, EpisodeStatus.truncated])
        labelled = apply_estimate(traj, estimator.estimate(traj, task), credit.segments)
        flags = [s.credited for s in labelled.steps if s.role == "assistant"]
        credited, steps = credited + sum(flags), steps + len(flags)
    return credited / steps


@pytest.mark.parametrize("p", [0.5, 0.25])
def test_a_flat_value_curve_credits_almost_nothing_at_the_demos_setting(p):
    """The demo's credit setting (k, stride, epsilon, z as the preset has them) on a flat value curve: 1-2 % of
    steps credited by chance at p = 1/2, the worst case (a step needs all k = 3 continuations to flip from
    failure to success). The demo's earlier setting, k = 1 with the noise bar off, credits 16-22 %."""
    from pipelines.config import PipelineConfig

    demo = PipelineConfig.preset_config("demo").credit
    assert demo.estimator == "monte_carlo"
    assert _credited_share_on_a_flat_curve(demo, p) < 0.03
    earlier = demo.model_copy(
        update={
            "monte_carlo": demo.monte_carlo.model_copy(update={"k": 1}),
            "segments": demo.segments.model_copy(update={"z": 0.0}),
        }
    )
    assert _credited_share_on_a_flat_curve(earlier, p) > 0.1
