"""SWE-bench-format import: a tiny instance built here (a real git repo), verified in real sandboxes."""

from __future__ import annotations

import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.data.schema import ToolCall
from components.recipes.swe import SWERecipe
from components.recipes.swe.checks import check_task
from components.recipes.swe.swebench import SWEBenchImportError, import_swebench

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = BUGGY.replace("return a - b\n\n\n", "return a + b\n\n\n", 1)
TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def git(cwd, *args) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def instance(tmp_path):
    repo = tmp_path / "repos" / "acme__calc"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
    )
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text(FIXED)
    patch = git(repo, "diff")
    (repo / "tests" / "test_add.py").write_text(TEST_ADD)
    git(repo, "add", "tests/test_add.py")
    test_patch = git(repo, "diff", "--cached", "--", "tests")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fix add (the future the agent must not see)")
    inst = {
        "instance_id": "acme__calc-1",
        "repo": "acme/calc",
        "base_commit": base,
        "problem_statement": "add(2, 3) returns -1; it should return 5.",
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_add.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_sub"]),
        "version": "0.1",
    }
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(inst) + "\n")
    return path, tmp_path / "repos", inst


def test_import_from_jsonl_and_parquet(instance, tmp_path):
    path, repos, inst = instance
    (task,) = import_swebench(path, repos)
    assert task.id == "acme__calc-1" and task.split == "heldout"
    assert task.verifier.fail_to_pass == ["tests/test_add.py::test_add"]
    assert task.environment.base_commit == inst["base_commit"] and task.reference_solution == inst["patch"]
    pq.write_table(pa.Table.from_pylist([inst]), tmp_path / "inst.parquet")
    assert import_swebench(tmp_path / "inst.parquet", repos) == [task]


def test_import_errors_say_what_is_missing(instance, tmp_path):
    path, _, inst = instance
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(SWEBenchImportError, match=f"{path}:1: acme__calc-1: no git checkout of acme/calc"):
        import_swebench(path, tmp_path / "elsewhere")
    with pytest.raises(SWEBenchImportError, match="repos_dir .*nowhere is not a directory"):
        import_swebench(path, tmp_path / "nowhere")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n" + json.dumps({k: v for k, v in inst.items() if k != "test_patch"}) + "\n")
    with pytest.raises(SWEBenchImportError, match=f"{bad}:2: acme__calc-1: missing fields \\['test_patch'\\]"):
        import_swebench(bad, tmp_path / "repos")
    bad.write_text(json.dumps(inst)[:120] + "\n")
    with pytest.raises(SWEBenchImportError, match=f"{bad}:1: not valid JSON \\(Unterminated string starting at column"):
        import_swebench(bad, tmp_path / "repos")
    bad.write_text(json.dumps({**inst, "base_commit": "f" * 40}) + "\n")
    with pytest.raises(SWEBenchImportError, match=f"{bad}:1: base_commit f{{40}} is not a commit of"):
        import_swebench(bad, tmp_path / "repos")
    listed = tmp_path / "bad.json"
    listed.write_text(json.dumps([inst, ["not", "an", "object"]]))
    with pytest.raises(SWEBenchImportError, match=r"bad.json\[1\]: an instance must be a JSON object, got list"):
        import_swebench(listed, tmp_path / "repos")


def test_imported_instance_verifies_in_sandboxes(instance, sandbox_client):
    path, repos, _ = instance
    (task,) = import_swebench(path, repos)
    recipe = SWERecipe()
    check = check_task(recipe, task, sandbox_client)
    assert check.ok, check
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)
        seen = recipe.execute_tool(
            sandbox,
            task,
            ToolCall(name="bash", arguments={"command": "cat calc.py; git log --all --oneline | wc -l; ls tests"}),
        )
        assert "return a - b\n\n\ndef sub" in seen.output  # the base commit's tree ...
        assert "\n1\n" in seen.output and "test_add" not in seen.output  # ... one commit, no future, no test patch


