"""The generated SWE suite: determinism, splits, solvability in real sandboxes, hidden tests stay hidden."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from components.core.policy.base import ChatMessage, GenerationConfig
from components.core.rendering.protocol import ToolCallParseError, format_tool_call, parse_tool_call
from components.core.data.schema import ToolCall
from components.recipes.swe import SWERecipe
from components.recipes.swe.checks import check_task, verify_with_patch
from components.recipes.swe.generator import HIDDEN_TEST_PATH, generate_tasks
from components.recipes.swe.teacher import ScriptedTeacher
from components.recipes.swe.templates import FAMILIES


def test_generation_is_deterministic_and_seeds_differ():
    assert generate_tasks("train", 20, 3, difficulty=[1, 2, 3]) == generate_tasks("train", 20, 3, difficulty=[1, 2, 3])
    a = {t.id for t in generate_tasks("train", 50, 0)}
    assert len(a) == 50
    assert not a & {t.id for t in generate_tasks("train", 50, 1)}
    assert not a & {t.id for t in generate_tasks("heldout", 50, 0)}


def test_family_split_keeps_heldout_families_out_of_train():
    held = ("wrong_return", "inverted_condition")
    train = generate_tasks("train", 120, 0, heldout_families=held)
    heldout = generate_tasks("heldout", 40, 0, heldout_families=held)
    assert {t.family for t in train} == set(FAMILIES) - set(held)
    assert {t.family for t in heldout} == set(held)
    with pytest.raises(ValueError, match="unknown bug families"):
        generate_tasks("train", 1, heldout_families=("nope",))


def test_families_narrow_both_splits():
    pool = ("wrong_operator", "inverted_condition")
    assert {t.family for t in generate_tasks("train", 40, 0, families=pool)} == set(pool)
    assert {t.family for t in generate_tasks("heldout", 20, 0, families=pool)} == set(pool)
    train = generate_tasks("train", 40, 0, families=pool, heldout_families=("inverted_condition",))
    assert {t.family for t in train} == {"wrong_operator"}
    with pytest.raises(ValueError, match="unknown bug families"):
        generate_tasks("train", 1, families=("nope",))


def test_packages_narrow_the_repository_names():
    tasks = generate_tasks("heldout", 20, 0, packages=("mathkit", "listutil"))
    assert {t.metadata["package"] for t in tasks} == {"mathkit", "listutil"}
    assert all(t.metadata["fix"]["path"].startswith(t.metadata["package"] + "/") for t in tasks)
    with pytest.raises(ValueError, match="identifiers"):
        generate_tasks("train", 1, packages=("not a name",))


def test_level_one_is_small_and_names_the_function_precisely():
    for task in generate_tasks("train", 60, 0, difficulty=1):
        visible = "".join(task.environment.files.values())
        assert len(task.prompt) + len(visible) < 900, task.id  # a few hundred tokens
        assert task.metadata["function"] in task.prompt and task.metadata["fix"]["path"] in task.prompt
        assert task.metadata["example"]["want"] in task.prompt
        assert HIDDEN_TEST_PATH not in task.environment.files
        assert task.metadata["fix"]["old"] in task.environment.files[task.metadata["fix"]["path"]]


def test_higher_levels_add_files_and_distractors():
    l3 = generate_tasks("train", 10, 0, difficulty=3)
    assert all(len(t.environment.files) >= 5 for t in l3)
    assert all(t.metadata["fix"]["path"] not in t.prompt for t in l3)


def test_sample_is_solvable_and_not_trivially_solved_in_sandboxes(sandbox_client):
    # Levels 1 and 3 here (level 2's unfixed repo is checked below); every template x level: the slow test.
    recipe = SWERecipe()
    for task in generate_tasks("train", 1, 11, difficulty=1) + generate_tasks("train", 1, 11, difficulty=3):
        check = check_task(recipe, task, sandbox_client)
        assert check.ok, check


def test_hidden_tests_are_invisible_before_submit(sandbox_client):
    recipe = SWERecipe()
    task = generate_tasks("train", 1, 5, difficulty=2)[0]
    hidden = task.verifier.hidden_files[HIDDEN_TEST_PATH]
    probe = hidden.splitlines()[3].strip()  # an assertion line of the hidden test
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)
        listing = recipe.execute_tool(
            sandbox,
            task,
            ToolCall(
                name="bash",
                arguments={"command": "find /workspace /tmp /root -name 'test_issue*' 2>/dev/null; ls -R /workspace"},
            ),
        )
        assert "test_issue" not in listing.output and "test_basic.py" in listing.output
        grep = recipe.execute_tool(
            sandbox, task, ToolCall(name="bash", arguments={"command": f"grep -rF {probe!r} /workspace; echo done"})
        )
        assert probe not in grep.output and "done" in grep.output, grep.output
        verdict = recipe.verify(sandbox, task, None)
        assert not verdict.resolved and "FAIL_TO_PASS" in verdict.reason


def test_setup_makes_its_workdir_and_a_git_baseline_without_templates(sandbox_client):
    """Set-up makes a workdir nothing was uploaded to and commits what it placed in a repository without
    git's template, so a download of the workdir carries no sample hooks."""
    recipe = SWERecipe()
    task = generate_tasks("train", 1, 5)[0]
    empty = task.model_copy(
        update={"environment": task.environment.model_copy(update={"workdir": "/workspace/new dir", "files": {}})}
    )
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        for each in (task, empty):
            recipe.setup(sandbox, each)
            script = 'test -z "$(git status --porcelain)" && git rev-list --count HEAD && ls -A .git && git ls-files'
            git = sandbox.exec(["bash", "-c", script], cwd=each.environment.workdir)
            assert git.ok, git.stdout + git.stderr  # everything placed is committed
            commits, *listed = git.stdout.split()
            assert commits == "1" and "hooks" not in listed and "description" not in listed, git.stdout
            assert set(each.environment.files) <= set(listed)
            exclude = sandbox.exec(["cat", ".git/info/exclude"], cwd=each.environment.workdir).stdout
            assert "__pycache__/" in exclude and "*.pyc" in exclude
            recipe.release(sandbox)


