"""`BatchingPolicy`: concurrent `generate` calls served by one batched forward.

The harness runs an episode as a plain loop (`run_episode`), one `policy.generate` per turn. Episodes of
a wave run in threads; this wrapper holds each thread's call for at most `window_seconds` so the calls
of every live episode meet, then serves them with one `generate_batch` (a left-padded batched
`model.generate`) on a single dispatcher thread. Calls that arrive while a batch runs wait for the next
one, so a batch is formed from whoever is waiting, without knowing how many episodes are live.

    with BatchingPolicy(LocalTransformersPolicy(model, tokenizer)) as policy:
        with ThreadPoolExecutor(8) as pool:
            trajectories = list(pool.map(lambda t: run_episode(t, recipe, policy, client, harness), tasks))

Rows are grouped by (temperature, top_p, stop) because one `generate` call samples them alike.

A batch runs with `generation_threads` torch intra-op threads (default: half the usable CPUs, at least 1
and at most torch's setting; 1 on 2 cores): while it runs, stragglers
of the wave, the sandbox service and its processes share the cores, and a multi-threaded decode of small
per-token ops waits at every op's thread barrier for a descheduled worker. On the shared 2-core machine, 16
tiny-policy SWE episodes (3 turns) spent 1.8 s in batched generation with 1 thread and 30.9 s with 2
(load ~3). A lone decode on idle cores gains from 2 threads (a 127M model: 90 vs 128 ms per 16-row step),
which is why plain `LocalTransformersPolicy` keeps torch's setting, and the other half of a larger machine
is left to the wave's sandbox work rather than all of it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import threading
import time
from typing import Any

from components.core.policy.base import ChatMessage, Generation, GenerationConfig


@contextlib.contextmanager
def intra_op_threads(threads: int | None):
    """Run the block with `threads` torch intra-op threads (None: as set), restoring the setting after."""
    import torch

    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_generation_threads() -> int:
    """Half the CPUs this process may use (at least 1), at most torch's intra-op setting."""
    import torch

    return max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)) // 2))


def generation_logprobs(gen: Generation) -> list[float] | None:
    """Logprobs of the sampled tokens, if the policy reported them."""
    return gen.logprobs


class BatchingPolicy:
    """A `Policy` that batches concurrent `generate` calls of a policy with `generate_batch`."""

    # 50 ms: episode threads drift apart by their sandbox calls; a batched turn takes ~0.5 s on CPU, so
    # waiting this long for stragglers costs < 10% and gave 5.5x vs 3.7x episodes/min at 5 ms (bench_rollout).
    def __init__(
        self, policy: Any, max_batch: int = 64, window_seconds: float = 0.05, generation_threads: int | None = None
    ):
        if generation_threads is not None and generation_threads < 1:
            raise ValueError(f"generation_threads must be >= 1 or None (half the CPUs), got {generation_threads}")
        if not hasattr(policy, "generate_batch"):
            raise TypeError(
                f"{type(policy).__name__} has no generate_batch; BatchingPolicy wraps local policies "
                "(an endpoint batches on its own server: call it from threads directly)"
            )
        self.policy = policy
        self.max_batch = max_batch
        self.window_seconds = window_seconds
        self.generation_threads = generation_threads or default_generation_threads()
        self.batches = 0  # generate_batch calls made (batch sizes are in `batch_sizes`)
        self.batch_sizes: list[int] = []
        self.busy_seconds = 0.0  # time spent inside generate_batch
        self._queue: queue.Queue[
            tuple[list[ChatMessage], GenerationConfig, list[dict[str, Any]] | None, concurrent.futures.Future] | None
        ] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def policy_id(self) -> str:
        return self.policy.policy_id

    @policy_id.setter
    def policy_id(self, value: str) -> None:  # the RL stage renames the policy after each update
        self.policy.policy_id = value

    @property
    def tool_format(self) -> str:
        """The wrapped policy's tool-call format (so the harness offers tools the same way)."""
        return self.policy.tool_format

    def prompt_ids(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.policy.prompt_ids(messages, tools)

    def generate(
        self, messages: list[ChatMessage], config: GenerationConfig, tools: list[dict[str, Any]] | None = None
    ) -> Generation:
        self._start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((messages, config, tools, future))
        return future.result()

    def generate_batch(
        self,
        conversations: list[list[ChatMessage]],
        configs: list[GenerationConfig] | GenerationConfig,
        tools: list[list[dict[str, Any]] | None] | None = None,
    ) -> list[Generation]:
        return self.policy.generate_batch(conversations, configs, tools)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def __enter__(self) -> BatchingPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="batching-policy", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending = [first]
            deadline = time.monotonic() + self.window_seconds
            stop = False
            while len(pending) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                pending.append(item)
            groups: dict[tuple, list] = {}
            for item in pending:
                cfg = item[1]
                groups.setdefault((cfg.temperature, cfg.top_p, tuple(cfg.stop)), []).append(item)
            for items in groups.values():
                self._run(items)
            if stop:
                return

    def _run(self, items: list) -> None:
        self.batches += 1
        self.batch_sizes.append(len(items))
        start = time.perf_counter()
        try:
            with intra_op_threads(self.generation_threads):
                outs = self.policy.generate_batch(
                    [m for m, _, _, _ in items], [c for _, c, _, _ in items], [t for _, _, t, _ in items]
                )
        except BaseException as err:  # every waiting episode sees the failure (the harness attributes it)
            for *_, future in items:
                future.set_exception(err)
            return
        finally:
            self.busy_seconds += time.perf_counter() - start
        for (*_, future), gen in zip(items, outs):
            future.set_result(gen)
