"""Verify an SWE episode in a clean room, never in the agent's own sandbox.

The rule (verifier `swe-clean-room`, version `VERSION`):

1. The agent's change is taken on the host by comparing its final repository with the pristine one
   (`change.py`, which also lists what is ignored: tests, runner configuration, start-up hooks,
   shadowing modules, binaries, caches, symlinks). Nothing the agent's sandbox computes is trusted. The
   pristine tree is the one kept from the task's set-up (`setups.py`: read before the policy's first
   step) or, when none is kept, read from the clean room.
2. A fresh sandbox is forked from the task's pristine snapshot, or given the kept set-up, or set up anew:
   none of the agent's processes exist there. Only the applied part of the change is written into it,
   then whatever sits at a hidden test path is removed and the hidden tests (or the task's test patch)
   are placed. Generated tasks whose set-up is kept run in a **warm room** instead when one answers
   (`warm_rooms.py`, `warm_worker.py`): a sandbox kept across verifications, none of whose earlier
   verifications left anything (each runs as a uid of its own in a tree made afresh, and every process,
   file and IPC object of that uid is removed after it, or the room is retired); otherwise a clean room.
3. Generated tasks (kind `calls`, `calls.py`): the hidden tests' calls of the package's functions run
   in a worker process in the clean room (`python -I -c`, the request on stdin) or, in a warm room, in a
   fork of the warm worker, that returns typed plain data; the assertions are judged in the host
   process, which never imports the agent's code. A value that is not plain data, an exception, a
   missing answer or a worker that dies fails the test. Imported tasks (kind `pytest`):
   pytest runs as `python -I` (no workspace path before the standard library, no PYTHON* variables,
   no user site), with plugin autoloading off, no cache, `--rootdir` the repository and `-c` a
   configuration file the verifier writes into a fresh `mktemp -d` directory outside the repository;
   the outcome is the JUnit XML report written there, never the run's stdout, and it stands only when
   the canaries planted in the hidden test modules (`canaries.py`) came out as they must.
4. Resolved means every FAIL_TO_PASS and PASS_TO_PASS test passed (with neither listed: at least one
   test ran and none failed; a task `command` decides by its exit code).
5. Outcomes the agent's change can cause (tests failing, a hang until the timeout, a crash) are
   unresolved. A verification that gives no verdict (no report or answer, the agent's workspace that
   cannot be archived or applied, an infrastructure error of a run, a clean room that cannot be built)
   returns `infra_error` unattributed: whose failure it is, the one rule decides
   (`components/core/episode/blame.py`, through `RecipeBase.verify`), never a probe of a sandbox the
   agent's code has run in.

Known limit (imported tasks only): the code under test runs inside the pytest process (as in SWE-bench
harnesses); canaries (`canaries.py`) make generic forgeries evident, and docs/concepts/rewards.md says
what remains possible.
"""

from __future__ import annotations

import random
import shlex
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from components.core.episode.recipe_base import VerifyResult
from components.core.data.schema import Task, TestReport, Verification
from components.recipes.swe import calls, canaries
from components.recipes.swe.change import RepoChange, Tree, extract_change, read_tree
from components.recipes.swe.warm_rooms import WarmRun
from sandbox_service.client import Sandbox
from sandbox_service.errors import SandboxServiceError
from sandbox_service.models import ExecOutcome

NAME = "swe-clean-room"
VERSION = "5"  # 1: hidden tests run in the agent's sandbox, outcome parsed from stdout; 2: pytest for every task;
# 3: imported tasks' canaries in a module of their own, no-verdict runs blamed by a control run of the same tests;
# 4: canaries inside the hidden modules, the one blame rule; 5: generated tasks' call worker in warm rooms
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class _Infra(Exception):
    """The clean room or the service failed: an infrastructure error, never the policy's outcome."""


def _test_files(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(node.split("::", 1)[0] for node in ids))


def junit_key(node_id: str) -> tuple[str, str]:
    """(classname, name) pytest's JUnit report gives the test `node_id` (`a/b.py::Cls::test[x]`)."""
    path, *rest = node_id.split("::")
    module = path[:-3] if path.endswith(".py") else path
    return ".".join([module.replace("/", "."), *rest[:-1]]), rest[-1] if rest else ""


