"""Generate SWE tasks: small Python repositories with planted bugs (one, or two), an issue and hidden tests.

Deterministic from (split, seed, index). Each split draws candidates from its own seed stream and keeps
those whose repository lies in the split's share of the repository space, and whose content (files and
issue text) it does not hold yet (`components.core.data.splits.draw`): no seed of one split can produce a task,
or a repository, of another, and no split holds a task twice. A task's unit (`Task.unit`) is its
repository: tasks that differ only in their issue text (another example call) share it. Optionally the
splits are disjoint by family too (`heldout_families` appear only in heldout): what a claim about
generalising to unseen kinds of bug needs.

Difficulty levels:
  1. one tiny module with one function; the issue names the file, the function, a failing call and
     the expected result (a few hundred tokens in all: a tiny model trained for minutes can do it);
  2. the module holds two correct distractor functions too; the issue names the function only;
  3. three modules with distractors and a README; the issue describes the behaviour and an example.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from dataclasses import dataclass
from string import Template
from typing import Any

from components.core.data.schema import EnvironmentSpec, Split, Task, VerifierSpec
from components.core.data.splits import draw, task_content
from components.recipes.common import families_for_split
from components.recipes.swe.templates import BY_FAMILY, FAMILIES, TEMPLATES, BugTemplate

PACKAGES = ("mathkit", "listutil", "textops", "numtools", "datakit", "minilib", "calcpack", "seqtools")
HIDDEN_TEST_PATH = "tests/test_issue.py"
WORKDIR = "/workspace/repo"


class GenerationError(RuntimeError):
    """A template instance broke the suite's rules (a bug in templates.py, not in the caller's input)."""


@dataclass(frozen=True)
class _Instance:
    template: BugTemplate
    fn: str
    values: dict[str, Any]

    def sub(self, text: str) -> str:
        return Template(text).substitute(fn=self.fn, **self.values)

    def function_source(self, line: str) -> str:
        return self.sub(self.template.source.replace("@LINE@", line))

    def line(self, which: str) -> str:
        return self.sub(getattr(self.template, which))


def _stable_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:7], "big")  # fits int64 columns


def _call(source: str, expr: str) -> str:
    """What `expr` gives with `source` loaded: repr of the value or 'raises <Error>'."""
    ns: dict[str, Any] = {}
    exec(source, ns)  # our own template code, never user input
    try:
        return repr(eval(expr, ns))
    except Exception as err:  # the bug may raise: that is the observed behaviour
        return f"raises {type(err).__name__}"


def _holds(source: str, assertion: str) -> bool:
    ns: dict[str, Any] = {}
    exec(source, ns)
    try:
        return bool(eval(assertion, ns))
    except Exception:
        return False


def _check(inst: _Instance) -> None:
    buggy, fixed = inst.function_source(inst.line("buggy")), inst.function_source(inst.line("fixed"))
    name = f"{inst.template.key}/{inst.fn}"
    for a in map(inst.sub, inst.template.visible):
        if not (_holds(buggy, a) and _holds(fixed, a)):
            raise GenerationError(f"{name}: visible assertion {a!r} must hold with and without the bug")
    hidden = [inst.sub(a) for a in inst.template.hidden]
    if not all(_holds(fixed, a) for a in hidden):
        raise GenerationError(f"{name}: a hidden assertion fails on the fixed code")
    if all(_holds(buggy, a) for a in hidden):
        raise GenerationError(f"{name}: the hidden assertions do not catch the bug")
    for wrong in inst.template.wrong:
        if all(_holds(inst.function_source(inst.sub(wrong)), a) for a in hidden):
            raise GenerationError(f"{name}: wrong fix {wrong!r} passes the hidden tests")


def _test_file(pkg: str, imports: dict[str, list[str]], asserts: list[str], prefix: str) -> str:
    lines = [f"from {pkg}.{mod} import {', '.join(sorted(names))}" for mod, names in sorted(imports.items())]
    lines.append("")
    for i, a in enumerate(asserts, 1):
        lines += ["", f"def {prefix}_{i}():", f"    assert {a}"]
    return "\n".join(lines) + "\n"


def _indent_of(source: str, line: str) -> str:
    for raw in source.splitlines():
        if raw.strip() == line:
            return raw[: len(raw) - len(raw.lstrip())]
    raise GenerationError(f"line {line!r} not found in the generated source")


def unified_diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff (a/ b/ prefixes, applies with `git apply` or `patch -p1`)."""
    return "".join(
        difflib.unified_diff(before.splitlines(True), after.splitlines(True), fromfile=f"a/{path}", tofile=f"b/{path}")
    )


def _pick_instance(rng: random.Random, template: BugTemplate, taken: set[str]) -> _Instance:
    names = [n for n in template.names if n not in taken] or [f"{template.names[0]}_{len(taken)}"]
    inst = _Instance(template, rng.choice(names), template.values(rng))
    taken.add(inst.fn)
    return inst