def test_tools_report_policy_errors_as_observations(sandbox_client):
    recipe = SWERecipe(tool_timeout_seconds=2)
    task = generate_tasks("train", 1, 0)[0]
    path = task.metadata["fix"]["path"]
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)

        def run(name, **args):
            return recipe.execute_tool(sandbox, task, ToolCall(name=name, arguments=args))

        assert run("read_file", path="missing.py").policy_error.startswith("no such file")
        assert "not found" in run("str_replace", path=path, old_str="zzz", new_str="y").policy_error
        assert "occurs" in run("str_replace", path=path, old_str="(", new_str="[").policy_error
        assert run("nope").policy_error.startswith("unknown tool")
        assert "required" in run("bash").policy_error
        slow = run("bash", command="sleep 10")
        assert slow.policy_error == "command timed out" and slow.infra_error is None
        assert run("bash", command="exit 3").output.endswith("[exit code 3]")
        assert run("write_file", path="pkg2/new.py", content="x = 1\n").policy_error is None
        fix = task.metadata["fix"]
        assert run("str_replace", path=path, old_str=fix["old"], new_str=fix["new"]).output == f"Edited {path}."
        submitted = run("submit")
        assert submitted.submitted and "+x = 1" in submitted.final_answer
        assert f"+{fix['new']}" in submitted.final_answer and "__pycache__" not in submitted.final_answer
        assert recipe.verify(sandbox, task, submitted.final_answer).resolved


@pytest.mark.slow
def test_every_family_and_level_in_sandboxes(sandbox_client):
    recipe = SWERecipe()
    seen = {}
    for level in (1, 2, 3):
        for task in generate_tasks("train", 60, 0, difficulty=level):
            seen.setdefault((task.metadata["template"], level), task)
    assert {(f, lvl) for f, lvl in itertools.product(FAMILIES, (1, 2, 3))} <= {
        (t.family, t.difficulty) for t in seen.values()
    }
    bad = [check for check in (check_task(recipe, t, sandbox_client) for t in seen.values()) if not check.ok]
    assert not bad, bad


# -- the scripted teacher's decisions (pure: from the conversation alone) ----------------------
def _conversation(task, *pairs):
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content=task.prompt)]
    for call, observation in pairs:
        messages += [
            ChatMessage(role="assistant", content=format_tool_call(call)),
            ChatMessage(role="tool", content=observation),
        ]
    return messages