def parse_junit(xml: bytes) -> tuple[dict[tuple[str, str], str], TestReport]:
    """Per-test status (PASSED/FAILED/ERROR/SKIPPED) by JUnit key, and the counts."""
    root = ET.fromstring(xml)
    statuses: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        status = (
            "ERROR"
            if "error" in tags
            else "FAILED"
            if "failure" in tags
            else "SKIPPED"
            if "skipped" in tags
            else "PASSED"
        )
        key = (case.get("classname", ""), case.get("name", ""))
        if statuses.get(key, "PASSED") == "PASSED":  # a teardown error after a pass wins
            statuses[key] = status
    values = list(statuses.values())
    return statuses, TestReport(
        passed=values.count("PASSED"), failed=values.count("FAILED"), errors=values.count("ERROR")
    )


def _checked(result, what: str):
    if result.is_infra_error:
        raise _Infra(f"{what}: {result.infra_error}: {result.message}")
    return result


def _apply(room: Sandbox, workdir: str, change: RepoChange) -> None:
    if change.write:
        with tempfile.TemporaryDirectory() as tmp:
            for rel, data in change.write.items():
                target = Path(tmp) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            room.upload_dir(tmp, workdir)
    if change.delete:
        _checked(room.exec(["rm", "-f", "--", *change.delete], cwd=workdir, timeout=60), "applying deletions")


def _place_tests(room: Sandbox, task: Task, workdir: str) -> str | None:
    """Place the hidden tests over whatever is at their paths; a reason when the test patch does not apply."""
    spec = task.verifier
    targets = {_in_workdir(workdir, rel): content for rel, content in spec.hidden_files.items()}
    if targets:
        script = "; ".join(
            f"rm -rf -- {shlex.quote(t)}; mkdir -p -- {shlex.quote(t.rsplit('/', 1)[0])}" for t in targets
        )
        _checked(room.exec(["bash", "-c", script], timeout=60), "placing hidden tests")
        for target, content in targets.items():
            room.write_file(target, content)
    test_patch = spec.expected.get("test_patch")
    if test_patch:
        applied = room.apply_patch(test_patch, cwd=workdir)
        if not applied.applied:  # the repository as changed by the agent rejects the task's test patch
            return f"the test patch does not apply to the changed repository: {applied.stderr[-500:]}"
    return None


def _pytest_command(vdir: str, workdir: str, targets: list[str]) -> list[str]:
    return [
        "python",
        "-I",
        "-m",
        "pytest",
        "-c",
        f"{vdir}/pytest.ini",
        "--rootdir",
        workdir,
        "-p",
        "no:cacheprovider",
        f"--junitxml={vdir}/report.xml",
        "-q",
        "--tb=short",
        "-rA",
        *targets,
    ]


def _read_report(room: Sandbox, path: str) -> bytes:
    # Through exec, not the file API: the report lives outside the workspace the file API serves.
    res = _checked(room.exec(["cat", "--", path], timeout=60, max_output_bytes=20_000_000), "reading the report")
    if res.exit_code != 0:
        raise FileNotFoundError(f"{path}: {res.stderr.strip()[-200:]}")
    return res.stdout.encode()


WarmWorker = Callable[[RepoChange, str], "WarmRun | None"]  # (the change, the call worker's stdin) -> its run


def verify_in_clean_room(
    agent: Sandbox,
    task: Task,
    open_clean_room: Callable[[ExitStack], Sandbox],
    *,
    pristine: Tree | None = None,
    warm: WarmWorker | None = None,
) -> VerifyResult:
    """Verify the agent's repository (in `agent`) in a clean room `open_clean_room` builds (and registers
    for deletion on the stack) from the task's pristine state.

    `pristine`: the task's pristine tree when the caller has it (read at set-up, before the policy's first
    step); otherwise it is read from the clean room. `warm`: runs the call worker of a generated task in a
    warm room (`warm_rooms.py`) instead, None when it cannot (then a clean room does)."""
    record = Verification(verifier=NAME, version=VERSION)
    try:
        with ExitStack() as stack:
            verdict = _verify(agent, task, _Room(open_clean_room, stack), record, pristine, warm)
    except _Infra as err:
        return VerifyResult(resolved=False, infra_error=str(err), verification=record)
    except (SandboxServiceError, httpx.HTTPError) as err:
        return VerifyResult(resolved=False, infra_error=f"clean room: {type(err).__name__}: {err}", verification=record)
    verdict.verification = record
    return verdict


