"""No byte a policy chooses makes its failure the infrastructure's: every dodge, played through the harness.

An episode that ends as an infrastructure error carries no reward, so a policy that learns to end its
failures that way never sees them. Each case here is a tool call whose arguments alone break the tool
(database limits, a NUL byte, an argument too long for one argv, a name too long for the filesystem), a
state that makes a health check fail in the policy's own sandbox or its snapshot fail, or a verification
run outside `run_episode`: each must end as the policy's error (shown to it; unresolved, reward 0), and
the honest episode beside it still resolves.
"""

from __future__ import annotations

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.schema import EpisodeStatus, Outcome, ToolCall
from components.recipes import get_recipe
from components.recipes.swe import SWERecipe
from tests.recipes.test_claw_gui_reward_hacks import Script, answer, bash
from tests.recipes.test_swe_reward_hacks import honest_fix, task  # noqa: F401 - the SWE task fixture

LONG = 140_000  # characters: more than Linux takes in one argv string (128 KiB)

# Takes every process slot of the sandbox and keeps taking each one freed (a daemon: the command returns).
PID_HOG = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    fd = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(fd, n)
    while True:
        try:
            if os.fork() == 0:
                while True:
                    try:
                        if os.fork() == 0:
                            time.sleep(3600)
                            os._exit(0)
                    except OSError:
                        pass
        except OSError:
            pass