def test_teacher_continues_from_any_prefix():
    task = generate_tasks("train", 1, 0)[0]
    fix = task.metadata["fix"]
    source = task.environment.files[fix["path"]]
    teacher = ScriptedTeacher(error_rate=0.0)
    teacher.reset(task)

    def next_call(*pairs):
        return parse_tool_call(teacher.generate(_conversation(task, *pairs), GenerationConfig()).text)

    ls = next_call()
    assert ls.name == "bash" and ls.arguments["command"].startswith("find")
    read = next_call((ls, "./x.py"))
    assert read.name == "read_file" and read.arguments["path"] == fix["path"]
    tests = next_call((ls, "x"), (read, source))
    assert tests.arguments == {"command": "python -m pytest -q"}
    edit = next_call((ls, "x"), (read, source), (tests, "1 passed"))
    assert edit.arguments == {"path": fix["path"], "old_str": fix["old"], "new_str": fix["new"]}
    done = [(ls, "x"), (read, source), (tests, "1 passed"), (edit, "Edited.")]
    assert next_call(*done).arguments == {"command": "python -m pytest -q"}
    assert next_call(*done, (tests, "1 passed")).name == "submit"
    assert next_call(*done[:3], (edit, "Error: old_str not found")).name == "str_replace"  # a failed edit is redone

    # A foreign prefix left a wrong line: the teacher tests, then repairs exactly that line.
    wrong = ToolCall(
        name="write_file", arguments={"path": fix["path"], "content": source.replace(fix["old"], fix["wrong"][0])}
    )
    assert next_call((ls, "x"), (wrong, "Wrote.")).name == "bash"
    repair = next_call((ls, "x"), (wrong, "Wrote."), (tests, "1 passed"))
    assert repair.arguments == {"path": fix["path"], "old_str": fix["wrong"][0], "new_str": fix["new"]}
    # A shell command that may have changed the file makes it read the file again.
    sed = ToolCall(name="bash", arguments={"command": "sed -i s/a/b/ x.py"})
    assert next_call((ls, "x"), (read, source), (sed, "")).name == "read_file"
    # A malformed turn in the prefix is simply followed by a valid call.
    messages = _conversation(task, (ls, "x")) + [
        ChatMessage(role="assistant", content="<tool_call>{oops"),
        ChatMessage(role="tool", content="Error: not valid JSON"),
    ]
    assert parse_tool_call(teacher.generate(messages, GenerationConfig()).text).name == "read_file"


def test_teacher_mistake_rates_follow_error_rate():
    task = generate_tasks("train", 1, 0)[0]
    fix = task.metadata["fix"]
    source = task.environment.files[fix["path"]]
    ls = ToolCall(name="bash", arguments={"command": "ls"})
    read = ToolCall(name="read_file", arguments={"path": fix["path"]})
    tests = ToolCall(name="bash", arguments={"command": "python -m pytest -q"})
    state = _conversation(task, (ls, "x"), (read, source), (tests, "1 passed"))
    choices = Counter()
    teacher = ScriptedTeacher(error_rate=0.3, seed=7)
    for _ in range(400):
        teacher.reset(task)  # a fresh random stream per episode: continuations differ
        text = teacher.generate(state, GenerationConfig()).text
        try:
            call = parse_tool_call(text)
        except ToolCallParseError:
            choices["malformed"] += 1
            continue
        choices[
            "giveup" if call.name == "submit" else "right" if call.arguments.get("new_str") == fix["new"] else "wrong"
        ] += 1
    assert 0.08 < choices["giveup"] / 400 < 0.24 and 0.2 < choices["wrong"] / 400 < 0.42
    assert choices["right"] / 400 > 0.4
    assert choices["malformed"] == 0  # strategic mistakes only: a malformed call is nothing to imitate
    # Before reading the target, it sometimes opens another source file of the listing first.
    listing = "\n".join(sorted(task.environment.files))
    start = _conversation(task, (ToolCall(name="bash", arguments={"command": "find . -name '*.py' | sort"}), listing))
    opened = Counter()
    for _ in range(400):
        teacher.reset(task)
        opened[parse_tool_call(teacher.generate(start, GenerationConfig()).text).arguments["path"]] += 1
    wrong_file = sum(n for p, n in opened.items() if p != fix["path"])
    assert 0.08 < wrong_file / 400 < 0.24 and opened[fix["path"]] > wrong_file
    assert all("test" not in p for p in opened)
    with pytest.raises(ValueError, match="no reference fix"):
        ScriptedTeacher().reset(task.model_copy(update={"metadata": {}}))


