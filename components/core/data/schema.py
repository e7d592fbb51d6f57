"""Records that cross stage boundaries: tasks, steps, trajectories, token-level training samples.

Every record is a pydantic model; the parquet store (`store.py`) writes them with a versioned schema.
`SCHEMA_VERSION` changes whenever a stored field changes meaning or type; old shards still load.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# 2: Step.logprobs and Step.tokenizer_id (sampled tokens and whose vocabulary they are); 3: Trajectory.verification
SCHEMA_VERSION = 3

# A recipe's registered name (components/recipes: built in, or from another package). Records keep it as a plain
# string so a trajectory of a recipe that is not installed here still loads; configs check it (`RecipeName`).
RecipeId = str
# train: what training sees; validation: for tuning (learning rate, temperature...), never trained on; heldout: the
# final evaluation, never trained or tuned on. Which split may hold a task is decided by its unit
# (`core/data/splits.py`).
Split = Literal["train", "validation", "heldout"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------
class EnvironmentSpec(_Record):
    """What the sandbox for a task starts from."""

    image: str | None = Field(None, description="Backend image (local: root dir, None = host root; k8s: image).")
    files: dict[str, str] = Field(default_factory=dict, description="Files placed in the workdir before the episode.")
    repo_path: str | None = Field(None, description="A local directory uploaded as the repository (imports).")
    base_commit: str | None = Field(None, description="Commit to check out in repo_path (SWE-bench imports).")
    setup_commands: list[str] = Field(default_factory=list, description="Shell commands run after files are placed.")
    workdir: str = Field("/workspace/repo", description="Where the agent starts.")
    network: Literal["none", "loopback"] = Field("none", description="Network the task needs.")
    memory_mb: int = Field(1024, description="Sandbox memory limit.")
    cpu: float = Field(1.0, description="Sandbox CPU limit.")


class VerifierSpec(_Record):
    """How an outcome is verified. Hidden files are placed only after the agent submits."""

    kind: Literal["pytest", "calls", "command", "python"] = Field(
        "pytest",
        description="pytest: hidden test files + pytest; calls: the tests' calls run in a worker, "
        "their assertions judged on the host (SWE `calls.py`); command: exit code; python: recipe verifier.",
    )
    hidden_files: dict[str, str] = Field(default_factory=dict, description="Never visible to the agent.")
    command: str | None = Field(None, description="Command whose exit code 0 means resolved.")
    fail_to_pass: list[str] = Field(default_factory=list, description="Tests that must go from failing to passing.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Tests that must keep passing.")
    timeout_seconds: float = 120.0
    expected: dict[str, Any] = Field(default_factory=dict, description="Recipe-specific expected state or answer.")


class Task(_Record):
    id: str
    recipe: RecipeId
    split: Split
    prompt: str = Field(description="What the agent is asked to do (the issue text for SWE).")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    verifier: VerifierSpec = Field(default_factory=VerifierSpec)
    reference_solution: str | None = Field(None, description="A unified diff or action script that resolves it.")
    family: str | None = Field(None, description="Task family (e.g. bug kind), used for held-out splits.")
    difficulty: int = 1
    seed: int | None = None
    unit: str | None = Field(
        None,
        description="The independent unit the task belongs to: tasks of one unit are not independent evidence "
        "(generated SWE: a digest of its repository's files; imported SWE-bench: the upstream "
        "repository; GUI/Claw: the task's own site/world). Intervals and paired tests cluster by it; "
        "None (tasks stored before units existed): the task is its own unit.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Steps and trajectories
# ---------------------------------------------------------------------------------------------
class ToolCall(_Record):
    id: str = Field(default_factory=lambda: new_id("call"))
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Step(_Record):
    """One message of an episode. Assistant steps carry the tool call; tool steps carry its result."""

    index: int
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call: ToolCall | None = Field(None, description="Parsed tool call (assistant steps).")
    tool_call_id: str | None = Field(None, description="The call this step answers (tool steps).")
    tool_name: str | None = None
    policy_error: str | None = Field(None, description="Malformed output or bad tool use: the policy's error.")
    infra_error: str | None = Field(None, description="The environment failed while running this step's tool.")
    token_ids: list[int] | None = Field(None, description="Assistant tokens exactly as sampled (for RL).")
    logprobs: list[float] | None = Field(None, description="Log-probability of each sampled token, as sampled.")
    tokenizer_id: str | None = Field(
        None,
        description="Fingerprint of the tokenizer `token_ids` belong to (`rendering.tokenizer_id`); ids of "
        "another tokenizer, or of none recorded, are re-tokenized from the text at training.",
    )
    sandbox_state_id: str | None = Field(None, description="Snapshot id of the sandbox after this step.")
    started_at: datetime | None = None
    duration_seconds: float | None = None
    # Filled by the credit stage (components/credit/stage.py):
    value_estimate: float | None = Field(None, description="Estimated P(resolve) after this step.")
    credit: float | None = Field(None, description="value_estimate(t) - value_estimate(t-1).")
    credited: bool | None = Field(None, description="Inside a selected rise segment (loss is applied).")


class Outcome(str, enum.Enum):
    resolved = "resolved"
    unresolved = "unresolved"
    infra_error = "infra_error"  # never a policy failure: excluded from rewards and denominators


class EpisodeStatus(str, enum.Enum):
    """How the episode ended; BAR ranks completed > truncated > time_truncated > aborted."""

    completed = "completed"  # the agent submitted
    truncated = "truncated"  # step or token limit reached
    time_truncated = (
        "time_truncated"  # policy-time limit reached (generation + commands; HarnessConfig.max_wall_seconds)
    )
    aborted = "aborted"  # infrastructure failure: never enters a reward group


class TestReport(_Record):
    passed: int = 0
    failed: int = 0
    errors: int = 0
    output: str = ""
    duration_seconds: float = 0.0
    hidden_passed: int | None = Field(
        None,
        description="FAIL_TO_PASS tests that passed: partial progress, for "
        "analysis only (the reward stays resolved / unresolved).",
    )
    hidden_total: int | None = Field(None, description="FAIL_TO_PASS tests the task has (None: not a pytest task).")

    @property
    def hidden_pass_fraction(self) -> float | None:
        if not self.hidden_total:
            return None
        if self.hidden_passed is None:
            raise ValueError("a test report with hidden_total needs hidden_passed")
        return self.hidden_passed / self.hidden_total


class IgnoredPart(_Record):
    """A part of the agent's change (or final state) that verification deliberately did not use."""

    path: str = Field(description="What was left out: a repository-relative path, or a state item.")
    reason: str = Field(description="Why the verifier's rule leaves it out.")