class _Room:
    """The clean room, built on first use."""

    def __init__(self, build: Callable[[ExitStack], Sandbox], stack: ExitStack):
        self.build, self.stack = build, stack
        self.sandbox: Sandbox | None = None

    def __call__(self) -> Sandbox:
        if self.sandbox is None:
            try:
                self.sandbox = self.build(self.stack)
            except Exception as err:  # the pristine state alone failed to come up: nothing the agent did
                raise _Infra(f"could not build the clean room: {type(err).__name__}: {err}"[:1000]) from err
        return self.sandbox


class _Laps:
    """Records the wall time since the previous lap under each phase's name."""

    def __init__(self, record: Verification):
        self.record, self.last = record, time.monotonic()

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        self.record.seconds[phase] = round(now - self.last, 4)
        self.last = now


def _verify(
    agent: Sandbox, task: Task, room: _Room, record: Verification, pristine: Tree | None, warm: WarmWorker | None
) -> VerifyResult:
    spec, workdir = task.verifier, task.environment.workdir
    lap = _Laps(record)
    if pristine is None:
        pristine = read_tree(room().download_dir(workdir))
        lap("fork")
    try:
        final = read_tree(agent.download_dir(workdir))
    except Exception as err:  # noqa: BLE001 - no verdict: the one rule decides whose (the agent's sandbox lost?)
        raise _Infra(f"the agent's repository could not be archived: {type(err).__name__}: {err}"[:1000]) from err
    change = extract_change(pristine, final)
    lap("diff")
    record.ignored, record.applied = change.ignored, sorted({*change.write, *change.delete})
    run = _run_warm(task, change, warm) if warm is not None and spec.kind == "calls" else None
    if run is not None:
        lap("warm")
    else:
        if room.sandbox is None:
            room()
            lap("fork")
        try:
            _apply(room(), workdir, change)
        except (SandboxServiceError, httpx.HTTPError) as err:  # no verdict: the one rule decides whose
            raise _Infra(
                f"the agent's change could not be applied in the clean room: {type(err).__name__}: {err}"[:1000]
            ) from err
        bad_patch = _place_tests(room(), task, workdir) if spec.kind != "calls" else None
        lap("apply")
        if bad_patch:
            return VerifyResult(resolved=False, reason=bad_patch)
        run = _run_hidden_tests(room(), task)
        lap("run")
    if run.failure is not None:  # no verdict: the one rule decides whose (never a probe of this room)
        raise _Infra(f"running hidden tests gave no verdict: {run.failure}")
    if run.tampered:
        return VerifyResult(resolved=False, report=run.report, reason=run.tampered)
    if run.timed_out:
        return VerifyResult(
            resolved=False, report=run.report, reason=f"hidden tests timed out after {spec.timeout_seconds:g}s"
        )
    if run.exit_ok is not None:  # a task `command` without listed tests: its exit code decides
        return VerifyResult(
            resolved=run.exit_ok, report=run.report, reason=None if run.exit_ok else f"command exited {run.exit_code}"
        )
    report, statuses = run.report, run.statuses
    wanted = list(dict.fromkeys(spec.fail_to_pass + spec.pass_to_pass))
    if not wanted:
        ok = report.passed > 0 and report.failed == report.errors == 0
        return VerifyResult(resolved=ok, report=report, reason=None if ok else f"pytest exited {run.exit_code}")
    got = {node: statuses.get(node, "missing") for node in wanted}
    report.hidden_total = len(spec.fail_to_pass)
    report.hidden_passed = sum(got.get(t) == "PASSED" for t in spec.fail_to_pass)
    not_passed = [t for t in wanted if got[t] != "PASSED"]
    if not_passed:
        kind = "FAIL_TO_PASS" if any(t in spec.fail_to_pass for t in not_passed) else "PASS_TO_PASS"
        detail = ", ".join(f"{t}={got[t]}" for t in not_passed[:5])
        return VerifyResult(
            resolved=False, report=report, reason=f"{len(not_passed)} {kind} tests not passing: {detail}"
        )
    return VerifyResult(resolved=True, report=report)


