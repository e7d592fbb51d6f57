"""A policy backed by a local transformers causal LM (the tiny default model or any from_pretrained dir).

Generation runs under `torch.no_grad` with the KV cache, stops on `</tool_call>` or end-of-turn, and
returns the ids exactly as sampled (`Generation.token_ids`). The prompt is built by
`rendering.render_prompt`, with the policy's own earlier turns re-used as the ids it sampled, so the
token stream it generates from is the one RL later trains on.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

from components.core.modeling import END, PAD, ROLE_TOKENS, TOOL_CALL_CLOSE, load_policy, model_fingerprint
from components.core.policy_base import ChatMessage, Generation, GenerationConfig
from components.core.rendering import render_prompt

_SAMPLED_CACHE = 4096  # assistant turns remembered per policy (a few episodes' worth)


def _dir_fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for weights in sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin")):
        with open(weights, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


class LocalTransformersPolicy:
    """`Policy` over a local causal LM. `model_or_path`: a model object or a checkpoint directory."""

    def __init__(self, model_or_path: Any, tokenizer: Any = None, device: str = "cpu",
                 max_context_tokens: int | None = None) -> None:
        if isinstance(model_or_path, (str, Path)):
            path = Path(model_or_path)
            model, loaded_tokenizer = load_policy(path, device)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
            self.policy_id = f"local:{path.name}@{_dir_fingerprint(path)}"
        else:
            if tokenizer is None:
                raise ValueError("a model object needs its tokenizer: LocalTransformersPolicy(model, tokenizer)")
            model = model_or_path.to(device)
            self.policy_id = f"local:{model_fingerprint(model)}"
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_context_tokens = max_context_tokens or int(getattr(model.config, "max_position_embeddings", 4096))
        vocab = tokenizer.get_vocab()
        self._stop_ids = [vocab[END]] + ([vocab[TOOL_CALL_CLOSE]] if TOOL_CALL_CLOSE in vocab else [])
        # A turn may not open another turn: role headers and padding are never sampled.
        self._suppress = [vocab[t] for t in [PAD, *ROLE_TOKENS.values()] if t in vocab]
        self._sampled: OrderedDict[str, list[int]] = OrderedDict()

    def prompt_ids(self, messages: list[ChatMessage]) -> list[int]:
        return render_prompt(messages, self.tokenizer, sampled_ids=self._sampled)

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        import torch

        prompt = self.prompt_ids(messages)
        budget = self.max_context_tokens - len(prompt)
        if budget <= 0:
            return Generation(text="", token_ids=[], prompt_tokens=len(prompt), finish_reason="length",
                              raw={"reason": f"prompt of {len(prompt)} tokens fills the context "
                                             f"({self.max_context_tokens})"})
        max_new = min(config.max_new_tokens, budget)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            eos_token_id=self._stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            suppress_tokens=self._suppress or None,
            use_cache=True,
        )
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        extra_stops = [s for s in config.stop if s not in (TOOL_CALL_CLOSE, END)]
        if extra_stops:
            kwargs.update(stop_strings=extra_stops, tokenizer=self.tokenizer)

        rng = torch.random.fork_rng() if config.seed is not None else contextlib.nullcontext()
        self.model.eval()
        with rng, torch.no_grad():
            if config.seed is not None:
                torch.manual_seed(config.seed)
            input_ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        new_ids = out[0, len(prompt):].tolist()
        finished = bool(new_ids) and new_ids[-1] in self._stop_ids
        text_ids = new_ids[:-1] if new_ids and new_ids[-1] == self._stop_ids[0] else new_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        if extra_stops and not finished:
            finished = any(text.endswith(s) for s in extra_stops)
        self._remember(text, new_ids)
        return Generation(
            text=text,
            token_ids=new_ids,
            prompt_tokens=len(prompt),
            completion_tokens=len(new_ids),
            finish_reason="stop" if finished else "length",
        )

    def _remember(self, text: str, ids: list[int]) -> None:
        self._sampled[text] = ids
        self._sampled.move_to_end(text)
        while len(self._sampled) > _SAMPLED_CACHE:
            self._sampled.popitem(last=False)

    def generate_batch(self, conversations: list[list[ChatMessage]],
                       configs: list[GenerationConfig] | GenerationConfig) -> list[Generation]:
        """One left-padded batched `model.generate` for several conversations; per row the ids exactly as
        sampled, cut at that row's own stop (`</tool_call>` / end-of-turn) or `max_new_tokens`, and their
        logprobs under the sampling temperature (raw logits / T, before top-p; greedy: T = 1).

        Rows must share temperature, top_p and stop strings (`BatchingPolicy` groups them that way).
        Sampling draws from one RNG per batch, seeded with the first row's seed, so a sampled row depends
        on which rows it was batched with (a single row samples exactly as `generate`)."""
        import torch

        if isinstance(configs, GenerationConfig):
            configs = [configs] * len(conversations)
        if len(configs) != len(conversations):
            raise ValueError(f"{len(conversations)} conversations but {len(configs)} generation configs")
        if not conversations:
            return []
        first = configs[0]
        if any((c.temperature, c.top_p, c.stop) != (first.temperature, first.top_p, first.stop) for c in configs):
            raise ValueError("generate_batch needs one temperature/top_p/stop for every row; group rows by them "
                             "(BatchingPolicy does) or call generate per row")
        prompts = [self.prompt_ids(m) for m in conversations]
        results: list[Generation | None] = [None] * len(prompts)
        live: list[int] = []
        for i, prompt in enumerate(prompts):
            if self.max_context_tokens - len(prompt) <= 0:
                results[i] = Generation(text="", token_ids=[], prompt_tokens=len(prompt), finish_reason="length",
                                        raw={"reason": f"prompt of {len(prompt)} tokens fills the context "
                                                       f"({self.max_context_tokens})"})
            else:
                live.append(i)
        if not live:
            return results  # type: ignore[return-value]
        caps = {i: min(configs[i].max_new_tokens, self.max_context_tokens - len(prompts[i])) for i in live}
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(caps.values()), eos_token_id=self._stop_ids, pad_token_id=self.tokenizer.pad_token_id,
            suppress_tokens=self._suppress or None, use_cache=True, return_dict_in_generate=True,
            output_logits=True)
        if getattr(self.model.config, "output_router_logits", False):
            # MoE models trained with the router aux loss would compute it on every decode step, and
            # transformers' version breaks on a padded batch's mask (shape mismatch); generation needs no loss.
            kwargs["output_router_logits"] = False
        if first.temperature > 0:
            kwargs.update(do_sample=True, temperature=first.temperature, top_p=first.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        extra_stops = [s for s in first.stop if s not in (TOOL_CALL_CLOSE, END)]
        if extra_stops:
            kwargs.update(stop_strings=extra_stops, tokenizer=self.tokenizer)
        width = max(len(prompts[i]) for i in live)
        pad = self.tokenizer.pad_token_id
        # Left padding: every row's last prompt token sits at the same position, where decoding starts.
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in live], dtype=torch.long,
                           device=self.device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in live],
                            dtype=torch.long, device=self.device)
        seed = next((c.seed for c in configs if c.seed is not None), None)
        rng = torch.random.fork_rng() if seed is not None else contextlib.nullcontext()
        self.model.eval()
        with rng, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            new = out.sequences[:, width:]
            scale = first.temperature if first.temperature > 0 else 1.0
            # Only the sampled token's logprob is kept per step (the full distribution is vocab-sized).
            picked = torch.stack([torch.log_softmax(step.float() / scale, dim=-1).gather(
                -1, new[:, t:t + 1]).squeeze(-1) for t, step in enumerate(out.logits)], dim=1)
        for row, i in enumerate(live):
            row_ids = new[row].tolist()[: caps[i]]
            cut = next((k + 1 for k, tok in enumerate(row_ids) if tok in self._stop_ids), None)
            if cut is None and pad in row_ids:  # finished on a stop string: the rest is padding
                cut = row_ids.index(pad)
            row_ids = row_ids[:cut] if cut is not None else row_ids
            results[i] = self._finish(row_ids, picked[row, : len(row_ids)].tolist(), len(prompts[i]), extra_stops)
        return results  # type: ignore[return-value]

    def _finish(self, new_ids: list[int], logprobs: list[float], prompt_tokens: int,
                extra_stops: list[str]) -> Generation:
        finished = bool(new_ids) and new_ids[-1] in self._stop_ids
        text_ids = new_ids[:-1] if new_ids and new_ids[-1] == self._stop_ids[0] else new_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        if extra_stops and not finished:
            finished = any(text.endswith(s) for s in extra_stops)
        self._remember(text, new_ids)
        # `Generation.logprobs` arrives with the model-native rendering change; until then they ride in `raw`.
        extra: dict[str, Any] = ({"logprobs": logprobs} if "logprobs" in Generation.model_fields
                                 else {"raw": {"logprobs": logprobs}})
        return Generation(text=text, token_ids=new_ids, prompt_tokens=prompt_tokens, completion_tokens=len(new_ids),
                          finish_reason="stop" if finished else "length", **extra)
