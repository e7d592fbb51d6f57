"""The default policy: a tiny Qwen3-MoE-family causal LM and a tokenizer built on this machine.

Nothing here downloads anything. `build_tokenizer` trains a byte-level BPE on a corpus generated from
the tool-call protocol and the built-in task suites (deterministic: same corpus, same vocabulary) and
wraps it as a `PreTrainedTokenizerFast` with a chat template. `build_tiny_model` instantiates
`Qwen3MoeForCausalLM` from a `Qwen3MoeConfig`. `init_policy` writes the starting policy of a run: this
model, or any checkpoint (`components.core.policy.modeling` loads both the same way). Above the recipes, because
the vocabulary is learned from their training tasks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from components.core.rendering.chat_templates import CHATML_SPECIAL_TOKENS, CHATML_TOOL_TOKENS
from components.core.policy.modeling import (
    CHAT_TEMPLATE,
    END,
    PAD,
    SPECIAL_TOKENS,
    ModelConfig,
    PolicySpec,
    TokenizerConfig,
    resolve_checkpoint_path,
    load_tokenizer,
    save_policy,
)

_PROTOCOL_EXAMPLES = [
    {"name": "bash", "arguments": {"command": "ls"}},
    {"name": "bash", "arguments": {"command": "python -m pytest -q"}},
    {"name": "bash", "arguments": {"command": "cat README.md"}},
    {"name": "bash", "arguments": {"command": "grep -rn def ."}},
    {"name": "read_file", "arguments": {"path": "src/module.py"}},
    {"name": "write_file", "arguments": {"path": "src/module.py", "content": "def f(x):\n    return x\n"}},
    {"name": "str_replace", "arguments": {"path": "src/module.py", "old_str": "return x - 1", "new_str": "return x"}},
    {"name": "submit", "arguments": {}},
]

_PYTHON_TEXT = '''\
def add(a, b):
    """Return the sum of a and b."""
    return a + b


def clamp(value, low=0, high=10):
    if value < low:
        return low
    if value > high:
        return high
    return value


class Counter:
    def __init__(self, start=0):
        self.count = start

    def increment(self, step=1):
        self.count += step
        return self.count


def test_add():
    assert add(2, 3) == 5


import os
import sys
from pathlib import Path

for i in range(len(items)):
    if items[i] is None or not isinstance(items[i], str):
        continue
    result.append(items[i].strip().lower())
print(f"{name}: {value}")
with open(path, "r") as handle:
    lines = handle.readlines()
raise ValueError("invalid input")
============================= test session starts ==============================
collected 3 items
tests/test_module.py ..F                                                 [100%]
=================================== FAILURES ===================================
E       AssertionError: assert 4 == 5
FAILED tests/test_module.py::test_add - AssertionError
1 failed, 2 passed in 0.03s
3 passed in 0.02s
Traceback (most recent call last):
  File "main.py", line 1, in <module>
NameError: name 'x' is not defined
'''


def _corpus(config: TokenizerConfig) -> Iterator[str]:
    """Text the BPE is trained on: protocol, Python, and the built-in suites' tasks (deterministic)."""
    for call in _PROTOCOL_EXAMPLES:
        yield f"I will use {call['name']}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    for _ in range(4):  # weight the code sample so its merges outrank one-off strings
        yield _PYTHON_TEXT
    for recipe_name in config.corpus_recipes:
        yield from _recipe_corpus(recipe_name, config.corpus_tasks)


def _recipe_corpus(recipe_name: str, n: int) -> Iterator[str]:
    """Training tasks only (held-out tasks, and their fixes, never shape the vocabulary), each also as an
    episode in the chat template: the system prompt with its tool list and the reference solution's tool
    calls as the model will read and write them, so a tool call is a few tokens, not dozens."""
    if n == 0:
        return
    from transformers.utils.chat_template_utils import render_jinja_template

    from components.recipes import get_recipe

    recipe = get_recipe(recipe_name)
    tools: list[dict | Callable] = [spec.openai() for spec in recipe.tools()]  # as render_jinja_template types them
    yield json.dumps(tools)
    for task in recipe.tasks("train", n, seed=0):
        yield task.prompt
        yield from task.environment.files.values()
        if task.reference_solution:
            yield task.reference_solution
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": recipe.system_prompt(task)},
            {"role": "user", "content": task.prompt},
        ]
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": call.arguments}}],
            }
            for call in recipe.reference_calls(task)
        ]
        # transformers annotates the result as str; it returns (renderings, generation indices).
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=CHAT_TEMPLATE)  # type: ignore[str-unpack]
        yield rendered[0]


def build_tokenizer(config: TokenizerConfig | None = None, corpus: Iterable[str] | None = None):
    """Train the byte-level BPE tokenizer and wrap it with specials and the chat template.

    `corpus` overrides the generated corpus (tests use a small one). The result is deterministic for a
    given corpus and config; save it with `save_pretrained` next to the model.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    config = config or TokenizerConfig()
    texts = list(corpus) if corpus is not None else list(_corpus(config))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHATML_TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=[t for t in CHATML_SPECIAL_TOKENS if t != END],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
def hf_config(config: ModelConfig, tokenizer):
    """The transformers `Qwen3MoeConfig` for our tiny model and this tokenizer's vocabulary."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        # not a declared field: the config keeps it as an extra key, which the model reads (getattr)
        head_dim=config.head_dim,  # type: ignore[call-arg]
        moe_intermediate_size=config.moe_intermediate_size,
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        norm_topk_prob=True,
        router_aux_loss_coef=config.router_aux_loss_coef,
        output_router_logits=config.router_aux_loss_coef > 0,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        use_cache=True,
    )


def build_tiny_model(config: ModelConfig | None = None, tokenizer=None):
    """A freshly initialised Qwen3MoeForCausalLM (seeded) sized for `tokenizer` (built if None)."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    config = config or ModelConfig()
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(config.tokenizer)
    torch.manual_seed(config.seed)
    model = Qwen3MoeForCausalLM(hf_config(config, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_policy(config: ModelConfig | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a fresh tiny policy."""
    config = config or ModelConfig()
    tokenizer = build_tokenizer(config.tokenizer)
    return build_tiny_model(config, tokenizer), tokenizer


def init_policy(spec: PolicySpec, tiny: ModelConfig | None, out_dir: str | Path) -> Path:
    """The starting policy in `out_dir`: the checkpoint at `spec.path` (saved as is, with its own template),
    or a fresh tiny model when no path is given. Either way later stages load `out_dir` the same way."""
    import shutil

    from transformers import AutoModelForCausalLM

    if spec.path is None:
        return save_policy(*build_policy(tiny), out_dir)
    source = resolve_checkpoint_path(spec.path, spec.allow_download)
    tokenizer = load_tokenizer(source, allow_download=spec.allow_download)  # no chat template: fail now
    if Path(source).is_dir():  # an exact copy: no dtype round trip, no re-serialisation
        shutil.copytree(source, out_dir, dirs_exist_ok=True)
        return Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto", local_files_only=not spec.allow_download)
    return save_policy(model, tokenizer, out_dir)
