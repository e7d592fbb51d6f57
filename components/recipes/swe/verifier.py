"""Verify an SWE episode: place the hidden tests only now, run pytest in the sandbox, read the report.

Resolved means every FAIL_TO_PASS and PASS_TO_PASS test passed (or, with neither listed, pytest
exited 0 having run at least one test). A verifier that cannot run (no pytest in the sandbox, the
sandbox died) is an infrastructure error, never an unresolved episode.
"""

from __future__ import annotations

import re
import shlex
import time

from components.core.recipe_base import VerifyResult
from components.core.schema import Task, TestReport
from sandbox_service.client import Sandbox
from sandbox_service.models import ExecOutcome

_STATUS_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)", re.MULTILINE)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|error)\b")
PYTEST = "python -m pytest -q -rA --tb=short -p no:cacheprovider"


def parse_pytest_report(output: str) -> tuple[dict[str, str], TestReport]:
    """Per-test status (from `-rA`) and the summary counts of a pytest run."""
    statuses: dict[str, str] = {}
    for status, node in _STATUS_LINE.findall(output):
        statuses.setdefault(node, status)
    passed = failed = errors = 0
    summary = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|errors?)\b", ln)]
    if summary:
        for n, kind in _COUNT.findall(summary[-1]):
            if kind == "passed":
                passed = int(n)
            elif kind == "failed":
                failed = int(n)
            else:
                errors = int(n)
    return statuses, TestReport(passed=passed, failed=failed, errors=errors, output=output[-4000:])


def _test_files(ids: list[str]) -> list[str]:
    files: list[str] = []
    for node in ids:
        path = node.split("::", 1)[0]
        if path not in files:
            files.append(path)
    return files


def run_hidden_tests(sandbox: Sandbox, task: Task, workdir: str) -> VerifyResult:
    spec = task.verifier
    for rel, content in spec.hidden_files.items():
        target = rel if rel.startswith("/") else f"{workdir.rstrip('/')}/{rel}"
        mk = sandbox.exec(["mkdir", "-p", target.rsplit("/", 1)[0]], timeout=30)
        if mk.is_infra_error:
            return VerifyResult(resolved=False, infra_error=f"placing hidden tests: {mk.infra_error}: {mk.message}")
        sandbox.write_file(target, content)
    test_patch = spec.expected.get("test_patch")
    if test_patch:
        applied = sandbox.apply_patch(test_patch, cwd=workdir)
        if not applied.applied:
            return VerifyResult(resolved=False, reason=f"the test patch does not apply: {applied.stderr[-500:]}")

    wanted = list(dict.fromkeys(spec.fail_to_pass + spec.pass_to_pass))
    # Whole files, not node ids: ids with brackets or spaces survive no shell; statuses are per id anyway.
    targets = " ".join(shlex.quote(f) for f in _test_files(wanted))
    command = spec.command or f"{PYTEST} {targets}".strip()
    start = time.monotonic()
    result = sandbox.exec(["bash", "-c", command], cwd=workdir, timeout=spec.timeout_seconds,
                          max_output_bytes=1_000_000)
    duration = time.monotonic() - start
    output = result.stdout + result.stderr
    if result.is_infra_error:
        return VerifyResult(resolved=False, infra_error=f"running hidden tests: {result.infra_error}: {result.message}")
    if "No module named pytest" in output:
        return VerifyResult(resolved=False, infra_error="pytest is not installed in the sandbox's python")
    statuses, report = parse_pytest_report(output)
    report.duration_seconds = duration
    if result.outcome is ExecOutcome.command_timeout:
        return VerifyResult(resolved=False, report=report, reason=f"hidden tests timed out after {spec.timeout_seconds:g}s")
    if spec.command is not None and not wanted:
        ok = result.exit_code == 0
        return VerifyResult(resolved=ok, report=report, reason=None if ok else f"command exited {result.exit_code}")
    if not wanted:
        ok = result.exit_code == 0 and report.passed > 0
        return VerifyResult(resolved=ok, report=report, reason=None if ok else f"pytest exited {result.exit_code}")
    not_passed = [t for t in wanted if statuses.get(t) != "PASSED"]
    if not_passed:
        f2p = [t for t in not_passed if t in spec.fail_to_pass]
        detail = ", ".join(f"{t}={statuses.get(t, 'missing')}" for t in not_passed[:5])
        kind = "FAIL_TO_PASS" if f2p else "PASS_TO_PASS"
        return VerifyResult(resolved=False, report=report, reason=f"{len(not_passed)} {kind} tests not passing: {detail}")
    return VerifyResult(resolved=True, report=report)