time.sleep(2)
"""


def assert_policy_error(traj, tool_index: int = 3) -> None:
    """Unresolved with reward 0 (never an infrastructure error), the failed call shown to the policy."""
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, (traj.outcome, traj.outcome_reason)
    observation = traj.steps[tool_index]
    assert observation.role == "tool" and observation.policy_error, observation
    assert observation.content.startswith(("Error", '{"error"')), observation.content[:300]  # Claw's usage errors


# -- Claw --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def claw_tools():
    recipe = get_recipe("claw", harness="tools")
    return recipe, {t.family: t for t in recipe.tasks("heldout", 4)}


def honest_note(task) -> ToolCall:
    exp = task.verifier.expected
    return ToolCall(name="notes_create", arguments={"title": exp["title"], "body": f"Total: {exp['body_contains']}"})


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("mail_search", {"query": " ".join(["word"] * 1001)}),  # sqlite: Expression tree is too large
        ("mail_search", {"sender": "%" * 60_000}),  # sqlite: LIKE or GLOB pattern too complex
        ("calendar_list", {"date": "%" * 60_000}),
        ("contacts_search", {"query": "%" * 60_000}),
        ("notes_search", {"query": "%" * 60_000}),
        ("files_list", {"prefix": "%" * 60_000}),
        ("mail_search", {"query": " ".join(["a"] * 500)}),  # within the length bound: 1,001 SQL variables
    ],
    ids=["expression-tree", "like-sender", "like-date", "like-contacts", "like-notes", "like-files", "words"],
)
def test_claw_arguments_that_break_a_tool_are_the_policys_error(sandbox_client, claw_tools, name, arguments):
    recipe, tasks = claw_tools
    task = tasks["note_from_file"]
    traj = run_episode(
        task,
        recipe,
        Script([ToolCall(name=name, arguments=arguments), answer("done")]),
        sandbox_client,
        HarnessConfig(max_steps=4),
    )
    assert_policy_error(traj)
    assert "at most" in traj.steps[3].content  # refused by the tool's bounds, before sqlite sees it


def test_a_claw_argument_longer_than_one_argv_string_reaches_the_tool(sandbox_client, claw_tools):
    """10,923 emoji are 131,076 characters of JSON: as one argv string that is over Linux's 128 KiB, and the
    exec failed with E2BIG (the host's control run raised OSError). The arguments go on stdin now."""
    recipe, tasks = claw_tools
    task = tasks["note_from_file"]
    body = "\U0001f600" * 10_923
    traj = run_episode(
        task,
        recipe,
        Script([ToolCall(name="notes_create", arguments={"title": "t", "body": body}), answer("done")]),
        sandbox_client,
        HarnessConfig(max_steps=4),
    )
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, (traj.outcome, traj.outcome_reason)
    assert traj.steps[3].policy_error is None and '"created": true' in traj.steps[3].content, traj.steps[3]


def test_after_a_broken_claw_call_the_honest_episode_resolves(sandbox_client, claw_tools):
    recipe, tasks = claw_tools
    task = tasks["note_from_file"]
    calls = [
        ToolCall(name="mail_search", arguments={"query": " ".join(["word"] * 1001)}),
        honest_note(task),
        answer("Note saved."),
    ]
    traj = run_episode(task, recipe, Script(calls), sandbox_client, HarnessConfig(max_steps=5))
    assert traj.outcome is Outcome.resolved and traj.reward == 1.0, traj.outcome_reason
    assert traj.steps[3].policy_error


def test_a_nul_byte_in_a_claw_shell_command_is_the_policys_error(sandbox_client, shell):
    recipe, tasks = shell
    traj = run_episode(
        tasks["note_from_file"],
        recipe,
        Script([bash("echo \x00"), answer("done")]),
        sandbox_client,
        HarnessConfig(max_steps=4),
    )
    assert_policy_error(traj)
    assert "NUL" in traj.steps[3].content


@pytest.fixture(scope="module")
def shell():
    recipe = get_recipe("claw", harness="shell")
    return recipe, {t.family: t for t in recipe.tasks("heldout", 4)}


# -- SWE ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    ["a" * 300 + "/x.py", "b" * 300, "c/" * 2100 + "x.py", "\u00e9/" * 1500 + "x.py", "nul\x00.py"],
    ids=["long-directory", "long-name", "path-over-PATH_MAX", "bytes-over-PATH_MAX", "nul"],
)
def test_a_swe_path_the_filesystem_refuses_is_the_policys_error(sandbox_client, task, path):
    write = ToolCall(name="write_file", arguments={"path": path, "content": "x = 1\n"})
    traj = run_episode(
        task,
        SWERecipe(),
        Script([write, honest_fix(task), ToolCall(name="submit")]),
        sandbox_client,
        HarnessConfig(max_steps=5),
    )
    assert traj.outcome is Outcome.resolved and traj.reward == 1.0, (traj.outcome, traj.outcome_reason)
    assert traj.steps[3].policy_error and traj.steps[3].content.startswith("Error"), traj.steps[3]
    assert any(word in traj.steps[3].content for word in ("bytes long", "NUL", "at most"))  # the tool's own checks


def test_a_pid_hog_in_the_policys_sandbox_does_not_make_its_failed_verification_infrastructure(sandbox_client, task):
    """The health probe used to run `true` in the policy's own sandbox: a daemon holding every process slot
    made it fail, and a verification that failed on the policy's state (a module turned into a directory,
    so the clean room's upload fails) became the infrastructure's with no control run."""
    module = task.metadata["fix"]["path"]
    calls = [
        bash(f"rm {module} && mkdir -p {module} && echo 'x = 1' > {module}/inner.py"),
        bash(f"python3 - <<'EOF'\n{PID_HOG}EOF"),
        ToolCall(name="submit"),
    ]
    traj = run_episode(task, SWERecipe(), Script(calls), sandbox_client, HarnessConfig(max_steps=5))
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, (traj.outcome, traj.outcome_reason)


