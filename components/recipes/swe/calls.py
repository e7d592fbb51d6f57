"""Verdicts of generated SWE tasks computed where the agent's code never runs (verifier kind `calls`).

Why not pytest: the hidden tests import the agent's package, so code in the package runs inside the
process that decides the verdict and can forge it (register a plugin, patch the report class, write a
passing JUnit file and exit, return an object whose `__eq__` is always true, read the expected value
off the asserting frame). For our generated tasks every hidden test is `assert <expr>` over calls of
the package's functions with literal arguments, so the verdict is split in two processes:

1. **Worker** (`WORKER`, in the clean room, `python -I`): imports the agent's functions, evaluates each
   call and returns its value as typed plain data (JSON: None, bool, int, float, str, list, tuple,
   dict with str keys, exact types only, bounded depth and size). An exception is `raises <Type>`; any
   other value (a subclass, an object with its own `__eq__`, a generator) is `not plain data`. It
   never sees the assertions or the expected values.
2. **Judge** (`judge`, the host process that runs the harness, which never imports the agent's code):
   decodes the values into fresh builtins and evaluates each assertion with the calls replaced by those
   values, under a builtins allowlist. A call that raised, was not plain data or is missing fails its
   test. Whatever the worker process prints, exits with or writes is at most a forged *value*: the
   comparison and the expected side are out of its reach.

`parse_checks` turns a generated test module (`from pkg.mod import f, g` + `def test_x(): assert ...`)
into checks; anything else in the module is a task error (`ValueError`), never guessed at.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 32
MAX_ITEMS = 100_000

# The judge's builtins: what generated assertions use, nothing that reaches files, imports or attributes.
_JUDGE_BUILTINS = {
    "round": round,
    "list": list,
    "range": range,
    "len": len,
    "isinstance": isinstance,
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "tuple": tuple,
    "dict": dict,
    "abs": abs,
    "sorted": sorted,
    "sum": sum,
    "min": min,
    "max": max,
    "True": True,
    "False": False,
    "None": None,
}


@dataclass
class Check:
    """One test function: the agent calls it makes (source text) and its assertions with `_rN` in their place."""

    name: str
    calls: list[str] = field(default_factory=list)
    assertions: list[str] = field(default_factory=list)


@dataclass
class Checks:
    imports: list[tuple[str, str]]  # (module, name) the worker imports
    tests: list[Check]


class _CallsToSlots(ast.NodeTransformer):
    def __init__(self, names: set[str], calls: list[str]):
        self.names, self.calls = names, calls

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id in self.names:
            self.calls.append(ast.unparse(node))
            return ast.copy_location(ast.Name(id=f"_r{len(self.calls) - 1}", ctx=ast.Load()), node)
        return self.generic_visit(node)


def parse_checks(source: str) -> Checks:
    """The checks of a generated test module; raises ValueError on anything outside that shape."""
    tree = ast.parse(source)
    imports: list[tuple[str, str]] = []
    tests: list[Check] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imports += [(node.module, a.name) for a in node.names if a.asname is None]
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not node.args.args:
            check = Check(node.name)
            names = {name for _, name in imports}
            for stmt in node.body:
                if not isinstance(stmt, ast.Assert):
                    raise ValueError(f"{node.name}: only assert statements can be judged outside the worker")
                expr = _CallsToSlots(names, check.calls).visit(stmt.test)
                check.assertions.append(ast.unparse(expr))
            tests.append(check)
        else:
            raise ValueError(f"line {node.lineno}: not an import or a test function")
    return Checks(imports, tests)


# -- the worker (runs in the clean room with the agent's code; stdlib only, written out as a file) ----
WORKER = r"""
import json, os, sys
out = os.dup(1)
os.dup2(2, 1)  # whatever the package prints goes to stderr, not into the answer channel
req = json.loads(sys.stdin.read())
sys.path.insert(0, req["workdir"])
import builtins, importlib
MAX_DEPTH, MAX_ITEMS = req["max_depth"], req["max_items"]

class Unplain(Exception):
    pass

