"""Rollout throughput: SWE episodes one at a time (old path) vs N in parallel through `BatchingPolicy`, without
and with KV reuse across turns (`components/core/policy/kv_reuse.py`: each turn decodes from its conversation's kept
cache instead of re-encoding the conversation).

    PYTHONPATH=$PWD python scripts/bench_rollout.py --episodes 16 --repeats 3

Both paths run the same tiny policy (random init: it calls tools badly and episodes run to max_steps, which
is what a policy early in RL does) on the same SWE tasks in real sandboxes of an embedded service, with the
same harness limits and sampling settings. The paths alternate within each repeat so load drifts hit both;
the table gives medians over repeats of episodes/minute and generated tokens/s, and their ratio, and
each repeat's line how much of the path's wall time was generation (the rest is sandbox work: creation,
setup, tool execs, verification) and how the model's forward time splits into prefill (calls over more
than one new position: a prompt, or with KV reuse only its new suffix) and decode (one position per row).
Each path's CPU time (the whole machine's busy time from /proc/stat while it ran: the policy, the sandbox
service, its sandboxes and anything else running) gives the most its wall time could shrink: on C cores a path
that did S CPU-seconds of work needs at least S / C seconds, so `ceiling` = the old path's wall / (S / C) is the
largest ratio the path could reach on this machine without doing less work.
`--threads` sets torch's threads for both paths (default: torch's, as the
old path ran); the batched path decodes with `--generation-threads` (default: BatchingPolicy's, half the CPUs).
Needs what the embedded service needs (root, or an external service via ORCHARD_SANDBOX_URL/TOKEN and --external).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import contextlib
import os
import statistics
import threading
import time


def _tokens(trajectories) -> int:
    return sum(len(s.token_ids or []) for t in trajectories for s in t.steps if s.role == "assistant")


def _busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (every CPU, all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _generation_seconds(trajectories) -> float:
    return sum(t.metadata["policy_seconds"] for t in trajectories)


class ForwardClock:
    """Wall time of the model's forward calls, split into prefill (more than one new position) and decode
    (one), from hooks on the model: generate() calls the module once per step, on whichever thread decodes."""

    def __init__(self, model) -> None:
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self.positions = {"prefill": 0, "decode": 0}
        self._started = {}
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else (args[0] if args else None)
        self._started[threading.get_ident()] = (time.perf_counter(), tuple(ids.shape) if ids is not None else (0, 0))

    def _post(self, module, args, kwargs, output):
        start, (rows, width) = self._started.pop(threading.get_ident())
        kind = "prefill" if width > 1 else "decode"
        self.seconds[kind] += time.perf_counter() - start
        self.positions[kind] += rows * width

    def take(self) -> dict:
        """The totals since the last call (one path's share), then start again from zero."""
        out = {f"{k}_seconds": round(v, 2) for k, v in self.seconds.items()}
        out.update({f"{k}_positions": v for k, v in self.positions.items()})
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self.positions = {"prefill": 0, "decode": 0}
        return out


def run(
    episodes: int,
    repeats: int,
    max_steps: int,
    max_new_tokens: int,
    threads: int | None,
    connection,
    window: float = 0.05,
    generation_threads: int | None = None,
    model_path: str | None = None,
) -> dict:
    import torch

    from components.core.policy.batching import BatchingPolicy
    from components.core.episode.harness import HarnessConfig, run_episode
    from components.core.policy.local import LocalTransformersPolicy
    from components.core.policy.modeling import ModelConfig, TokenizerConfig
    from components.tiny_model import build_tiny_model, build_tokenizer
    from components.core.policy.base import GenerationConfig
    from components.recipes import get_recipe

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    if model_path:  # e.g. smollm2-135m-instruct (a named model: its converted checkpoint, cached by make smol-model)
        from components.core.policy.modeling import load_policy

        model, tokenizer = load_policy(model_path)
    else:
        tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=8))
        model = build_tiny_model(ModelConfig(), tokenizer)
    clock = ForwardClock(model)
    policy = LocalTransformersPolicy(model, tokenizer, kv_reuse=False)
    reusing = LocalTransformersPolicy(model, tokenizer)
    recipe = get_recipe("swe")
    tasks = recipe.tasks("train", episodes, seed=0)
    harness = HarnessConfig(
        max_steps=max_steps, generation=GenerationConfig(max_new_tokens=max_new_tokens, temperature=1.0)
    )

    def configs(repeat: int) -> list[HarnessConfig]:
        return [
            harness.model_copy(update={"generation": harness.generation.model_copy(update={"seed": repeat * 1000 + i})})
            for i in range(episodes)
        ]

    rows: dict[str, list[tuple[float, float, int]]] = {"old": [], "new": [], "kv": []}
    forward: dict[str, list[dict]] = {"old": [], "new": [], "kv": []}
    cpu: dict[str, list[float]] = {"old": [], "new": [], "kv": []}

    def batched(base, repeat: int):
        with BatchingPolicy(
            base, max_batch=episodes, window_seconds=window, generation_threads=generation_threads
        ) as batching:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(max_workers=episodes) as pool:
                done = list(
                    pool.map(
                        lambda th: run_episode(th[0], recipe, batching, client, th[1]), zip(tasks, configs(repeat))
                    )
                )
            return done, time.perf_counter() - t0, batching.batch_sizes, batching.busy_seconds

    with connection.client() as client:
        for repeat in range(repeats):
            t0 = time.perf_counter()
            clock.take()
            c0 = _busy_seconds()
            old = [run_episode(t, recipe, policy, client, h) for t, h in zip(tasks, configs(repeat))]
            rows["old"].append((time.perf_counter() - t0, _tokens(old), len(old)))
            forward["old"].append(clock.take())
            c1 = _busy_seconds()
            new, wall, sizes, busy = batched(policy, repeat)
            rows["new"].append((wall, _tokens(new), len(new)))
            forward["new"].append(clock.take())
            c2 = _busy_seconds()
            before = dataclasses.replace(reusing.turns.stats)
            kv, kv_wall, kv_sizes, kv_busy = batched(reusing, repeat)
            rows["kv"].append((kv_wall, _tokens(kv), len(kv)))
            forward["kv"].append(clock.take())
            cpu["old"].append(c1 - c0)
            cpu["new"].append(c2 - c1)
            cpu["kv"].append(_busy_seconds() - c2)
            stats = reusing.turns.stats
            errors = sum(t.outcome.value == "infra_error" for t in old + new + kv)
            print(
                f"repeat {repeat}: old {rows['old'][-1][0]:.1f}s ({_generation_seconds(old):.1f}s generating) "
                f"{rows['old'][-1][1]} tok | batched {wall:.1f}s {rows['new'][-1][1]} tok, {len(sizes)} batches "
                f"(mean {statistics.mean(sizes):.1f} rows, {busy:.1f}s generating) | batched+kv {kv_wall:.1f}s "
                f"{rows['kv'][-1][1]} tok ({kv_busy:.1f}s generating; prefilled "
                f"{stats.prefilled_tokens - before.prefilled_tokens} tokens, reused "
                f"{stats.reused_tokens - before.reused_tokens}) | CPU s old / batched / +kv "
                f"{cpu['old'][-1]:.1f} / {cpu['new'][-1]:.1f} / {cpu['kv'][-1]:.1f} | infra errors {errors} | "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            print(
                "  forward time, prefill / decode: "
                + " | ".join(
                    f"{name} {f['prefill_seconds']:.1f}s ({f['prefill_positions']} positions) / {f['decode_seconds']:.1f}s "  # noqa: E501
                    f"({f['decode_positions']} positions)"
                    for name, f in ((n, forward[n][-1]) for n in forward)
                ),
                flush=True,
            )
    out = {}
    cores = len(os.sched_getaffinity(0))
    for name, runs in rows.items():
        out[name] = {
            "episodes_per_min": statistics.median(n / s * 60 for s, _, n in runs),
            "cpu_seconds": statistics.median(cpu[name]),
            # per repeat: the old path's wall over the least wall this path's CPU work allows
            "ceiling": statistics.median(old_wall / (c / cores) for (old_wall, _, _), c in zip(rows["old"], cpu[name])),
            "tokens_per_s": statistics.median(k / s for s, k, _ in runs),
            "prefill_seconds": statistics.median(f["prefill_seconds"] for f in forward[name]),
            "decode_seconds": statistics.median(f["decode_seconds"] for f in forward[name]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16, help="episodes per path and repeat (= parallel episodes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=3, help="assistant turns per episode")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--window", type=float, default=0.05, help="BatchingPolicy window (s)")
    parser.add_argument(
        "--generation-threads",
        type=int,
        default=None,
        help="torch threads of the batched path's decode (default: BatchingPolicy's)",
    )
    parser.add_argument("--external", action="store_true", help="use ORCHARD_SANDBOX_URL/TOKEN")
    parser.add_argument("--model", default=None, help="checkpoint dir or named model (default: the tiny model)")
    args = parser.parse_args(argv)
    from sandbox_service.connection import SandboxConnection

    with contextlib.ExitStack() as stack:
        if args.external:
            connection = SandboxConnection()
        else:
            from sandbox_service.embedded import EmbeddedService

            connection = stack.enter_context(EmbeddedService()).connection()
        result = run(
            args.episodes,
            args.repeats,
            args.max_steps,
            args.max_new_tokens,
            args.threads,
            connection,
            args.window,
            args.generation_threads,
            args.model,
        )
    print(
        f"\n{'path':<34}{'episodes/min':>14}{'gen tokens/s':>14}{'prefill s':>11}{'decode s':>10}{'CPU s':>8}"
        f"{'ceiling':>9}"
    )
    for name, label in (
        ("old", "old: one episode at a time"),
        ("new", f"new: {args.episodes} in parallel, batched"),
        ("kv", "new + KV reuse across turns"),
    ):
        r = result[name]
        print(
            f"{label:<34}{r['episodes_per_min']:>14.1f}{r['tokens_per_s']:>14.1f}{r['prefill_seconds']:>11.1f}"
            f"{r['decode_seconds']:>10.1f}{r['cpu_seconds']:>8.1f}{r['ceiling']:>8.2f}x"
        )
    for name in ("new", "kv"):
        print(
            f"{f'ratio {name}/old':<34}{result[name]['episodes_per_min'] / result['old']['episodes_per_min']:>14.2f}"
            f"{result[name]['tokens_per_s'] / result['old']['tokens_per_s']:>14.2f}"
        )
    import torch

    from components.core.policy.batching import default_generation_threads

    print(
        "(ceiling: the old path's wall time over the least time this path's CPU-seconds allow on "
        f"{len(os.sched_getaffinity(0))} cores; the ratio can only pass it by doing less work)"
    )
    print(
        f"(medians of {args.repeats} repeats; torch threads {torch.get_num_threads()}, batched decode "
        f"{args.generation_threads or default_generation_threads()}; "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