def make_task(
    split: Split,
    seed: int,
    index: int,
    *,
    difficulty: int,
    families: tuple[str, ...],
    bugs: int = 1,
    packages: tuple[str, ...] = PACKAGES,
    attempt: int = 0,
) -> Task:
    """The `index`-th candidate of a split's seed stream (pure function of its arguments); `attempt` > 0: the
    index's further candidates, drawn when an earlier one belongs to another split or repeats a task.

    `bugs=2` plants a second bug of another template in another function (in another module at
    difficulty 3: a multi-file fix). Each bug has its own hidden tests, so fixing one of them passes
    part of the hidden tests: an unresolved attempt can still hold real progress."""
    stream = (split, seed, index, difficulty) + ((bugs,) if bugs != 1 else ()) + ((attempt,) if attempt else ())
    task_seed = _stable_seed("swe", *stream)
    rng = random.Random(task_seed)
    family = families[rng.randrange(len(families))]
    template = rng.choice(BY_FAMILY[family])
    taken: set[str] = set()
    targets = [_pick_instance(rng, template, taken)]
    if bugs == 2:
        others = [t for t in TEMPLATES if t.family != template.family]
        targets.append(_pick_instance(rng, rng.choice(others), taken))
    for t in targets:
        _check(t)
    target = targets[0]
    pkg = rng.choice(packages)

    n_distractors = {1: 0, 2: 2, 3: 4}[difficulty]
    # Distractors must not contain a buggy line: each reference edit (old -> new) stays unique.
    pool = [t for t in TEMPLATES if t.key not in {x.template.key for x in targets}]
    rng.shuffle(pool)
    distractors: list[_Instance] = []
    for candidate in pool:
        if len(distractors) == n_distractors:
            break
        inst = _pick_instance(rng, candidate, taken)
        if all(x.line("buggy") not in inst.function_source(inst.line("fixed")) for x in targets):
            distractors.append(inst)
    modules = ["core"] if difficulty < 3 else ["core", "helpers", "ops"]
    placement: dict[str, list[_Instance]] = {m: [] for m in modules}
    target_modules = [modules[0] if difficulty < 3 else rng.choice(modules)]
    if bugs == 2:
        target_modules.append(
            modules[0] if difficulty < 3 else rng.choice([m for m in modules if m != target_modules[0]])
        )
    for t, module in zip(targets, target_modules):
        placement[module].append(t)
    for i, d in enumerate(distractors):
        placement[modules[i % len(modules)]].append(d)

    files: dict[str, str] = {f"{pkg}/__init__.py": ""}
    module_sources: dict[str, tuple[str, str]] = {}
    for module, insts in placement.items():
        rng.shuffle(insts)
        before = "\n\n".join(i.function_source(i.line("buggy" if i in targets else "fixed")) for i in insts)
        after = "\n\n".join(i.function_source(i.line("fixed")) for i in insts)
        module_sources[module] = (before, after)
        files[f"{pkg}/{module}.py"] = before

    # Visible tests: behaviour that holds with the bugs, plus the distractors' real tests.
    vis_imports: dict[str, list[str]] = {}
    vis_asserts: list[str] = []
    for module, insts in placement.items():
        for placed in insts:
            vis_imports.setdefault(module, []).append(placed.fn)
            asserts = placed.template.visible if placed in targets else placed.template.visible + placed.template.hidden
            vis_asserts += [placed.sub(a) for a in asserts]
    visible_path = "tests/test_basic.py"
    files[visible_path] = _test_file(pkg, vis_imports, vis_asserts, "test_basic")
    hidden_imports: dict[str, list[str]] = {}
    hidden_asserts: list[str] = []
    hidden_owner: list[int] = []  # which bug each hidden test checks
    for k, (t, module) in enumerate(zip(targets, target_modules)):
        hidden_imports.setdefault(module, []).append(t.fn)
        hidden_asserts += [t.sub(a) for a in t.template.hidden]
        hidden_owner += [k] * len(t.template.hidden)
    hidden = _test_file(pkg, hidden_imports, hidden_asserts, "test_issue")
    if difficulty == 3:
        files["README.md"] = f"# {pkg}\n\nSmall helpers. Run the tests with `python -m pytest -q`.\n"

    fixes: list[dict[str, Any]] = []
    reports: list[str] = []
    for t, module in zip(targets, target_modules):
        path = f"{pkg}/{module}.py"
        before = module_sources[module][0]
        buggy_line, fixed_line = t.line("buggy"), t.line("fixed")
        indent = _indent_of(before, buggy_line)
        if before.count(indent + buggy_line) != 1:
            raise GenerationError(f"{t.template.key}: the buggy line is not unique in {path}")
        example = t.sub(t.template.example)
        got = _call(t.function_source(buggy_line), example)
        want = _call(t.function_source(fixed_line), example)
        fixes.append(
            {
                "path": path,
                "old": indent + buggy_line,
                "new": indent + fixed_line,
                "wrong": [indent + t.sub(w) for w in t.template.wrong],
                "function": t.fn,
            }
        )
        reports.append(_report(difficulty, path, pkg, t, example, got, want))
    prompt = reports[0] if bugs == 1 else "Two problems were reported.\n1. " + reports[0] + "\n2. " + reports[1]
    after_by_path = {f"{pkg}/{m}.py": module_sources[m][1] for m in dict.fromkeys(target_modules)}

    hidden_ids = [f"{HIDDEN_TEST_PATH}::test_issue_{i}" for i in range(1, len(hidden_asserts) + 1)]
    visible_ids = [f"{visible_path}::test_basic_{i}" for i in range(1, len(vis_asserts) + 1)]
    digest = hashlib.sha256(":".join(map(str, stream)).encode()).hexdigest()[:10]
    first = fixes[0]
    example = target.sub(template.example)
    return Task(
        id=f"swe-{family}-l{difficulty}-{digest}" if bugs == 1 else f"swe-{family}-x{bugs}-l{difficulty}-{digest}",
        recipe="swe",
        split=split,
        prompt=prompt,
        environment=EnvironmentSpec(files=files, workdir=WORKDIR),
        verifier=VerifierSpec(
            kind="calls",
            hidden_files={HIDDEN_TEST_PATH: hidden},
            fail_to_pass=hidden_ids,
            pass_to_pass=visible_ids,
            timeout_seconds=60.0,
        ),
        reference_solution="".join(unified_diff(p, files[p], a) for p, a in after_by_path.items()),
        family=family,
        difficulty=difficulty,
        seed=task_seed,
        metadata={
            "template": template.key,
            "function": target.fn,
            "package": pkg,
            # `fix`/`fixed_source`: the first bug (what single-bug tools read); `fixes`/`fixed_sources`: all.
            "fix": {k: v for k, v in first.items() if k != "function"},
            "fixed_source": after_by_path[first["path"]],
            "fixes": fixes,
            "fixed_sources": after_by_path,
            "hidden_test_bug": hidden_owner,
            "example": {
                "call": example,
                "got": _call(target.function_source(target.line("buggy")), example),
                "want": _call(target.function_source(target.line("fixed")), example),
            },
            "visible_tests": [visible_path],
        },
    )


