"""A policy backed by a local transformers causal LM (the tiny default model or any from_pretrained dir).

The prompt is the model's own chat template (`rendering.render_prompt`, tools through `tools=` when the
template takes them), with the policy's earlier turns re-used as the ids it sampled, so the token
stream it generates from is the one RL later trains on. Generation runs under `torch.inference_mode` with the
KV cache and stops on the tokenizer's end-of-turn token; it returns the ids exactly as sampled and the
log-probability of each under the sampling distribution (temperature applied), tagged with the
tokenizer's fingerprint so training can tell they belong to this vocabulary.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

from components.core.policy.kv_reuse import TurnCache, batch_inputs, plain_layers, row_layers, weights_stamp
from components.core.policy.modeling import LoadOptions, load_policy, model_fingerprint, resolve_device
from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.tokens import PrefixCache, chat_format, render_prompt


def _dir_fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for weights in sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin")):
        with open(weights, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


class LocalTransformersPolicy:
    """`Policy` over a local causal LM. `model_or_path`: a model object or a checkpoint directory."""

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        device: str = "cpu",
        max_context_tokens: int | None = None,
        spec: LoadOptions | None = None,
        tool_format: str | None = None,
        kv_reuse: bool = True,
    ) -> None:
        if isinstance(model_or_path, (str, Path)):
            path = Path(model_or_path)
            spec = spec or LoadOptions(device=device)
            model, loaded_tokenizer = load_policy(path, spec=spec)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
            self.policy_id = f"local:{path.name}@{_dir_fingerprint(path)}" if path.is_dir() else f"local:{path}"
            device = resolve_device(spec.device)
        else:
            if tokenizer is None:
                raise ValueError("a model object needs its tokenizer: LocalTransformersPolicy(model, tokenizer)")
            device = resolve_device(device)
            model = model_or_path.to(device)
            self.policy_id = f"local:{model_fingerprint(model)}"
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_context_tokens = max_context_tokens or int(getattr(model.config, "max_position_embeddings", 4096))
        self.format = chat_format(tokenizer, tool_format)  # type: ignore[arg-type]
        self.tool_format = self.format.tool_format
        generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        extra = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        self._stop_ids = sorted(self.format.stop_ids | {i for i in extra if i is not None})
        # A turn may not open another turn: the special tokens of the template's assistant header (and
        # padding) are never sampled.
        probe = [{"role": "user", "content": "x"}]
        header = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)[
            len(tokenizer.apply_chat_template(probe, tokenize=False)) :
        ]
        special = set(tokenizer.all_special_ids)
        suppress = {i for i in tokenizer.encode(header, add_special_tokens=False) if i in special}
        if tokenizer.pad_token_id is not None:
            suppress.add(tokenizer.pad_token_id)
        self._suppress = sorted(suppress - set(self._stop_ids))
        self._cache = PrefixCache()
        # Each conversation's KV between its turns (None: every turn prefills its whole prompt).
        self.turns: TurnCache | None = TurnCache() if kv_reuse else None
        self._turns_stamp: tuple[int, int] | None = None

    def prompt_ids(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return render_prompt(
            messages,
            self.tokenizer,
            tools=tools,
            tool_format=self.tool_format,
            cache=self._cache,
        )

    def generate(
        self, messages: list[ChatMessage], config: GenerationConfig, tools: list[dict[str, Any]] | None = None
    ) -> Generation:
        """One turn: `generate_batch` of one row (a single row samples exactly as a plain `generate` would)."""
        return self.generate_batch([messages], [config], [tools])[0]

    def generate_batch(
        self,
        conversations: list[list[ChatMessage]],
        configs: list[GenerationConfig] | GenerationConfig,
        tools: list[list[dict[str, Any]] | None] | None = None,
    ) -> list[Generation]:
        """One left-padded batched `model.generate` for several conversations; per row the ids exactly as
        sampled, cut at that row's own end-of-turn token or `max_new_tokens`, with their logprobs under the
        sampling distribution (the processed scores, as `generate` reports them).

        Rows must share temperature, top_p and stop strings (`BatchingPolicy` groups them that way).
        Sampling draws from one RNG per batch, seeded with the first row's seed, so a sampled row depends
        on which rows it was batched with (a single row samples exactly as `generate`; greedy rows never
        depend on their batch-mates)."""

        if isinstance(configs, GenerationConfig):
            configs = [configs] * len(conversations)
        tools = tools if tools is not None else [None] * len(conversations)
        if not len(configs) == len(tools) == len(conversations):
            raise ValueError(
                f"{len(conversations)} conversations but {len(configs)} generation configs and {len(tools)} tool lists"
            )
        if not conversations:
            return []
        first = configs[0]
        if any((c.temperature, c.top_p, c.stop) != (first.temperature, first.top_p, first.stop) for c in configs):
            raise ValueError(
                "generate_batch needs one temperature/top_p/stop for every row; group rows by them "
                "(BatchingPolicy does) or call generate per row"
            )
        prompts = [self.prompt_ids(m, t) for m, t in zip(conversations, tools)]
        results: list[Generation | None] = [None] * len(prompts)
        live: list[int] = []
        for i, prompt in enumerate(prompts):
            if self.max_context_tokens - len(prompt) <= 0:
                results[i] = Generation(
                    text="",
                    token_ids=[],
                    logprobs=[],
                    tokenizer_id=self.format.tokenizer_id,
                    prompt_tokens=len(prompt),
                    finish_reason="length",
                    raw={"reason": f"prompt of {len(prompt)} tokens fills the context ({self.max_context_tokens})"},
                )
            else:
                live.append(i)
        if not live:
            return results  # type: ignore[return-value]
        caps = [min(configs[i].max_new_tokens, self.max_context_tokens - len(prompts[i])) for i in live]
        seed = next((c.seed for c in configs if c.seed is not None), None)
        sampled = self._sample([prompts[i] for i in live], caps, first, seed)
        for i, (row_ids, row_logprobs) in zip(live, sampled):
            results[i] = self._finish(row_ids, row_logprobs, len(prompts[i]), first.stop)
        return results  # type: ignore[return-value]

    def _sample(
        self, prompts: list[list[int]], caps: list[int], config: GenerationConfig, seed: int | None
    ) -> list[tuple[list[int], list[float]]]:
        """(ids as sampled, their logprobs) per prompt, each cut after its end-of-turn token or at its cap.

        The one place that samples: a subclass with another engine (`vllm_policy.VLLMPolicy`) overrides it."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._stop_ids[0]
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(caps),
            eos_token_id=self._stop_ids,
            pad_token_id=pad,
            suppress_tokens=self._suppress or None,
            use_cache=True,
            return_dict_in_generate=True,
            output_scores=True,
        )
        if getattr(self.model.config, "output_router_logits", False):
            # MoE models trained with the router aux loss would compute it on every decode step, and
            # transformers' version breaks on a padded batch's mask (shape mismatch); generation needs no loss.
            kwargs["output_router_logits"] = False
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if config.stop:
            kwargs.update(stop_strings=list(config.stop), tokenizer=self.tokenizer)
        # Left padding: every row's last prompt token sits at the same position, where decoding starts. Rows
        # whose earlier turn is kept (`kv_reuse.py`) bring its cache: only what follows it is prefilled.
        if self.turns is not None and (stamp := weights_stamp(self.model)) != self._turns_stamp:
            self.turns.clear()  # kept KV was computed with other weights (an optimizer step, a new model)
            self._turns_stamp = stamp
        kept = [self.turns.take(p) for p in prompts] if self.turns is not None else [None] * len(prompts)
        ids, mask, cache, width, segments = batch_inputs(prompts, kept, pad, self.device)
        if cache is not None:
            kwargs["cache"] = cache
        rng = torch.random.fork_rng() if seed is not None else contextlib.nullcontext()
        self.model.eval()
        with rng, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            new = out.sequences[:, width:]
            # Only the sampled token's logprob is kept per step (the full distribution is vocab-sized).
            picked = torch.stack(
                [
                    torch.log_softmax(score.float(), dim=-1).gather(-1, new[:, t : t + 1]).squeeze(-1)
                    for t, score in enumerate(out.scores)
                ],
                dim=1,
            )
        rows = []
        for row, cap in enumerate(caps):
            row_ids = new[row].tolist()[:cap]
            cut = next((k + 1 for k, tok in enumerate(row_ids) if tok in self._stop_ids), None)
            if cut is None and pad in row_ids:  # finished on a stop string: the rest is padding
                cut = row_ids.index(pad)
            row_ids = row_ids[:cut] if cut is not None else row_ids
            rows.append((row_ids, picked[row, : len(row_ids)].tolist()))
        self._keep_turns(out, prompts, rows, segments)
        return rows

    def _keep_turns(
        self,
        out: Any,
        prompts: list[list[int]],
        rows: list[tuple[list[int], list[float]]],
        segments: list[list[tuple[int, int]]],
    ) -> None:
        """Keep each row's KV (prompt + sampled ids but the last, which was never fed back) for its next turn."""
        if self.turns is None:
            return
        layers = plain_layers(getattr(out, "cache", None))
        if layers is None:  # a cache we cannot slice per row (sliding window, hybrid): decode without reuse
            self.turns = None
            return
        for row, ((row_ids, _), prompt, spans) in enumerate(zip(rows, prompts, segments)):
            if not row_ids:
                continue
            *head, (start, end) = spans
            self.turns.keep(prompt + row_ids[:-1], row_layers(layers, row, [*head, (start, end + len(row_ids) - 1)]))

    def _finish(self, new_ids: list[int], logprobs: list[float], prompt_tokens: int, stop: list[str]) -> Generation:
        finished = bool(new_ids) and new_ids[-1] in self._stop_ids
        text = self.tokenizer.decode(new_ids[:-1] if finished else new_ids, skip_special_tokens=False)
        if stop and not finished:
            finished = any(text.endswith(s) for s in stop)
        return Generation(
            text=text,
            token_ids=new_ids,
            logprobs=logprobs,
            tokenizer_id=self.format.tokenizer_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(new_ids),
            finish_reason="stop" if finished else "length",
        )