@dataclass
class _Run:
    """One run of the hidden tests: per-test statuses by node id, or the failure that left no verdict."""

    report: TestReport
    statuses: dict[str, str] = field(default_factory=dict)
    failure: str | None = None  # why the run gave no verdict
    timed_out: bool = False
    exit_code: int | None = None
    exit_ok: bool | None = None
    tampered: str | None = None


def _report_dir(room: Sandbox) -> str:
    made = _checked(room.exec(["mktemp", "-d", "/tmp/orchard-verify.XXXXXXXXXX"], timeout=30), "mktemp")
    vdir = made.stdout.strip()
    if made.exit_code != 0 or not vdir.startswith("/tmp/orchard-verify."):
        raise _Infra(f"could not create the report directory in the clean room: {made.stderr[-300:]}")
    return vdir


def _write_in_room(room: Sandbox, path: str, content: str, what: str) -> None:
    wrote = _checked(room.exec(["bash", "-c", 'cat > "$0"', path], stdin=content, timeout=30), what)
    if wrote.exit_code != 0:
        raise _Infra(f"could not write {what} in the clean room: {wrote.stderr[-300:]}")


def _merged_checks(task: Task) -> calls.Checks:
    try:
        checks = {path: calls.parse_checks(source) for path, source in _test_sources(task).items()}
    except (ValueError, SyntaxError) as err:  # the task's own tests, never the agent's
        raise _Infra(f"the task's hidden tests cannot be judged outside pytest: {err}") from err
    return calls.Checks(
        [i for c in checks.values() for i in c.imports],
        [calls.Check(f"{path}::{t.name}", t.calls, t.assertions) for path, c in checks.items() for t in c.tests],
    )


def _bare_report(task: Task, tail: str, duration: float) -> TestReport:
    # No test seen to pass (timed out, no report) is 0 of the hidden tests: every verified trajectory of a
    # pytest task gets its fraction, so partial-progress means never silently skip the hard failures.
    spec = task.verifier
    none_passed = {"hidden_total": len(spec.fail_to_pass), "hidden_passed": 0} if spec.fail_to_pass else {}
    return TestReport(output=tail, duration_seconds=duration, **none_passed)


def _judged_calls(
    task: Task, merged: calls.Checks, exit_code: int | None, stdout: str, stderr: str, duration: float
) -> _Run:
    """The verdict's statuses from the call worker's answer (a clean room's exec or a warm room's run)."""
    tail = stderr[-4000:]
    statuses = calls.judge(merged, stdout)
    if exit_code != 0 or all(v == "ERROR" for v in statuses.values()):
        return _Run(_bare_report(task, tail, duration), failure=f"no answer: the call worker exited {exit_code}")
    values = list(statuses.values())
    report = TestReport(
        passed=values.count("PASSED"),
        failed=values.count("FAILED"),
        errors=values.count("ERROR"),
        output=tail,
        duration_seconds=duration,
    )
    return _Run(report, statuses=statuses, exit_code=exit_code)


def _run_warm(task: Task, change: RepoChange, warm: WarmWorker) -> _Run | None:
    """The call worker in a warm room; None when no warm room answered (a clean room runs it instead)."""
    merged = _merged_checks(task)
    got = warm(change, calls.worker_request(merged, task.environment.workdir))
    if got is None:
        return None
    if got.timed_out:
        return _Run(_bare_report(task, got.stderr[-4000:], got.seconds), timed_out=True)
    return _judged_calls(task, merged, got.exit_code, got.stdout, got.stderr, got.seconds)


