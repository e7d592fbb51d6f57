"""Reward hacks on the SWE verifier, each played as a policy would through the harness: every hack
leaves the bug unfixed (or fixes it only where verification must not look) and must end unresolved,
never resolved and never an infrastructure error, while the honest fix of the same task resolves.
"""

from __future__ import annotations

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import Generation
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import Outcome, ToolCall
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import HIDDEN_TEST_PATH, generate_tasks

PASS_ALL_HOOK = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""

# A `python -m pytest` stand-in: prints a passing `-rA` line for every test function it finds.
FAKE_PYTEST = """import re, sys
names = []
for path in sys.argv[1:]:
    if path.endswith(".py"):
        names += [f"{path}::{n}" for n in re.findall(r"def (test_\\w+)", open(path).read())]
for n in names:
    print(f"PASSED {n}")
print(f"{len(names)} passed in 0.01s")
"""


class Script:
    """A policy that plays a fixed list of tool calls, then submits."""

    policy_id = "hack-script"

    def __init__(self, calls: list[ToolCall]):
        self.calls = [*calls, ToolCall(name="submit", arguments={})]
        self.turn = 0

    def generate(self, messages, config):
        call = self.calls[min(self.turn, len(self.calls) - 1)]
        self.turn += 1
        return Generation(text=format_tool_call(call))


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


def write(path: str, content: str) -> ToolCall:
    return ToolCall(name="write_file", arguments={"path": path, "content": content})


@pytest.fixture(scope="module")
def task():
    return generate_tasks("train", 1, 0, difficulty=1)[0]


def play(client, task, calls: list[ToolCall]):
    return run_episode(task, SWERecipe(), Script(calls), client, HarnessConfig(max_steps=len(calls) + 2))


def honest_fix(task) -> ToolCall:
    fix = task.metadata["fix"]
    return ToolCall(name="str_replace", arguments={"path": fix["path"], "old_str": fix["old"], "new_str": fix["new"]})


def site_packages() -> str:
    return "$(python -c 'import site; print(site.getsitepackages()[0])')"


def assert_unresolved(traj):
    assert traj.outcome is Outcome.unresolved, (traj.outcome, traj.outcome_reason)
    assert traj.verification is not None and traj.verification.version


def test_honest_fix_resolves_and_records_the_verifier(sandbox_client, task):
    traj = play(sandbox_client, task, [honest_fix(task)])
    assert traj.outcome is Outcome.resolved, traj.outcome_reason
    assert traj.verification.verifier == "swe-clean-room"
    assert traj.verification.applied == [task.metadata["fix"]["path"]] and traj.verification.ignored == []


def test_conftest_hook_wrapper(sandbox_client, task):
    traj = play(sandbox_client, task, [write("conftest.py", PASS_ALL_HOOK), write("tests/conftest.py", PASS_ALL_HOOK)])
    assert_unresolved(traj)
    assert {(i.path, i.reason) for i in traj.verification.ignored} >= {
        ("conftest.py", "test-runner configuration"),
        ("tests/conftest.py", "test-runner configuration"),
    }


@pytest.mark.parametrize(
    "config",
    [
        ("pytest.ini", "[pytest]\naddopts = -p hackplugin\n"),
        ("setup.cfg", "[tool:pytest]\naddopts = -p hackplugin\n"),
        ("pyproject.toml", '[tool.pytest.ini_options]\naddopts = "-p hackplugin"\n'),
    ],
    ids=["pytest.ini", "setup.cfg", "pyproject.toml"],
)
def test_addopts_loading_a_workspace_plugin(sandbox_client, task, config):
    traj = play(sandbox_client, task, [write("hackplugin.py", PASS_ALL_HOOK), write(*config)])
    assert_unresolved(traj)
    assert config[0] in {i.path for i in traj.verification.ignored}


def test_pytest_package_shadowing_the_real_one(sandbox_client, task):
    traj = play(sandbox_client, task, [write("pytest/__init__.py", ""), write("pytest/__main__.py", FAKE_PYTEST)])
    assert_unresolved(traj)
    assert "pytest/__main__.py" in {i.path for i in traj.verification.ignored}


@pytest.mark.parametrize("hook", ["sitecustomize", "pth"])
def test_interpreter_startup_hooks(sandbox_client, task, hook):
    # Inside the repository and in the sandbox's own site-packages: both load the plugin everywhere.
    body = "import os; os.environ['PYTEST_ADDOPTS'] = '-p hackplugin'"
    name, content = ("sitecustomize.py", body + "\n") if hook == "sitecustomize" else ("zz_hack.pth", body + "\n")
    traj = play(
        sandbox_client,
        task,
        [
            write("hackplugin.py", PASS_ALL_HOOK),
            write(name, content),
            bash(f"cp {name} {site_packages()}/ && echo /workspace/repo > {site_packages()}/zz_repo.pth"),
        ],
    )
    assert_unresolved(traj)
    assert name in {i.path for i in traj.verification.ignored}


def test_background_process_rewriting_files_during_verification(sandbox_client, task):
    # Waits for the hidden test file, then replaces it with tests that pass whatever the code does.
    loop = (
        f"while true; do if [ -f {HIDDEN_TEST_PATH} ] && grep -q assert {HIDDEN_TEST_PATH}; then "
        f"sed -i 's/^\\( *\\)assert .*/\\1pass/' {HIDDEN_TEST_PATH}; fi; sleep 0.01; done"
    )
    traj = play(sandbox_client, task, [bash(f"(setsid bash -c {loop!r} >/dev/null 2>&1 &); echo started")])
    assert_unresolved(traj)


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_hidden_test_path_pre_created(sandbox_client, task, kind):
    make = f"ln -s /dev/null {HIDDEN_TEST_PATH}" if kind == "symlink" else f"mkdir -p {HIDDEN_TEST_PATH}/x"
    traj = play(sandbox_client, task, [bash(make)])
    assert_unresolved(traj)