def enc(v, depth, budget):
    budget[0] += 1
    if depth > MAX_DEPTH or budget[0] > MAX_ITEMS:
        raise Unplain("too deep or too large")
    t = type(v)
    if v is None:
        return ["none"]
    if t is bool:
        return ["bool", v]
    if t is int:
        return ["int", str(v)]
    if t is float:
        return ["float", repr(v)]
    if t is str:
        return ["str", v]
    if t is list or t is tuple:
        return [t.__name__, [enc(x, depth + 1, budget) for x in v]]
    if t is dict:
        if any(type(k) is not str for k in v):
            raise Unplain("dict with non-str keys")
        return ["dict", [[k, enc(x, depth + 1, budget)] for k, x in v.items()]]
    raise Unplain(t.__name__)

ns = {}
for module, name in req["imports"]:
    try:
        ns[name] = getattr(importlib.import_module(module), name)
    except BaseException as exc:
        ns.setdefault("__import_errors__", {})[name] = type(exc).__name__
results = []
for call in req["calls"]:
    try:
        value = eval(call, {"__builtins__": builtins, **ns})
        try:
            results.append(enc(value, 0, [0]))
        except Unplain as exc:
            results.append(["unplain", str(exc)[:200]])
        except BaseException as exc:
            results.append(["unplain", type(exc).__name__])
    except BaseException as exc:
        results.append(["raises", type(exc).__name__ if type(exc).__name__.isidentifier() else "?"])
data = json.dumps(results).encode()
while data:
    data = data[os.write(out, data):]
os._exit(0)
"""


def worker_request(checks: Checks, workdir: str) -> str:
    calls = [c for t in checks.tests for c in t.calls]
    return json.dumps(
        {"workdir": workdir, "imports": checks.imports, "calls": calls, "max_depth": MAX_DEPTH, "max_items": MAX_ITEMS}
    )


class NotPlain(ValueError):
    """The worker's answer is not the typed plain data it must be."""


def decode(item: Any, depth: int = 0) -> Any:
    """A worker value back into fresh builtins (raises NotPlain for anything else)."""
    if depth > MAX_DEPTH or not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise NotPlain("malformed value")
    tag, rest = item[0], item[1:]
    if tag == "none" and not rest:
        return None
    if len(rest) != 1:
        raise NotPlain("malformed value")
    (v,) = rest
    if tag == "bool" and type(v) is bool:
        return v
    if tag == "int" and type(v) is str and len(v) <= 4300:
        return int(v)
    if tag == "float" and type(v) is str and len(v) <= 64:
        return float(v)
    if tag == "str" and type(v) is str:
        return v
    if tag in ("list", "tuple") and type(v) is list:
        items = [decode(x, depth + 1) for x in v]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and type(v) is list:
        return {str(k): decode(x, depth + 1) for k, x in v}
    raise NotPlain(f"value tagged {tag!r}")


def judge(checks: Checks, answer: str) -> dict[str, str]:
    """Per test name: PASSED, FAILED (an assertion is false) or ERROR (a call raised, was not plain
    data, or the worker gave no well-formed answer for it). Runs in the host process only."""
    try:
        raw = json.loads(answer)
    except ValueError:
        raw = None
    n_calls = sum(len(t.calls) for t in checks.tests)
    if not isinstance(raw, list) or len(raw) != n_calls:
        return {t.name: "ERROR" for t in checks.tests}
    statuses: dict[str, str] = {}
    i = 0
    for test in checks.tests:
        values: dict[str, Any] = {}
        status = "PASSED"
        for k in range(len(test.calls)):
            item = raw[i + k]
            try:
                if isinstance(item, list) and item and item[0] in ("raises", "unplain"):
                    raise NotPlain(str(item[0]))
                values[f"_r{k}"] = decode(item)
            except (NotPlain, ValueError, TypeError, RecursionError):
                status = "ERROR"
        i += len(test.calls)
        if status == "PASSED":
            for assertion in test.assertions:
                try:
                    ok = bool(eval(assertion, {"__builtins__": _JUDGE_BUILTINS}, values))
                except Exception:  # noqa: BLE001 - comparing plain data failed: the assertion does not hold
                    ok = False
                if not ok:
                    status = "FAILED"
                    break
        statuses[test.name] = status
    return statuses
