"""Rendering cost of one 16-turn SWE episode with the tiny tokenizer's chat template.

    PYTHONPATH=. python scripts/bench_rendering.py

Prints the time of `render_trajectory` (training) and of the 16 prompts a local policy renders during the
episode, without and with the policy's `PrefixCache` (same run, side by side, median of 3).
"""

from __future__ import annotations

import statistics
import time

from components.core.episode.harness import initial_steps
from components.core.policy.modeling import TokenizerConfig
from components.tiny_model import build_tokenizer
from components.core.rendering.protocol import format_tool_call
from components.core.rendering.tokens import PrefixCache, render_prompt, render_trajectory, steps_as_messages
from components.core.data.schema import Step, ToolCall, Trajectory
from components.recipes import get_recipe
from components.recipes.swe.generator import generate_tasks


def main() -> None:
    tok = build_tokenizer(TokenizerConfig(corpus_tasks=4))
    recipe, task = get_recipe("swe"), generate_tasks("train", 1, 0)[0]
    tools = [t.openai() for t in recipe.tools()]
    steps = initial_steps(task, recipe, "hermes")
    for k in range(16):
        call = ToolCall(id=f"c{k}", name="bash", arguments={"command": f"cat file{k}.py"})
        steps.append(
            Step(index=len(steps), role="assistant", content=f"Look {k}.\n{format_tool_call(call)}", tool_call=call)
        )
        steps.append(
            Step(
                index=len(steps),
                role="tool",
                content="def f(x):\n    return x\n" * 20,
                tool_call_id=call.id,
                tool_name="bash",
            )
        )
    traj = Trajectory(task_id="x", recipe="swe", policy_id="p", steps=steps, tools=tools, outcome="resolved")
    messages = steps_as_messages(steps)

    def timed(fn) -> float:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return 1000 * statistics.median(runs)

    def episode(cache_factory):
        cache = cache_factory()
        for i in range(2, len(messages), 2):
            render_prompt(messages[:i], tok, tools=tools, cache=cache)

    train = timed(lambda: render_trajectory(traj, tok, loss_on="assistant"))
    uncached = timed(lambda: episode(lambda: None))
    cached = timed(lambda: episode(PrefixCache))
    n = len(render_trajectory(traj, tok).input_ids)
    print(
        f"{n} tokens; render_trajectory {train:.0f} ms; episode prompts uncached {uncached:.0f} ms, "
        f"cached {cached:.0f} ms ({uncached / cached:.1f}x)"
    )


if __name__ == "__main__":
    main()
