"""The default policy model: a tiny Qwen3-MoE-family causal LM and a tokenizer built on this machine.

Nothing here downloads anything. `build_tokenizer` trains a byte-level BPE on a corpus generated from
the tool-call protocol and the built-in task suites (deterministic: same corpus, same vocabulary) and
wraps it as a `PreTrainedTokenizerFast` with a chat template. `build_tiny_model` instantiates
`Qwen3MoeForCausalLM` from a `Qwen3MoeConfig`; production swaps in any `from_pretrained` path through
`load_policy_model`, which is also what loads our own checkpoints (the same code path).

Chat format. Every role header and the end-of-turn marker are special tokens:
    <|system|>...<|end|><|user|>...<|end|><|assistant|>...<|end|><|tool|>...<|end|>
Added tokens split the text *before* BPE, so tokenizing a whole rendered conversation gives exactly
the ids of tokenizing each message on its own and concatenating. That is what lets
`rendering.render_trajectory` tag every token with its role while staying identical to
`tokenizer.apply_chat_template`. `<tool_call>` and `</tool_call>` are single (non-special) tokens, so
the local policy stops on one id.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

PAD = "<|pad|>"
END = "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
SPECIAL_TOKENS = [PAD, END, *ROLE_TOKENS.values()]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class TokenizerConfig(BaseModel):
    """How the local tokenizer is trained (the vocabulary is a function of these fields only)."""

    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary size including bytes and special tokens.")
    corpus_recipes: list[str] = Field(
        default_factory=lambda: ["swe"], description="Recipes whose generated tasks are added to the corpus."
    )
    corpus_tasks: int = Field(64, ge=0, description="Tasks per recipe and split rendered into the corpus.")
    min_frequency: int = Field(2, ge=1, description="Minimum pair frequency for a BPE merge.")


class ModelConfig(BaseModel):
    """The tiny Qwen3-MoE policy. Defaults train at a few thousand tokens/s on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid")
    hidden_size: int = Field(128, ge=16, description="Residual stream width.")
    num_hidden_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(2, ge=1, description="KV heads (grouped-query attention).")
    head_dim: int = Field(32, ge=8, description="Per-head width.")
    intermediate_size: int = Field(256, ge=16, description="Dense MLP width (unused unless mlp_only_layers).")
    moe_intermediate_size: int = Field(128, ge=16, description="Width of each expert's MLP.")
    num_experts: int = Field(4, ge=1, description="Experts per MoE layer.")
    num_experts_per_tok: int = Field(2, ge=1, description="Experts routed per token (top-k).")
    router_aux_loss_coef: float = Field(0.001, ge=0.0, description="Load-balancing loss weight.")
    max_position_embeddings: int = Field(4096, ge=128, description="Longest sequence the RoPE is set up for.")
    tie_word_embeddings: bool = Field(True, description="Share input and output embeddings (fewer params).")
    seed: int = Field(0, description="Seed of the weight initialisation.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer to build.")


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
_PROTOCOL_EXAMPLES = [
    {"name": "bash", "arguments": {"command": "ls"}},
    {"name": "bash", "arguments": {"command": "python -m pytest -q"}},
    {"name": "bash", "arguments": {"command": "cat README.md"}},
    {"name": "bash", "arguments": {"command": "grep -rn def ."}},
    {"name": "read_file", "arguments": {"path": "src/module.py"}},
    {"name": "write_file", "arguments": {"path": "src/module.py", "content": "def f(x):\n    return x\n"}},
    {"name": "str_replace", "arguments": {"path": "src/module.py", "old": "return x - 1", "new": "return x"}},
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
        yield f"I will use {call['name']}.\n{TOOL_CALL_OPEN}{json.dumps(call)}{TOOL_CALL_CLOSE}"
    for _ in range(4):  # weight the code sample so its merges outrank one-off strings
        yield _PYTHON_TEXT
    for recipe_name in config.corpus_recipes:
        yield from _recipe_corpus(recipe_name, config.corpus_tasks)


def _recipe_corpus(recipe_name: str, n: int) -> Iterator[str]:
    if n == 0:
        return
    from components.recipes import get_recipe

    recipe = get_recipe(recipe_name)
    tools = [spec.openai() for spec in recipe.tools()]
    yield json.dumps(tools)
    for split in ("train", "heldout"):
        for task in recipe.tasks(split, n, seed=0):
            yield recipe.system_prompt(task)
            yield task.prompt
            yield from task.environment.files.values()
            if task.reference_solution:
                yield task.reference_solution


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
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast


def load_tokenizer(path: str | Path):
    """Load a saved tokenizer (ours or any hub-format tokenizer directory)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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
        head_dim=config.head_dim,
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


def build_policy(config: ModelConfig | None = None):
    """(model, tokenizer) for a fresh tiny policy."""
    config = config or ModelConfig()
    tokenizer = build_tokenizer(config.tokenizer)
    return build_tiny_model(config, tokenizer), tokenizer


def save_policy(model, tokenizer, out_dir: str | Path) -> Path:
    """Write model and tokenizer with `save_pretrained` (safetensors) so `load_policy_model` reads them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def load_policy_model(path: str | Path, device: str = "cpu"):
    """Any causal LM directory through `AutoModelForCausalLM.from_pretrained` (ours or a production model)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{path} is not a model directory (no config.json); pass a directory written by save_policy "
            "or any local from_pretrained checkpoint"
        )
    model = AutoModelForCausalLM.from_pretrained(str(path))
    return model.to(device)


def load_policy(path: str | Path, device: str = "cpu"):
    """(model, tokenizer) from one checkpoint directory."""
    return load_policy_model(path, device), load_tokenizer(path)


def model_fingerprint(model) -> str:
    """A short content hash of the weights (identifies a policy that has no directory)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