def _report(difficulty: int, path: str, pkg: str, target: _Instance, example: str, got: str, want: str) -> str:
    """The issue text of one bug, as precise as the difficulty level says."""
    behaviour = target.sub(target.template.behaviour)
    if difficulty == 1:
        prompt = f"Bug in `{path}`: `{example}` returns `{got}`, expected `{want}`; {behaviour}. Fix `{target.fn}`."
    elif difficulty == 2:
        prompt = f"`{target.fn}` is wrong: `{example}` gives `{got}` but should give `{want}` ({behaviour}). Fix it."
    else:
        prompt = (
            f"Users report that `{example}` gives `{got}` instead of `{want}`: {behaviour}. "
            f"Find and fix the bug in the `{pkg}` package."
        )
    if got.startswith("raises"):
        prompt = prompt.replace(f"returns `{got}`", got).replace(f"gives `{got}`", got)
    return prompt


def generate_tasks(
    split: Split,
    n: int,
    seed: int = 0,
    *,
    difficulty: int | list[int] = 1,
    heldout_families: tuple[str, ...] = (),
    bugs: int | list[int] = 1,
    families: tuple[str, ...] = (),
    packages: tuple[str, ...] = (),
) -> list[Task]:
    """`n` tasks of `split`. Heldout families never appear in train; heldout uses only them when set.

    `families`: the bug families both splits draw from (empty: all of them); a narrower suite has more
    tasks per template, which is what lets a tiny model trained for minutes learn the fixes.
    `packages`: the package names repositories are drawn from (empty: all of `PACKAGES`); the policy
    copies the name from the issue into its paths, which a tiny model learns slowly from few names.
    `bugs`: planted bugs per task (1 or 2), or a list cycled over like `difficulty`. Validation tasks come from
    the training families (tuning must not look at the held-out families either)."""
    unknown = (set(heldout_families) | set(families)) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown bug families {sorted(unknown)}; choose from {FAMILIES}")
    pool = tuple(f for f in FAMILIES if f in families) if families else FAMILIES
    families = families_for_split(pool, tuple(heldout_families), split)
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if any(level not in (1, 2, 3) for level in levels):
        raise ValueError(f"difficulty levels are 1, 2 or 3, got {levels}")
    counts = [bugs] if isinstance(bugs, int) else list(bugs)
    if any(b not in (1, 2) for b in counts):
        raise ValueError(f"bugs per task are 1 or 2, got {counts}")
    if not all(isinstance(p, str) and p.isidentifier() for p in packages):
        raise ValueError(f"package names must be Python identifiers, got {list(packages)}")

    def candidate(i: int, attempt: int) -> Task:
        return make_task(
            split,
            seed,
            i,
            difficulty=levels[i % len(levels)],
            families=families,
            bugs=counts[i % len(counts)],
            packages=tuple(packages) or PACKAGES,
            attempt=attempt,
        )

    return draw(candidate, split, n, content=task_content, unit=repository)


def repository(task: Task) -> dict[str, str]:
    """A generated task's unit: its repository (the files the agent starts from)."""
    return task.environment.files
