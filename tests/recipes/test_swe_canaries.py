"""Canaries of imported tasks (`swe/canaries.py`), run with a real pytest on a small package: honest code,
fixed or not, never passes a twin; the forgeries a payload can make without reading the tests pass them all;
and the module keeps its own tests as they were, under drawn names the verifier maps back."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from components.recipes.swe.canaries import MAX_TWINS, plant

FIXED = """
def low_high(xs):
    return (min(xs), max(xs))


def greet(name):
    return "hello " + name


def scale(x):
    return x * 2.5
"""
BUGGY = FIXED.replace("(min(xs), max(xs))", "(max(xs), min(xs))").replace('"hello "', '"helo "')
ALWAYS_EQUAL = """
class _Any:
    def __eq__(self, other):
        return True


def low_high(xs):
    return _Any()


def greet(name):
    return _Any()


def scale(x):
    return _Any()
"""
TESTS = """
import unittest

import pytest

from pkg import greet, low_high, scale


def test_pair():
    assert low_high([3, 1, -2]) == (-2, 3)


def test_reversed_sides():
    assert (1, 7 + 5) == low_high([12, 1])


@pytest.mark.parametrize("name", ["ann", "bo"])
def test_greet(name):
    result = greet(name)
    assert result == "hello " + name
    assert greet("x") == "hello x"


def test_not_a_candidate():
    with pytest.raises(TypeError):
        assert low_high(None) == (1, 2)


class TestScale(unittest.TestCase):
    def test_scale(self):
        self.assertEqual(scale(2), 5.0)
"""
LISTED = [
    "tests/test_hidden.py::test_pair",
    "tests/test_hidden.py::test_reversed_sides",
    "tests/test_hidden.py::test_greet[ann]",
    "tests/test_hidden.py::test_greet[bo]",
    "tests/test_hidden.py::test_not_a_candidate",
    "tests/test_hidden.py::TestScale::test_scale",
]


def run(tmp_path, package: str, seed: int):
    """Plant with `seed`, run pytest on `package`: (canaries, JUnit statuses by key, exit code)."""
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text(package)
    (tmp_path / "tests").mkdir(exist_ok=True)
    planted = plant({"tests/test_hidden.py": TESTS}, LISTED, random.Random(seed))
    (tmp_path / "tests" / "test_hidden.py").write_text(planted.sources["tests/test_hidden.py"])
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "--rootdir",
            str(tmp_path),
            "tests/test_hidden.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(tmp_path),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PATH": "/usr/bin:/bin",
        },
    )
    statuses = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        statuses[(case.get("classname"), case.get("name"))] = (
            "ERROR"
            if "error" in tags
            else "FAILED"
            if "failure" in tags
            else "SKIPPED"
            if "skipped" in tags
            else "PASSED"
        )
    return planted, statuses, proc.returncode


@pytest.mark.parametrize("seed", range(6))
def test_honest_code_fixed_or_not_never_passes_a_twin(tmp_path, seed):
    from components.recipes.swe.verifier import junit_key

    planted, statuses, code = run(tmp_path, FIXED, seed)
    assert planted.tampering(statuses, code) is None, (planted.sources, statuses)
    assert len(planted.must_fail) == MAX_TWINS + 1 and len(planted.must_pass) == 1  # three twins, the pair
    listed = {node: statuses.get(planted.key(junit_key(node))) for node in LISTED}
    assert set(listed.values()) == {"PASSED"}, listed  # every hidden test found under its planted name
    kept = [s for key, s in statuses.items() if not planted.owns(key)]
    assert kept.count("PASSED") == len(LISTED)
    planted, statuses, code = run(tmp_path, BUGGY, seed)
    assert planted.tampering(statuses, code) is None  # unfixed: the hidden tests fail, the canaries hold


@pytest.mark.parametrize("seed", range(6))
def test_an_always_equal_package_passes_its_twins_and_shows(tmp_path, seed):
    planted, statuses, code = run(tmp_path, ALWAYS_EQUAL, seed)
    assert "tampered" in (planted.tampering(statuses, code) or ""), statuses


def test_twins_change_one_constant_and_keep_the_source_as_written(tmp_path):
    planted = plant({"tests/test_hidden.py": TESTS}, LISTED, random.Random(0))
    source = planted.sources["tests/test_hidden.py"]
    assert "with pytest.raises(TypeError):" in source and source.count("def test_not_a_candidate") == 1
    original_lines = set(TESTS.splitlines())
    changed = [line for line in source.splitlines() if line not in original_lines and "def " not in line]
    twin_asserts = [line for line in changed if "assert" in line]
    assert len(twin_asserts) == MAX_TWINS + 2, changed  # one changed constant per twin, plus the pair's two
    assert not any("'" in line for line in twin_asserts)  # the tests' own double quotes kept


def test_no_listed_assertion_with_a_constant_gives_no_twin_but_the_pair():
    planted = plant(
        {
            "t.py": textwrap.dedent("""
        from pkg import f

        def test_a():
            assert f(1) == f(2)
        """)
        },
        ["t.py::test_a"],
        random.Random(0),
    )
    assert len(planted.must_fail) == 1 and len(planted.must_pass) == 1 and not planted.renamed