def test_provision_reads_a_swebench_file_as_its_task_source(instance, tmp_path):
    from components.core.data.parquet_store import TaskStore
    from components.provision import ProvisionConfig, ProvisionError, TaskSource, provision_environment

    path, repos, inst = instance
    source = TaskSource(kind="swebench", path=str(path), repos_dir=str(repos))
    result = provision_environment(
        ProvisionConfig(source=source, n_train=0, n_heldout=5, check_sandbox=False), tmp_path / "tasks"
    )
    assert result.counts == {"train": 0, "validation": 0, "heldout": 1}
    assert result.units == {"train": 0, "validation": 0, "heldout": 1}
    (task,) = TaskStore(tmp_path / "tasks").read(split="heldout")
    assert task.id == "acme__calc-1" and task.reference_solution == inst["patch"] and task.unit == "acme/calc"
    train = provision_environment(
        ProvisionConfig(source=source, n_train=1, n_heldout=1, check_sandbox=False), tmp_path / "train-tasks"
    )
    assert train.counts == {"train": 1, "validation": 0, "heldout": 0}
    with pytest.raises(ValueError, match="needs path"):
        TaskSource(kind="swebench")
    with pytest.raises(ProvisionError, match="split in order"):
        provision_environment(
            ProvisionConfig(source=source, heldout_families=["off_by_one"], check_sandbox=False), tmp_path / "t4"
        )
    with pytest.raises(ProvisionError, match="cannot import"):
        provision_environment(
            ProvisionConfig(
                source=TaskSource(kind="swebench", path=str(path), repos_dir=str(tmp_path / "none")),
                check_sandbox=False,
            ),
            tmp_path / "t3",
        )


def test_an_imported_heldout_instance_that_repeats_a_training_one_is_dropped_and_repositories_are_the_units(
    instance, tmp_path
):
    """The same repository, commit and issue text under another id is the same task: it may not be held out
    when it was trained on, nor held out twice; instances of one repository count as one unit."""
    from components.core.data.parquet_store import TaskStore
    from components.provision import ProvisionConfig, TaskSource, provision_environment

    path, repos, inst = instance
    again = {**inst, "instance_id": "acme__calc-2"}  # sorts after -1: held out, but it is the training task
    twice = {**inst, "instance_id": "acme__calc-3", "problem_statement": "add is wrong."}
    also = {**twice, "instance_id": "acme__calc-4"}  # repeats -3 inside the held-out set
    other = {**inst, "instance_id": "acme__calc-5", "problem_statement": "add(1, 1) returns 0."}
    path.write_text("".join(json.dumps(i) + "\n" for i in (inst, again, twice, also, other)))
    source = TaskSource(kind="swebench", path=str(path), repos_dir=str(repos))
    result = provision_environment(
        ProvisionConfig(source=source, n_train=1, n_heldout=3, n_validation=0, check_sandbox=False), tmp_path / "tasks"
    )
    held = TaskStore(tmp_path / "tasks").read(split="heldout")
    assert sorted(t.id for t in held) == ["acme__calc-3", "acme__calc-5"]
    assert result.metrics["heldout_duplicates_dropped"] == 2
    assert result.counts["heldout"] == 2 and result.units["heldout"] == 1  # one repository


@pytest.mark.parametrize(
    "payload",
    [
        "class _Any:\n    def __eq__(self, other):\n        return True\n\n\ndef add(a, b):\n    return _Any()\n",
        "import linecache, sys\n\n\ndef add(a, b):\n    f = sys._getframe(1)\n"
        "    return eval(linecache.getline(f.f_code.co_filename, f.f_lineno).split('==', 1)[1], f.f_globals)\n",
    ],
    ids=["eq-always-true", "expected-from-the-asserting-line"],
)
def test_generic_forgeries_of_an_imported_instance_are_evident(instance, sandbox_client, payload):
    """The hidden test arrives as the instance's test patch: the canaries' twins are made from the test file
    as the clean room holds it once the patch is applied, and a forged pass of `add` passes its twin too."""
    path, repos, _ = instance
    (task,) = import_swebench(path, repos)
    recipe = SWERecipe()
    with sandbox_client.create(recipe.sandbox_spec(task)) as sandbox:
        recipe.setup(sandbox, task)
        try:
            sandbox.write_file(f"{task.environment.workdir}/calc.py", payload + BUGGY.split("\n\n\n", 1)[1])
            verdict = recipe.verify(sandbox.verifying(), task, None)
        finally:
            recipe.release(sandbox)
    assert not verdict.resolved and verdict.infra_error is None and "tampered" in verdict.reason, verdict
