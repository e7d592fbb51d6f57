"""KV reuse across turns: a conversation's next turn decodes from the cache of its previous turn instead of
re-encoding the whole conversation.

After a batched `generate`, each row's keys and values (transformers' `DynamicCache`, one tensor pair per
layer, batch × heads × positions × dim) are cut out for the tokens the row really holds — its prompt and what
it sampled, minus the last sampled token, which was never fed back — and kept under those token ids. A later
prompt that extends kept ids (an episode's next turn: the sampled ids verbatim, the template's glue, the tool
output, the next header) takes that entry; only the new suffix is prefilled.

Rows with and without a kept prefix share one batch. Each row is laid out as
`[pad × (C − c)] [kept c] [pad × (N − u)] [new u]` (C = the longest kept prefix, N = the longest new part),
the kept KV is left-padded with zeros to C and masked, and `generate` gets the cache of length C with the full
ids: it prefills the last N positions only. Positions come from the attention mask (cumulative sum), so a
row's positions are 0..len−1 whatever its padding, the same positions its kept keys were rotated with. The
result equals a full prefill up to float rounding (greedy tokens identical; logprobs within ~1e-6 on CPU).

Why a per-row `DynamicCache` rather than a paged engine: the local policy is transformers' `generate` on
CPU or one GPU (vLLM is the engine for scale, `vllm_policy.py`, with its own prefix cache); per-row slices
need no kernel support and work for every model whose cache is a plain `DynamicCache` (anything else —
sliding-window or hybrid caches — is detected and decodes without reuse). Memory is bounded in bytes and
entries expire by age; an entry is handed out once (the conversation moves on and is kept again after its
next turn), least recently kept first out. Kept KV belongs to the weights it was computed with: the policy
clears the cache whenever a parameter changed in place (an optimizer step, a loaded state dict: torch's
per-tensor version counters) or the model object was replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Entry:
    ids: list[int]
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each 1 × heads × len(ids) × dim
    nbytes: int
    kept_at: float = field(default_factory=time.monotonic)


@dataclass
class ReuseStats:
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    evicted: int = 0


class TurnCache:
    """The kept per-conversation KV of recent turns, bounded by `max_bytes` and `max_age_seconds`."""

    def __init__(self, max_bytes: int = 1 << 30, max_age_seconds: float = 600.0) -> None:
        self.max_bytes, self.max_age_seconds = max_bytes, max_age_seconds
        self.entries: list[_Entry] = []  # oldest first
        self.nbytes = 0
        self.stats = ReuseStats()
        self.lock = threading.Lock()

    def take(self, prompt: list[int]) -> _Entry | None:
        """The entry whose ids are the longest strict prefix of `prompt` (removed), or None."""
        with self.lock:
            self._expire()
            best = None
            for entry in self.entries:
                n = len(entry.ids)
                if n < len(prompt) and (best is None or n > len(best.ids)) and prompt[:n] == entry.ids:
                    best = entry
            if best is None:
                self.stats.misses += 1
                self.stats.prefilled_tokens += len(prompt)
                return None
            self.entries.remove(best)
            self.nbytes -= best.nbytes
            self.stats.hits += 1
            self.stats.reused_tokens += len(best.ids)
            self.stats.prefilled_tokens += len(prompt) - len(best.ids)
            return best

    def keep(self, ids: list[int], layers: list[tuple[Any, Any]]) -> None:
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        with self.lock:
            self.entries.append(_Entry(ids, layers, nbytes))
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes:
                self._drop(self.entries[0])

    def clear(self) -> None:
        with self.lock:
            self.stats.evicted += len(self.entries)
            self.entries, self.nbytes = [], 0

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.max_age_seconds
        for entry in [e for e in self.entries if e.kept_at < cutoff]:
            self._drop(entry)

    def _drop(self, entry: _Entry) -> None:
        self.entries.remove(entry)
        self.nbytes -= entry.nbytes
        self.stats.evicted += 1


def plain_layers(cache: Any) -> list[Any] | None:
    """The cache's layers when it is a plain `DynamicCache` of full-attention layers, else None (no reuse)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if keys is None or getattr(keys, "dim", lambda: 0)() != 4 or getattr(layer, "is_sliding", False):
            return None
    return list(layers)


def batch_inputs(prompts: list[list[int]], kept: Sequence[_Entry | None], pad: int, device: Any):
    """(input ids, attention mask, cache or None, width, per-row segments of real positions) for one batch.

    Segments: the (start, end) position ranges of a row's real tokens in the batch (the caller extends the
    last one by the tokens it generates)."""
    import torch
    from transformers import DynamicCache

    reused = [len(e.ids) if e is not None else 0 for e in kept]
    longest = max(reused)
    rest = [len(p) - c for p, c in zip(prompts, reused)]
    new_width = max(rest)
    rows, masks, segments = [], [], []
    for prompt, c, u in zip(prompts, reused, rest):
        gap = new_width - u
        rows.append([pad] * (longest - c) + prompt[:c] + [pad] * gap + prompt[c:])
        masks.append([0] * (longest - c) + [1] * c + [0] * gap + [1] * u)
        segments.append(([(longest - c, longest)] if c else []) + [(longest + gap, longest + new_width)])
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor(masks, dtype=torch.long, device=device)
    if not longest:
        return ids, mask, None, longest + new_width, segments
    cache = DynamicCache()
    template = next(e for e in kept if e is not None).layers
    for index, (k0, v0) in enumerate(template):
        keys, values = [], []
        for entry, c in zip(kept, reused):
            if entry is None:
                keys.append(k0.new_zeros(1, k0.shape[1], longest, k0.shape[3]))
                values.append(v0.new_zeros(1, v0.shape[1], longest, v0.shape[3]))
                continue
            k, v = entry.layers[index]
            fill = longest - c
            keys.append(torch.cat([k.new_zeros(1, k.shape[1], fill, k.shape[3]), k], dim=2) if fill else k)
            values.append(torch.cat([v.new_zeros(1, v.shape[1], fill, v.shape[3]), v], dim=2) if fill else v)
        cache.update(torch.cat(keys, dim=0), torch.cat(values, dim=0), index)
    return ids, mask, cache, longest + new_width, segments


def row_layers(layers: list[Any], row: int, segments: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
    """Row `row`'s keys and values at its real positions (`segments`), contiguous."""
    import torch

    out = []
    for layer in layers:
        keys = [layer.keys[row : row + 1, :, a:b] for a, b in segments if b > a]
        values = [layer.values[row : row + 1, :, a:b] for a, b in segments if b > a]
        out.append((torch.cat(keys, dim=2).clone(), torch.cat(values, dim=2).clone()))
    return out


def weights_stamp(model: Any) -> tuple[int, int]:
    """Changes whenever any parameter is modified in place or the model is replaced (torch's version counters)."""
    return id(model), sum(p._version for p in model.parameters())


__all__ = ["ReuseStats", "TurnCache", "batch_inputs", "plain_layers", "row_layers", "weights_stamp"]