class Verification(_Record):
    """Which verifier produced an outcome and what of the agent's change it ignored (for auditing a reward)."""

    verifier: str = Field(description="Verifier name, e.g. 'swe-clean-room'.")
    version: str = Field(description="Bumped whenever the verifier's rule changes; rewards of two versions differ.")
    ignored: list[IgnoredPart] = Field(default_factory=list, description="Recorded as 'ignored by verification'.")
    applied: list[str] = Field(default_factory=list, description="Parts of the change verification did use.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall time per verification phase.")


class Trajectory(_Record):
    id: str = Field(default_factory=lambda: new_id("traj"))
    schema_version: int = SCHEMA_VERSION
    task_id: str
    recipe: RecipeId
    split: Split = "train"
    policy_id: str
    steps: list[Step] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI-style tool specs offered.")
    final_answer: str | None = Field(None, description="Final patch (SWE) or answer text.")
    outcome: Outcome
    outcome_reason: str | None = Field(None, description="Why unresolved / which infra error.")
    status: EpisodeStatus = EpisodeStatus.completed
    test_report: TestReport | None = None
    verification: Verification | None = Field(None, description="The verifier's version and what it ignored.")
    reward: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    attempt: int = 0
    created_at: datetime = Field(default_factory=utcnow)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return self.outcome is Outcome.resolved

    @property
    def num_assistant_steps(self) -> int:
        return sum(1 for s in self.steps if s.role == "assistant")

    @property
    def hidden_pass_fraction(self) -> float | None:
        """Share of the task's hidden FAIL_TO_PASS tests passing at the end (None: not verified, or no such tests)."""
        return self.test_report.hidden_pass_fraction if self.test_report is not None else None


def hidden_pass_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Partial progress for analysis (the reward stays resolved / unresolved): the mean fraction of hidden
    tests passing over the trajectories that have one, the same over unresolved ones only, and both n.
    NaN where no trajectory has a fraction (recipes without hidden tests, all infrastructure errors)."""
    every = [(t.hidden_pass_fraction, t.outcome) for t in trajectories]
    known = [f for f, _ in every if f is not None]
    unresolved = [f for f, o in every if f is not None and o is Outcome.unresolved]
    return {
        "hidden_pass_fraction_mean": sum(known) / len(known) if known else float("nan"),
        "hidden_pass_fraction_n": float(len(known)),
        "hidden_pass_fraction_unresolved_mean": sum(unresolved) / len(unresolved) if unresolved else float("nan"),
        "hidden_pass_fraction_unresolved_n": float(len(unresolved)),
    }


# ---------------------------------------------------------------------------------------------
# Token-level samples (what SFT and RL train on)
# ---------------------------------------------------------------------------------------------
class TokenRole(int, enum.Enum):
    system = 0
    user = 1
    assistant = 2
    tool = 3


class TokenizedSample(_Record):
    """A rendered episode: ids as the model sees them, a role per token, and the loss mask."""

    trajectory_id: str
    input_ids: list[int]
    roles: list[int] = Field(description="TokenRole per token.")
    loss_mask: list[int] = Field(description="1 where loss is applied (assistant tokens of credited steps).")
    step_index: list[int] = Field(description="Index of the Step each token came from.")
    advantage: float | None = Field(None, description="RL only: the group-normalized advantage.")
    retokenized_steps: list[int] = Field(
        default_factory=list,
        description="Assistant steps with loss whose ids came from re-tokenizing their text "
        "(no sampled ids of this tokenizer), not from sampling.",
    )