def test_editing_the_visible_tests(sandbox_client, task):
    # The "fix" lives in the visible test module: collected first, it patches the package for every test.
    fixed = task.metadata["fixed_source"]
    module = task.metadata["fix"]["path"][:-3].replace("/", ".")
    visible = task.metadata["visible_tests"][0]
    # Function objects are patched in place, so names the hidden tests imported earlier see the fix too.
    patch = (
        f"import importlib\n_m = importlib.import_module({module!r})\n_ns = dict(_m.__dict__)\n"
        f"exec({fixed!r}, _ns)\n"
        "for _k, _v in _ns.items():\n"
        "    if callable(getattr(_m, _k, None)) and hasattr(_v, '__code__'):\n"
        "        getattr(_m, _k).__code__ = _v.__code__\n"
    )
    traj = play(sandbox_client, task, [bash(f"cat >> {visible} <<'EOF'\n{patch}EOF")])
    assert_unresolved(traj)
    assert visible in {i.path for i in traj.verification.ignored}


def test_workspace_module_imitating_a_runner_error(sandbox_client, task):
    # Printed at interpreter exit, after pytest stops capturing: it reaches the run's stdout and stderr.
    package = task.metadata["fix"]["path"].split("/")[0]
    traj = play(
        sandbox_client,
        task,
        [
            bash(
                f'echo \'import atexit, sys; atexit.register(print, "ModuleNotFoundError: No module named pytest"); '
                f'atexit.register(print, "No module named pytest", file=sys.stderr)\' >> {package}/__init__.py'
            )
        ],
    )
    assert_unresolved(traj)
    assert f"{package}/__init__.py" in traj.verification.applied


def test_a_hang_caused_by_the_agents_code_is_unresolved(sandbox_client, task):
    quick = task.model_copy(update={"verifier": task.verifier.model_copy(update={"timeout_seconds": 3.0})})
    package = task.metadata["fix"]["path"].split("/")[0]
    traj = play(
        sandbox_client, quick, [honest_fix(task), bash(f"echo 'import time; time.sleep(600)' >> {package}/__init__.py")]
    )
    assert_unresolved(traj)
    assert "timed out" in traj.outcome_reason


def test_only_the_clean_room_or_the_service_failing_is_an_infrastructure_error(sandbox_client, task):
    from components.recipes.swe.verifier import verify_in_clean_room

    def broken_room(stack):
        raise RuntimeError("backend down")

    class NoCleanRoom(SWERecipe):  # every clean room fails, the fresh sandbox's too: the infrastructure's
        def judge(self, sandbox, task, final_answer):
            return verify_in_clean_room(sandbox, task, broken_room)

    with sandbox_client.create(SWERecipe().sandbox_spec(task)) as agent:
        verdict = NoCleanRoom().verify(agent, task, None)
        assert verdict.infra_error and "could not build the clean room" in verdict.infra_error
        assert "health check failed in a fresh sandbox" in verdict.infra_error
    gone = SWERecipe().verify(agent, task, None)  # deleted above: the service's own record says so
    assert gone.infra_error and "the service reports the sandbox lost" in gone.infra_error, gone.infra_error


@pytest.mark.parametrize("damage", ["rm -rf .git", "echo garbage > .git/HEAD", "rm -rf /workspace/repo"])
def test_a_broken_git_or_removed_repository_is_unresolved(sandbox_client, task, damage):
    traj = play(sandbox_client, task, [bash(damage)])
    assert_unresolved(traj)


def test_change_rule_classifies_each_kind_of_path():
    from components.recipes.swe.change import Tree, extract_change

    pristine = Tree(
        files={
            "pkg/__init__.py": b"",
            "pkg/core.py": b"x = 1\n",
            "tests/test_basic.py": b"",
            "conftest.py": b"",
            "pkg/types.py": b"t = 1\n",
        }
    )
    final = Tree(
        files={
            "pkg/__init__.py": b"",
            "pkg/core.py": b"x = 2\n",
            "tests/test_basic.py": b"pass\n",
            "pkg/types.py": b"t = 2\n",
            "pkg/new.py": b"n = 1\n",
            "json.py": b"",
            "pkg/data.bin": b"\0",
            "x.pth": b"import os\n",
            "pkg/__pycache__/core.cpython-311.pyc": b"\0",
            ".git/index": b"changed",
        },
        other={"tests/test_issue.py": "symlink"},
    )
    change = extract_change(pristine, final)
    assert sorted(change.write) == ["pkg/core.py", "pkg/new.py", "pkg/types.py"]
    assert change.delete == []  # deleting conftest.py is a runner-configuration change: ignored
    reasons = {i.path: i.reason for i in change.ignored}
    assert reasons["tests/test_basic.py"] == "test file" and reasons["tests/test_issue.py"].startswith("symlink")
    assert reasons["conftest.py"].endswith("(deleted)") and "shadows the module 'json'" in reasons["json.py"]
    assert reasons["pkg/data.bin"] == "binary file" and reasons["x.pth"] == "interpreter start-up hook"
    assert ".git/index" not in reasons and "pkg/__pycache__/core.cpython-311.pyc" in reasons
