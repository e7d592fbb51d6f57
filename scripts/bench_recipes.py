"""Per-recipe latency on the real sandbox service: sandbox create, recipe setup, one tool step, verify,
next to a bare `exec true` in the same sandbox (the floor every step pays), measured side by side
in one run. Episodes are driven by each recipe's scripted teacher (error rate 0). Verification is
also split into the verifier's phases (SWE's clean room: fork, diff, apply, run).

    .venv/bin/python scripts/bench_recipes.py                      # gui, claw-tools, claw-shell, swe
    .venv/bin/python scripts/bench_recipes.py --recipes claw-tools claw-shell --episodes 8
    .venv/bin/python scripts/bench_recipes.py --recipes swe swe-pytest --episodes 8

`swe-pytest` verifies the same generated tasks as imported (SWE-bench) tasks are: pytest in the clean
room with the canaries planted among the hidden tests (`swe/canaries.py`), instead of the call worker.

Prints a table of medians (and p90 for steps) and writes the raw figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm import tqdm  # noqa: E402

from components.core.policy.base import ChatMessage, GenerationConfig  # noqa: E402
from components.core.rendering.protocol import parse_tool_call  # noqa: E402
from components.recipes import get_recipe  # noqa: E402
from components.recipes.swe import SWERecipe  # noqa: E402
from sandbox_service.embedded import EmbeddedService  # noqa: E402


def make(variant: str):
    """(recipe, teacher) for a variant name."""
    if variant == "gui":
        from components.recipes.gui.teacher import ScriptedTeacher

        return get_recipe("gui"), ScriptedTeacher(error_rate=0.0)
    if variant.startswith("claw-"):
        from components.recipes.claw.teacher import ScriptedTeacher

        harness = variant.split("-", 1)[1]
        return get_recipe("claw", harness=harness), ScriptedTeacher(harness=harness, error_rate=0.0)
    if variant in ("swe", "swe-pytest"):
        from components.recipes.swe.teacher import ScriptedTeacher

        return (get_recipe("swe") if variant == "swe" else _VerifiedAsImported()), ScriptedTeacher(error_rate=0.0)
    raise SystemExit(f"unknown variant {variant!r}; choose gui, claw-tools, claw-shell, swe, swe-pytest")


class _VerifiedAsImported(SWERecipe):
    """Generated SWE tasks with verifier kind `pytest`: the imported (SWE-bench) tasks' verification path."""

    def tasks(self, split, n, seed=0):
        return [
            t.model_copy(update={"verifier": t.verifier.model_copy(update={"kind": "pytest"})})
            for t in super().tasks(split, n, seed)
        ]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def bench_variant(client, variant: str, episodes: int, exec_probes: int, max_steps: int) -> dict:
    recipe, teacher = make(variant)
    figures: dict[str, list[float]] = defaultdict(list)
    per_tool: dict[str, list[float]] = defaultdict(list)
    resolved = 0
    for task in tqdm(recipe.tasks("heldout", episodes), desc=variant, unit="episode"):
        teacher.reset(task)
        t0 = time.perf_counter()
        sandbox = client.create(recipe.sandbox_spec(task))
        figures["create_s"].append(time.perf_counter() - t0)
        try:
            t0 = time.perf_counter()
            recipe.setup(sandbox, task)
            figures["setup_s"].append(time.perf_counter() - t0)
            for _ in range(exec_probes):
                t0 = time.perf_counter()
                sandbox.exec(["true"])
                figures["exec_true_s"].append(time.perf_counter() - t0)
            messages = [
                ChatMessage(role="system", content=recipe.system_prompt(task)),
                ChatMessage(role="user", content=task.prompt),
            ]
            answer = None
            for _ in range(max_steps):
                gen = teacher.generate(messages, GenerationConfig())
                call = parse_tool_call(gen.text)
                t0 = time.perf_counter()
                result = recipe.execute_tool(sandbox, task, call)
                dt = time.perf_counter() - t0
                messages += [
                    ChatMessage(role="assistant", content=gen.text),
                    ChatMessage(role="tool", content=result.output, tool_call_id=call.id, name=call.name),
                ]
                if result.submitted:
                    answer = result.final_answer
                    break
                figures["step_s"].append(dt)
                per_tool[call.name].append(dt)
            t0 = time.perf_counter()
            verdict = recipe.verify(sandbox, task, answer)
            figures["verify_s"].append(time.perf_counter() - t0)
            resolved += verdict.resolved
            # The verifier's own phase times (SWE: fork, diff, apply, run) say where verification's cost goes.
            phases = verdict.verification.seconds if verdict.verification is not None else {}
            for phase, seconds in phases.items():
                figures[f"verify.{phase}_s"].append(seconds)
        finally:
            recipe.release(sandbox)
            sandbox.delete()
    summary = {k: statistics.median(v) for k, v in figures.items()}
    summary["step_p90_s"] = percentile(figures["step_s"], 0.9)
    summary["step_over_exec"] = summary["step_s"] / summary["exec_true_s"]
    summary["steps"] = len(figures["step_s"])
    summary["resolved"] = f"{resolved}/{episodes}"
    return {
        "summary": summary,
        "per_tool_median_s": {k: statistics.median(v) for k, v in per_tool.items()},
        "raw": figures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=["gui", "claw-tools", "claw-shell", "swe"])
    ap.add_argument("--episodes", type=int, default=6, help="held-out episodes per recipe")
    ap.add_argument("--exec-probes", type=int, default=5, help="bare `exec true` calls per sandbox")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--out", default="build/bench_recipes.json")
    args = ap.parse_args()
    results = {}
    with EmbeddedService() as service, service.client() as client:
        for variant in args.recipes:
            results[variant] = bench_variant(client, variant, args.episodes, args.exec_probes, args.max_steps)
    cols = [
        "resolved",
        "create_s",
        "setup_s",
        "exec_true_s",
        "step_s",
        "step_p90_s",
        "step_over_exec",
        "verify_s",
        "steps",
    ]
    print("median seconds (step_over_exec = median step / median bare exec)")
    print(f"{'recipe':<12}" + "".join(f"{c:>15}" for c in cols))
    for variant, r in results.items():
        s = r["summary"]
        print(
            f"{variant:<12}" + "".join(f"{s[c]:>15.3f}" if isinstance(s[c], float) else f"{s[c]!s:>15}" for c in cols)
        )
    for variant, r in results.items():
        phases = {k: v for k, v in r["summary"].items() if k.startswith("verify.")}
        if phases:
            print(
                f"{variant} verification phases (median): "
                + ", ".join(f"{k[7:-2]} {v * 1000:.0f} ms" for k, v in phases.items())
            )
    for variant, r in results.items():
        print(f"{variant} per tool: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["per_tool_median_s"].items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
