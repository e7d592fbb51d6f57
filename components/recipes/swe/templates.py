"""Bug templates of the generated SWE suite: one small function each, with its planted bug.

A template is a function source with one marked line (`@LINE@`) that is `buggy` in the task and
`fixed` in the reference; `wrong` lines are plausible but wrong fixes (the scripted teacher's
mistakes). `visible` assertions hold for both versions (visible tests must not reveal the bug);
`hidden` assertions hold only for the fixed one (at least one fails on the buggy line). Sources use
`string.Template` placeholders: `$fn` is the function name, the others come from `values(rng)`.
The generator checks every instance against these rules before it becomes a task.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

FAMILIES = ("off_by_one", "wrong_operator", "missing_edge_case", "wrong_default", "inverted_condition", "wrong_return")

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano")


def _ints(rng: random.Random) -> dict[str, object]:
    a, b, c = rng.sample(range(1, 10), 3)
    return {"a": a, "b": b, "c": c, "w": rng.choice(WORDS), "w2": rng.choice(WORDS)}


@dataclass(frozen=True)
class BugTemplate:
    family: str
    key: str
    names: tuple[str, ...] = field(repr=False)
    source: str = field(repr=False)
    buggy: str = ""
    fixed: str = ""
    wrong: tuple[str, ...] = ()
    example: str = ""
    visible: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    behaviour: str = ""
    values: Callable[[random.Random], dict[str, object]] = _ints


def _clamp_values(rng: random.Random) -> dict[str, object]:
    lo = rng.randint(1, 5)
    hi = lo + rng.randint(4, 8)
    return {**_ints(rng), "lo": lo, "hi": hi, "mid": rng.randint(lo + 1, hi - 1)}


def _limit_values(rng: random.Random) -> dict[str, object]:
    return {**_ints(rng), "k": rng.randint(3, 20)}


def _chunk_values(rng: random.Random) -> dict[str, object]:
    k = rng.randint(2, 4)
    return {**_ints(rng), "k": k, "bad": k + 1, "other": k + 2}


TEMPLATES: tuple[BugTemplate, ...] = (
    # -- off_by_one ----------------------------------------------------------------------------
    BugTemplate(
        "off_by_one",
        "sum_first",
        ("sum_first", "total_first", "prefix_total"),
        'def $fn(values, n):\n    """Return the sum of the first n values."""\n    total = 0\n'
        "    @LINE@\n        total += values[i]\n    return total\n",
        buggy="for i in range(n - 1):",
        fixed="for i in range(n):",
        wrong=("for i in range(1, n):", "for i in range(n + 1):"),
        example="$fn([$a, $b, $c], 2)",
        visible=("$fn([], 0) == 0",),
        hidden=("$fn([$a, $b, $c], 2) == $a + $b", "$fn([$a, $b, $c], 3) == $a + $b + $c"),
        behaviour="it must return the sum of the first n values",
    ),
    BugTemplate(
        "off_by_one",
        "inclusive_range",
        ("inclusive_range", "span", "between"),
        'def $fn(lo, hi):\n    """Return the integers from lo to hi, both included."""\n    @LINE@\n',
        buggy="return list(range(lo, hi))",
        fixed="return list(range(lo, hi + 1))",
        wrong=("return list(range(lo + 1, hi + 1))", "return list(range(lo - 1, hi))"),
        example="$fn($a, $a + 2)",
        visible=("$fn(5, 2) == []",),
        hidden=("$fn($a, $a + 2) == [$a, $a + 1, $a + 2]", "$fn($b, $b) == [$b]"),
        behaviour="it must include both lo and hi",
    ),
    BugTemplate(
        "off_by_one",
        "last_items",
        ("last_items", "tail", "take_last"),
        'def $fn(items, n):\n    """Return the last n items (all of them if n >= len(items))."""\n'
        "    if n <= 0:\n        return []\n    @LINE@\n",
        buggy="return items[max(0, len(items) - n + 1):]",
        fixed="return items[max(0, len(items) - n):]",
        wrong=("return items[max(0, len(items) - n - 1):]", "return items[max(1, len(items) - n):]"),
        example="$fn([$a, $b, $c], 2)",
        visible=("$fn([1, 2], 0) == []",),
        hidden=("$fn([$a, $b, $c], 2) == [$b, $c]", "$fn([$a, $b], 2) == [$a, $b]"),
        behaviour="it must return exactly the last n items",
    ),
    # -- wrong_operator ------------------------------------------------------------------------
    BugTemplate(
        "wrong_operator",
        "average",
        ("average", "mean_of", "avg"),
        'def $fn(values):\n    """Return the arithmetic mean of a non-empty list."""\n    @LINE@\n',
        buggy="return sum(values) // len(values)",
        fixed="return sum(values) / len(values)",
        wrong=("return sum(values) % len(values)", "return len(values) / sum(values)"),
        example="$fn([1, 2])",
        visible=("$fn([$a, $a]) == $a",),
        hidden=("$fn([1, 2]) == 1.5", "$fn([$a, $a + 1]) == $a + 0.5"),
        behaviour="it must return the exact mean, not a rounded-down one",
    ),
    BugTemplate(
        "wrong_operator",
        "at_least",
        ("at_least", "meets_limit", "is_enough"),
        'def $fn(value, limit=$k):\n    """Return True when value is at least limit."""\n    @LINE@\n',
        buggy="return value > limit",
        fixed="return value >= limit",
        wrong=("return value != limit", "return value < limit"),
        example="$fn($k)",
        visible=("$fn($k + 5) is True", "$fn(0) is False"),
        hidden=("$fn($k) is True", "$fn($k - 1) is False"),
        behaviour="a value equal to the limit counts as enough",
        values=_limit_values,
    ),
    BugTemplate(
        "wrong_operator",
        "discount",
        ("discount", "apply_discount", "reduced_price"),
        'def $fn(price, percent):\n    """Return price reduced by percent (10 means 10% off)."""\n    @LINE@\n',
        buggy="return price * (1 + percent / 100)",
        fixed="return price * (1 - percent / 100)",
        wrong=("return price * (percent / 100)", "return price - percent"),
        example="$fn(200, 10)",
        visible=("$fn(80, 0) == 80",),
        hidden=("round($fn(200, 10), 6) == 180", "round($fn(50, 50), 6) == 25"),
        behaviour="it must subtract the percentage from the price",
    ),
    # -- missing_edge_case ---------------------------------------------------------------------
    BugTemplate(
        "missing_edge_case",
        "safe_ratio",
        ("safe_ratio", "ratio", "safe_div"),
        'def $fn(a, b):\n    """Return a / b, or 0.0 when b is 0."""\n    @LINE@\n',
        buggy="return a / b",
        fixed="return a / b if b != 0 else 0.0",
        wrong=("return a / b if b > 0 else 0.0", "return 0.0 if a == 0 else a / b"),
        example="$fn($a, 0)",
        visible=("$fn($a * 2, 2) == $a",),
        hidden=("$fn($a, 0) == 0.0", "$fn(6, -3) == -2"),
        behaviour="it must return 0.0 when b is 0",
    ),
    BugTemplate(
        "missing_edge_case",
        "mean_or_zero",
        ("mean_or_zero", "safe_mean", "mean"),
        'def $fn(values):\n    """Return the mean of values, or 0.0 for an empty list."""\n    @LINE@\n',
        buggy="return sum(values) / len(values)",
        fixed="return sum(values) / len(values) if values else 0.0",
        wrong=("return sum(values) / (len(values) + 1)", "return sum(values) // len(values) if values else 0.0"),
        example="$fn([])",
        visible=("$fn([$a, $a]) == $a",),
        hidden=("$fn([]) == 0.0", "$fn([1, 2]) == 1.5"),
        behaviour="an empty list must give 0.0",
    ),
    BugTemplate(
        "missing_edge_case",
        "first_word",
        ("first_word", "head_word", "leading_word"),
        'def $fn(text):\n    """Return the first word of text, or "" if it has no words."""\n    @LINE@\n',
        buggy="return text.split()[0]",
        fixed='return text.split()[0] if text.split() else ""',
        wrong=('return text.split(" ")[0]', 'return text.split()[0] if text else ""'),
        example='$fn("")',
        visible=('$fn("$w is here") == "$w"',),
        hidden=('$fn("") == ""', '$fn("   ") == ""', '$fn("  $w x") == "$w"'),
        behaviour='text without words must give ""',
    ),
    # -- wrong_default -------------------------------------------------------------------------
    BugTemplate(
        "wrong_default",
        "greet",
        ("greet", "greeting_for", "salute"),
        '@LINE@\n    """Greet name; the default greeting is "Hello"."""\n    return f"{greeting}, {name}!"\n',
        buggy='def $fn(name, greeting="Hi"):',
        fixed='def $fn(name, greeting="Hello"):',
        wrong=('def $fn(name, greeting="hello"):', 'def $fn(name, greeting="Hello!"):'),
        example='$fn("$w")',
        visible=('$fn("$w", "Hey") == "Hey, $w!"',),
        hidden=('$fn("$w") == "Hello, $w!"',),
        behaviour='the default greeting must be "Hello"',
    ),
    BugTemplate(
        "wrong_default",
        "chunk",
        ("chunk", "chunks", "split_every"),
        '@LINE@\n    """Split items into lists of size items (default size $k)."""\n'
        "    return [items[i:i + size] for i in range(0, len(items), size)]\n",
        buggy="def $fn(items, size=$bad):",
        fixed="def $fn(items, size=$k):",
        wrong=("def $fn(items, size=$other):", "def $fn(items, size=1):"),
        example="$fn(list(range(2 * $k)))",
        visible=("$fn([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]",),
        hidden=("$fn(list(range(2 * $k))) == [list(range($k)), list(range($k, 2 * $k))]",),
        behaviour="the default size must be $k",
        values=_chunk_values,
    ),
    BugTemplate(
        "wrong_default",
        "rounded",
        ("rounded", "round_to", "to_places"),
        '@LINE@\n    """Round x to digits decimal places (default 2)."""\n    return round(x, digits)\n',
        buggy="def $fn(x, digits=0):",
        fixed="def $fn(x, digits=2):",
        wrong=("def $fn(x, digits=1):", "def $fn(x, digits=3):"),
        example="$fn(3.14159)",
        visible=("$fn(2.5, 1) == 2.5",),
        hidden=("$fn(3.14159) == 3.14", "$fn($a.123) == $a.12"),
        behaviour="the default must be 2 decimal places",
    ),
    # -- inverted_condition --------------------------------------------------------------------
    BugTemplate(
        "inverted_condition",
        "keep_even",
        ("keep_even", "evens", "only_even"),
        'def $fn(values):\n    """Return the even numbers of values, in order."""\n    @LINE@\n',
        buggy="return [v for v in values if v % 2 == 1]",
        fixed="return [v for v in values if v % 2 == 0]",
        wrong=("return [v for v in values if v % 2]", "return [v for v in values if v > 0]"),
        example="$fn([1, 2, 3, 4])",
        visible=("$fn([]) == []",),
        hidden=("$fn([1, 2, 3, 4]) == [2, 4]", "$fn([$a * 2 + 1]) == []"),
        behaviour="it must keep the even numbers and drop the odd ones",
    ),
    BugTemplate(
        "inverted_condition",
        "is_blank",
        ("is_blank", "blank", "is_empty_text"),
        'def $fn(text):\n    """Return True when text is empty or only whitespace."""\n    @LINE@\n',
        buggy='return text.strip() != ""',
        fixed='return text.strip() == ""',
        wrong=('return text == ""', "return len(text) == 0"),
        example='$fn("   ")',
        visible=('isinstance($fn("$w"), bool)',),
        hidden=('$fn("   ") is True', '$fn("$w") is False', '$fn("") is True'),
        behaviour="whitespace-only text is blank",
    ),
    BugTemplate(
        "inverted_condition",
        "clamp",
        ("clamp", "limit", "bound"),
        'def $fn(x, lo, hi):\n    """Limit x to the range [lo, hi]."""\n    if x < lo:\n        return lo\n'
        "    @LINE@\n        return hi\n    return x\n",
        buggy="if x < hi:",
        fixed="if x > hi:",
        wrong=("if x > lo:", "if x >= lo:"),
        example="$fn($mid, $lo, $hi)",
        visible=("$fn($lo - 1, $lo, $hi) == $lo",),
        hidden=("$fn($mid, $lo, $hi) == $mid", "$fn($hi + 3, $lo, $hi) == $hi"),
        behaviour="values inside the range must be returned unchanged",
        values=_clamp_values,
    ),
    # -- wrong_return --------------------------------------------------------------------------
    BugTemplate(
        "wrong_return",
        "min_max",
        ("min_max", "extremes", "low_high"),
        'def $fn(values):\n    """Return (smallest, largest) of a non-empty list."""\n    @LINE@\n',
        buggy="return max(values), min(values)",
        fixed="return min(values), max(values)",
        wrong=("return min(values), min(values)", "return sorted(values)"),
        example="$fn([3, 1, 2])",
        visible=("$fn([$a]) == ($a, $a)",),
        hidden=("$fn([3, 1, 2]) == (1, 3)", "$fn([$a, $a + 5]) == ($a, $a + 5)"),
        behaviour="it must return the smallest value first",
    ),
    BugTemplate(
        "wrong_return",
        "find_index",
        ("find_index", "index_of", "position"),
        'def $fn(items, target):\n    """Return the index of target in items, or -1 if absent."""\n'
        "    for i, item in enumerate(items):\n        if item == target:\n            @LINE@\n    return -1\n",
        buggy="return item",
        fixed="return i",
        wrong=("return i + 1", "return target"),
        example="$fn([5, 6, 7], 6)",
        visible=("$fn([$a, $b], 99) == -1",),
        hidden=("$fn([5, 6, 7], 6) == 1", '$fn(["$w"], "$w") == 0'),
        behaviour="it must return the index, not the item",
    ),
    BugTemplate(
        "wrong_return",
        "count_words",
        ("count_words", "word_count", "num_words"),
        'def $fn(text):\n    """Return the number of words in text."""\n    words = text.split()\n    @LINE@\n',
        buggy="return len(text)",
        fixed="return len(words)",
        wrong=('return len(text.split(" "))', "return len(words) + 1"),
        example='$fn("$w $w2 x")',
        visible=('$fn("") == 0',),
        hidden=('$fn("$w $w2 x") == 3', '$fn("  $w  ") == 1'),
        behaviour="it must count words, not characters",
    ),
)

BY_FAMILY: dict[str, tuple[BugTemplate, ...]] = {
    fam: tuple(t for t in TEMPLATES if t.family == fam) for fam in FAMILIES
}
