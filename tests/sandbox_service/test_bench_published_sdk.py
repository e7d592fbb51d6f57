"""scripts/bench_published_sdk.py: the published SDK's own benchmark, unmodified, against a fresh service.

Their checkout is not part of ours: the end-to-end run needs ORCHARD_PUBLISHED_SDK=<microsoft/Orchard>/orchard_env
(and runs with -m slow); without it only the refusal of a wrong directory is checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.bench_published_sdk import main


def test_a_directory_without_their_benchmark_is_refused_in_one_line(tmp_path, capsys):
    assert main(["--sdk", str(tmp_path), "--num", "1"]) == 2
    err = capsys.readouterr().err
    assert "no tests/integration/bench_concurrent.py" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ORCHARD_PUBLISHED_SDK"), reason="set ORCHARD_PUBLISHED_SDK to their checkout")
def test_their_benchmarks_run_unmodified_and_all_succeed(capsys):
    sdk = Path(os.environ["ORCHARD_PUBLISHED_SDK"])
    assert main(["--sdk", str(sdk), "--num", "10", "--pty"]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "60/60 operations succeeded" in out