def _hidden_passing(task, sources: dict[str, str]) -> list[bool]:
    """Which hidden assertions hold with the package modules given as sources (run in-process)."""
    import types

    pkg = task.metadata["package"]
    modules = {}
    for path, source in sources.items():
        module = types.ModuleType(f"{pkg}.{path.split('/')[-1][:-3]}")
        exec(source, module.__dict__)  # our own generated code, never user input
        modules[path.split("/")[-1][:-3]] = module
    out = []
    for line in task.verifier.hidden_files[HIDDEN_TEST_PATH].splitlines():
        if line.strip().startswith("assert "):
            ns = {name: getattr(m, name) for m in modules.values() for name in dir(m) if not name.startswith("_")}
            try:
                out.append(bool(eval(line.strip()[len("assert ") :], ns)))
            except Exception:
                out.append(False)
    return out


def test_two_bug_tasks_hold_partial_progress():
    for task in generate_tasks("train", 6, 5, difficulty=[1, 3], bugs=2):
        fixes, owner = task.metadata["fixes"], task.metadata["hidden_test_bug"]
        assert len(fixes) == 2 and set(owner) == {0, 1} and "Two problems" in task.prompt
        assert fixes[0]["function"] != fixes[1]["function"]
        if task.difficulty == 3:  # a multi-file fix
            assert fixes[0]["path"] != fixes[1]["path"]
        given = {p: task.environment.files[p] for p in task.metadata["fixed_sources"]}
        before = _hidden_passing(task, given)
        for k in (0, 1):  # each bug is caught by its own hidden tests
            assert not all(ok for ok, o in zip(before, owner) if o == k)
        assert all(_hidden_passing(task, task.metadata["fixed_sources"]))
        # Fixing only the first bug passes all of its hidden tests and changes none of the second's.
        half = dict(given)
        half[fixes[0]["path"]] = half[fixes[0]["path"]].replace(fixes[0]["old"], fixes[0]["new"], 1)
        after = _hidden_passing(task, half)
        assert [ok for ok, o in zip(after, owner) if o == 0] == [True] * owner.count(0)
        assert [ok for ok, o in zip(after, owner) if o == 1] == [ok for ok, o in zip(before, owner) if o == 1]
        assert sum(before) < sum(after) < len(after)  # partial progress, measurable
    one = generate_tasks("train", 3, 5)
    assert all(len(t.metadata["fixes"]) == 1 for t in one)
    with pytest.raises(ValueError, match="1 or 2"):
        generate_tasks("train", 1, 0, bugs=3)


def test_teacher_fixes_both_bugs_in_sandboxes(sandbox_client):
    from components.core.episode.harness import HarnessConfig, run_episode

    recipe = SWERecipe(difficulty=[1, 3], bugs=2)
    for task in recipe.tasks("train", 2, 9):
        assert check_task(recipe, task, sandbox_client).ok
        traj = run_episode(task, recipe, ScriptedTeacher(error_rate=0.0), sandbox_client, HarnessConfig(max_steps=14))
        assert traj.resolved, (task.id, [s.content[:80] for s in traj.steps])
        edits = [s.tool_call.arguments["path"] for s in traj.steps if s.tool_call and s.tool_call.name == "str_replace"]
        assert sorted(edits) == sorted(f["path"] for f in task.metadata["fixes"])


def test_the_verdict_records_the_share_of_hidden_tests_passing(sandbox_client):
    from components.recipes.swe.generator import unified_diff

    recipe = SWERecipe(bugs=2)
    task = recipe.tasks("train", 1, 5)[0]
    fix = task.metadata["fixes"][0]
    before = task.environment.files[fix["path"]]
    half = unified_diff(fix["path"], before, before.replace(fix["old"], fix["new"], 1))
    owner = task.metadata["hidden_test_bug"]
    verdict = verify_with_patch(recipe, task, sandbox_client, half)
    assert not verdict.resolved and verdict.report.hidden_total == len(owner)
    assert verdict.report.hidden_passed >= owner.count(0) and 0 < verdict.report.hidden_pass_fraction < 1
    full = verify_with_patch(recipe, task, sandbox_client, task.reference_solution)
    assert full.resolved and full.report.hidden_pass_fraction == 1.0