def _run_hidden_tests(room: Sandbox, task: Task) -> _Run:
    """Run the task's hidden tests in `room` (its change already applied) and collect per-test statuses."""
    spec, workdir = task.verifier, task.environment.workdir
    wanted = list(dict.fromkeys(spec.fail_to_pass + spec.pass_to_pass))
    planted: canaries.Canaries | None = None
    if spec.kind == "calls":  # one process: the worker's source as its argument, the request on stdin
        merged = _merged_checks(task)
        command = ["python", "-I", "-c", calls.WORKER]
        stdin = calls.worker_request(merged, workdir)
    else:
        vdir = _report_dir(room)
        # `pythonpath` puts the repository root on sys.path (python -I leaves out the working directory).
        _write_in_room(
            room,
            f"{vdir}/pytest.ini",
            f"[pytest]\npythonpath = {workdir}\njunit_family = xunit2\n",
            "the verifier's pytest.ini",
        )
        if not spec.command:  # canaries drawn now, after the agent's code is frozen, planted in the hidden modules
            planted = canaries.plant(_hidden_sources(room, task), wanted, random.SystemRandom())
            for path, source in planted.sources.items():
                _write_in_room(room, _in_workdir(workdir, path), source, "the hidden tests with canaries")
        command = ["bash", "-c", spec.command] if spec.command else _pytest_command(vdir, workdir, _test_files(wanted))
        stdin = None
    start = time.monotonic()
    result = room.exec(
        command,
        cwd=workdir,
        env=PYTEST_ENV,
        timeout=spec.timeout_seconds,
        stdin=stdin,
        max_output_bytes=20_000_000 if spec.kind == "calls" else 200_000,
    )
    duration = time.monotonic() - start
    tail = (result.stderr if spec.kind == "calls" else result.stdout + result.stderr)[-4000:]
    bare = _bare_report(task, tail, duration)
    if result.is_infra_error:
        assert result.infra_error is not None  # the service names the kind of every infrastructure error
        return _Run(bare, failure=f"{result.infra_error.value}: {result.message or ''}")
    if result.outcome is ExecOutcome.command_timeout:
        return _Run(bare, timed_out=True)
    if spec.command is not None and not wanted:
        return _Run(
            TestReport(output=tail, duration_seconds=duration),
            exit_code=result.exit_code,
            exit_ok=result.exit_code == 0,
        )
    if spec.kind == "calls":
        return _judged_calls(task, merged, result.exit_code, result.stdout, result.stderr, duration)
    try:
        by_key, report = parse_junit(_read_report(room, f"{vdir}/report.xml"))
    except Exception as err:  # noqa: BLE001 - no readable report: no verdict
        return _Run(
            bare,
            failure=f"no report: pytest exited {result.exit_code}: {type(err).__name__}",
            exit_code=result.exit_code,
        )
    if planted is not None:
        tampered = planted.tampering(by_key, result.exit_code)
        if tampered:
            return _Run(bare, tampered=tampered, exit_code=result.exit_code)
        kept = [s for key, s in by_key.items() if not planted.owns(key)]  # the canaries' own results left out
        report = TestReport(passed=kept.count("PASSED"), failed=kept.count("FAILED"), errors=kept.count("ERROR"))
    report.output, report.duration_seconds = tail, duration
    key = planted.key if planted is not None else (lambda k: k)  # a listed test the canaries renamed
    statuses = {node: by_key.get(key(junit_key(node)), "missing") for node in wanted}
    return _Run(report, statuses=statuses, exit_code=result.exit_code)


def _in_workdir(workdir: str, path: str) -> str:
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


def _hidden_sources(room: Sandbox, task: Task) -> dict[str, str]:
    """Source of every test file the task's test ids name, as placed in the clean room (the task's hidden
    files, its test patch applied, or the pristine files: the agent's edits of test files are never applied)."""
    spec, workdir = task.verifier, task.environment.workdir
    sources = {}
    for path in _test_files(spec.fail_to_pass + spec.pass_to_pass):
        source = spec.hidden_files.get(path) if not spec.expected.get("test_patch") else None
        if source is None:
            res = _checked(
                room.exec(["cat", "--", _in_workdir(workdir, path)], timeout=60, max_output_bytes=20_000_000),
                "reading the hidden tests",
            )
            if res.exit_code != 0:
                continue  # no such file: pytest reports the test missing, which fails it
            source = res.stdout
        sources[path] = source
    return sources


def _test_sources(task: Task) -> dict[str, str]:
    """Source of every test file the task's test ids name: hidden files first, else the pristine files
    the task placed (never the agent's copies)."""
    spec, env = task.verifier, task.environment
    sources = {}
    for path in _test_files(spec.fail_to_pass + spec.pass_to_pass):
        source = spec.hidden_files.get(path, env.files.get(path))
        if source is None:
            raise ValueError(f"task {task.id}: no source for test file {path} (verifier kind calls)")
        sources[path] = source
    return sources


__all__ = ["NAME", "VERSION", "Tree", "junit_key", "parse_junit", "verify_in_clean_room"]
