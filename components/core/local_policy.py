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