def test_a_snapshot_that_fails_on_the_policys_tree_is_the_policys(sandbox_client, sandbox_service, task):
    """With `snapshot_every_step` a tree deeper than PATH_MAX made `cp -a` fail: the episode was aborted
    (no reward) and the partial copy stayed on the host's disk."""
    deep = "for i in $(seq 24); do d=$(printf 'd%.0s' $(seq 200)); mkdir $d && cd $d; done; echo made"
    traj = run_episode(
        task,
        SWERecipe(),
        Script([bash(deep), ToolCall(name="submit")]),
        sandbox_client,
        HarnessConfig(max_steps=4, snapshot_every_step=True),
    )
    assert traj.outcome is Outcome.unresolved and traj.reward == 0.0, (traj.outcome, traj.outcome_reason)
    observation = traj.steps[3]
    assert observation.sandbox_state_id is None and "could not be saved" in observation.policy_error, observation
    assert traj.steps[1].sandbox_state_id  # the state before the policy acted was saved
    snapshots = sandbox_service.state_dir / "local" / "snapshots"
    assert snapshots.is_dir() and not list(snapshots.glob("*.tmp")), sorted(p.name for p in snapshots.iterdir())
    honest = run_episode(
        task,
        SWERecipe(),
        Script([honest_fix(task), ToolCall(name="submit")]),
        sandbox_client,
        HarnessConfig(max_steps=4, snapshot_every_step=True),
    )
    assert honest.outcome is Outcome.resolved and all(s.sandbox_state_id for s in honest.steps if s.role == "tool")


def test_verify_outside_run_episode_gives_the_same_verdict(sandbox_client, task):
    """A package that, at import, starts a daemon holding every process slot of the clean room and then
    leaves no answer: `recipe.verify` called directly (task checks, benchmarks) reported the failed clean
    room probe as infrastructure, where `run_episode` found the policy's failure."""
    recipe = SWERecipe()
    package = task.metadata["fix"]["path"].split("/")[0]
    payload = PID_HOG + "os._exit(3)\n"
    plant = f"cat >> {package}/__init__.py <<'EOF'\n{payload}EOF"
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)
        try:
            assert sandbox.exec(["bash", "-c", plant], cwd=task.environment.workdir).ok
            direct = recipe.verify(sandbox.verifying(), task, None)
        finally:
            recipe.release(sandbox)
    assert direct.infra_error is None and not direct.resolved, (direct.infra_error, direct.reason)
    traj = run_episode(
        task, recipe, Script([bash(plant), ToolCall(name="submit")]), sandbox_client, HarnessConfig(max_steps=4)
    )
    assert traj.outcome is Outcome.unresolved and traj.status is EpisodeStatus.completed, traj.outcome_reason


# -- GUI ---------------------------------------------------------------------------------------------------
def test_gui_text_too_long_for_one_argv_is_the_policys_error(sandbox_client):
    recipe = get_recipe("gui", families=("info_lookup",))
    task = recipe.tasks("heldout", 1)[0]
    calls = [
        ToolCall(name="type", arguments={"element_id": 1, "text": "x" * LONG}),
        ToolCall(name="read_page", arguments={}),
        answer(str(task.verifier.expected["answer"])),
    ]
    traj = run_episode(task, recipe, Script(calls), sandbox_client, HarnessConfig(max_steps=5))
    assert traj.outcome is Outcome.resolved and traj.reward == 1.0, (traj.outcome, traj.outcome_reason)
    assert traj.steps[3].policy_error and traj.steps[3].content.startswith("Error"), traj.steps[3]
    assert "at most 10000 characters" in traj.steps[3].content  # the tool spec's bound, before anything runs
    assert "URL:" in traj.steps[5].content  # the browser still answers


def test_a_gui_request_longer_than_one_argv_string_reaches_the_browser(sandbox_client):
    """The recipe sends each request to the controller on stdin, so its size is never argv's 128 KiB (the
    harness's bound on typed text is the policy-facing limit; this is the transport under it)."""
    recipe = get_recipe("gui", families=("info_lookup",))
    task = recipe.tasks("heldout", 1)[0]
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)
        result = recipe.execute_tool(
            sandbox, task, ToolCall(name="type", arguments={"element_id": 99_999, "text": "x" * LONG})
        )
    assert result.infra_error is None and "no element [99999]" in (result.policy_error or ""), result
