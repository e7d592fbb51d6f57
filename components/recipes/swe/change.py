"""The agent's change to a repository, taken on the host from two archives: the pristine tree (read
from a clean fork of the task's set-up state) and the agent's final tree.

Nothing here runs inside the agent's sandbox, so the workspace cannot forge the change (a rewritten
`.git`, a replaced `git` binary or a lying `submit` diff change nothing). The rule of what reaches
verification:

- only regular files under the repository count; symlinks, devices and FIFOs are never applied;
- the top-level `.git/` is git's bookkeeping (the `submit` tool stages the change): never applied, not listed;
- ignored by verification (recorded with the reason): `.git/`, `__pycache__`/`.pyc`, `.pytest_cache`,
  test files (`test_*.py`, `*_test.py`, anything under a `tests`/`test`/`testing` directory),
  `conftest.py`, test-runner configuration (`pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`),
  interpreter start-up hooks (`*.pth`, `sitecustomize.py`, `usercustomize.py`), a top-level module or
  package that shadows the standard library or the test runner (`pytest`, `_pytest`, `pluggy`, ...),
  and binary (non UTF-8 or NUL-containing) files;
- everything else that was added, modified or deleted is applied.
"""

from __future__ import annotations

import difflib
import fnmatch
import io
import posixpath
import sys
import tarfile

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import IgnoredPart

TEST_DIRS = frozenset({"tests", "test", "testing"})
TEST_FILE_GLOBS = ("test_*.py", "*_test.py")
RUNNER_CONFIG = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
CACHE_PARTS = frozenset({"__pycache__", ".pytest_cache", ".git"})
# Modules the runner imports (lazily too): a repository-root module of one of these names would be
# imported in their place, since the repository root is on sys.path while the tests run.
RUNNER_MODULES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup", "tomli", "pygments", "colorama"}
)
SHADOWED = frozenset(sys.stdlib_module_names) | RUNNER_MODULES


class RepoChange(BaseModel):
    """What the verifier applies to the clean room, and what it left out."""

    model_config = ConfigDict(extra="forbid")
    write: dict[str, bytes] = Field(default_factory=dict, description="Added or modified files (path -> content).")
    delete: list[str] = Field(default_factory=list, description="Files the agent deleted.")
    ignored: list[IgnoredPart] = Field(default_factory=list)

    def diff(self, pristine: dict[str, bytes]) -> str:
        """The applied change as a unified diff (for the record; application writes whole files)."""
        out: list[str] = []
        for path in sorted({*self.write, *self.delete}):
            old = pristine.get(path, b"").decode("utf-8", errors="replace").splitlines(keepends=True)
            new = self.write.get(path, b"").decode("utf-8", errors="replace").splitlines(keepends=True)
            a = f"a/{path}" if path in pristine else "/dev/null"
            b = f"b/{path}" if path in self.write else "/dev/null"
            out.extend(difflib.unified_diff(old, new, a, b))
        return "".join(line if line.endswith("\n") else line + "\n" for line in out)


class Tree(BaseModel):
    """Regular files (path -> bytes) of an archive, and the paths that were something else."""

    model_config = ConfigDict(extra="forbid")
    files: dict[str, bytes] = Field(default_factory=dict)
    other: dict[str, str] = Field(default_factory=dict, description="path -> kind (symlink, directory link, ...).")


def read_tree(archive: bytes) -> Tree:
    """Read a (gzipped) tar in memory, never extracting: member names cannot escape anything."""
    tree = Tree()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        for member in tar:
            path = posixpath.normpath(member.name.lstrip("/"))
            if path in (".", "") or path.startswith("../"):
                continue
            if path.startswith("./"):
                path = path[2:]
            if member.isfile():
                data = tar.extractfile(member)
                tree.files[path] = data.read() if data is not None else b""
            elif not member.isdir():
                tree.other[path] = "symlink" if member.issym() else "hard link" if member.islnk() else "special file"
    return tree


MAX_PATH_BYTES = 1024  # longer paths (or a component over NAME_MAX) are never written on the host
NAME_MAX = 255


def escaped(path: str) -> str:
    """`path` as it is recorded: any byte that is not UTF-8 (tar names carry them as surrogates) as `\\xNN`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def ignore_reason(path: str, content: bytes | None, package_dirs: set[str]) -> str | None:
    """Why verification leaves `path` out, or None when it is applied (`content` None: a deletion)."""
    parts = path.split("/")
    name = parts[-1]
    if escaped(path) != path:
        return "file name is not UTF-8"
    if len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > NAME_MAX for p in parts):
        return f"path longer than {MAX_PATH_BYTES} bytes (or a name over {NAME_MAX})"
    if CACHE_PARTS & set(parts) or name.endswith((".pyc", ".pyo")):
        return "cache or version-control metadata"
    if name in RUNNER_CONFIG:
        return "test-runner configuration"
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return "interpreter start-up hook"
    if TEST_DIRS & set(parts[:-1]) or any(fnmatch.fnmatch(name, g) for g in TEST_FILE_GLOBS):
        return "test file"
    top = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else parts[0] if len(parts) > 1 else None
    if top in SHADOWED and top not in package_dirs:
        return f"shadows the module {top!r} the test runner or standard library provides"
    if content is not None and (b"\0" in content or not _utf8(content)):
        return "binary file"
    return None


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def extract_change(pristine: Tree, final: Tree) -> RepoChange:
    """The change from `pristine` to `final`, split into what is applied and what is ignored."""
    change = RepoChange()
    # A top-level package that was already in the task's repository is its own code, never shadowing.
    package_dirs = {p.split("/", 1)[0] for p in pristine.files if "/" in p}
    for path, kind in sorted(final.other.items()):
        if pristine.other.get(path) != kind:
            change.ignored.append(IgnoredPart(path=escaped(path), reason=f"{kind} (only regular files are applied)"))
    for path in sorted(set(pristine.files) | set(final.files)):
        before, after = pristine.files.get(path), final.files.get(path)
        if before == after or path.split("/", 1)[0] == ".git":  # git's own bookkeeping (submit's `git add`)
            continue
        reason = ignore_reason(path, after, package_dirs)
        if reason is not None:
            change.ignored.append(
                IgnoredPart(path=escaped(path), reason=reason + (" (deleted)" if after is None else ""))
            )
        elif after is None:
            change.delete.append(path)
        else:
            change.write[path] = after
    return change
