"""The tiny Qwen3-MoE policy and the locally built tokenizer: determinism, chat format, round trips."""

from __future__ import annotations

import json

import pytest
import torch

from components.core.rendering.chat_templates import CHATML_SPECIAL_TOKENS, CHATML_TOOL_TOKENS
from components.core.policy.modeling import (
    END,
    ModelConfig,
    PolicySpec,
    TokenizerConfig,
    load_policy,
    load_policy_model,
    load_tokenizer,
    model_fingerprint,
    save_policy,
)
from components.tiny_model import build_tiny_model, build_tokenizer, init_policy
from components.core.rendering.tokens import chat_format, render_prompt

CORPUS = [
    'I will look.\n<tool_call>{"name": "bash", "arguments": {"command": "cat mathkit/core.py"}}</tool_call>',
    "def add(a, b):\n    return a + b\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "Bug in `mathkit/core.py`: `add(1, 2)` returns `-1`, expected `3`. Fix `add`.",
] * 3
SMALL = TokenizerConfig(vocab_size=400, corpus_recipes=[])


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(SMALL, corpus=CORPUS)


def test_tokenizer_is_deterministic_and_has_chat_specials(tokenizer):
    again = build_tokenizer(SMALL, corpus=CORPUS)
    assert tokenizer.get_vocab() == again.get_vocab()
    vocab = tokenizer.get_vocab()
    for token in [*CHATML_SPECIAL_TOKENS, *CHATML_TOOL_TOKENS]:
        assert token in vocab
        assert tokenizer.encode(token, add_special_tokens=False) == [vocab[token]]
    assert tokenizer.eos_token == END and tokenizer.pad_token_id != tokenizer.eos_token_id
    text = "x = {'k': [1, 2]}\n\tüñí 🙂 </tool_call>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_equals_piecewise_rendering(tokenizer):
    """The tiny model's template is a real ChatML template with tools, in its tokenizer config."""
    messages = [
        {"role": "system", "content": "You fix bugs.\n"},
        {"role": "user", "content": "   indented\n    text  "},
        {"role": "assistant", "content": 'ok\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": "\n\n  output\n"},
    ]
    templated = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert list(templated) == render_prompt(messages, tokenizer)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou fix bugs.\n<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")
    assert chat_format(tokenizer).tool_format == "hermes" and chat_format(tokenizer).stop_ids == {
        tokenizer.eos_token_id
    }


def test_default_tokenizer_trains_on_builtin_corpus():
    tok = build_tokenizer(TokenizerConfig(corpus_recipes=[]))
    assert 300 < len(tok) <= 2048
    ids = tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    assert len(ids) < 20  # merges learned from code: far fewer ids than bytes (32)


def test_recipe_corpus_holds_training_episodes_and_no_heldout_task():
    from components.tiny_model import _recipe_corpus
    from components.recipes import get_recipe

    recipe = get_recipe("swe")
    corpus = "\n".join(_recipe_corpus("swe", 4))
    heldout = recipe.tasks("heldout", 4, seed=0)
    assert not any(t.prompt in corpus or t.reference_solution in corpus for t in heldout)
    train = recipe.tasks("train", 4, seed=0)[0]
    fix = train.metadata["fix"]
    # the reference solution's str_replace exactly as the chat template renders a tool call
    assert f'"old_str": {json.dumps(fix["old"])}, "new_str": {json.dumps(fix["new"])}' in corpus
    assert '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>' in corpus


def test_tiny_model_is_qwen3_moe_and_round_trips_through_from_pretrained(tokenizer, tmp_path):
    config = ModelConfig(num_experts=4, num_experts_per_tok=2, tokenizer=SMALL)
    model = build_tiny_model(config, tokenizer)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == 4 and model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    same_seed = build_tiny_model(config, tokenizer)
    assert model_fingerprint(same_seed) == model_fingerprint(model)

    out = save_policy(model, tokenizer, tmp_path / "policy")
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    loaded, loaded_tok = load_policy(out)
    assert type(loaded).__name__ == "Qwen3MoeForCausalLM"
    assert loaded_tok.get_vocab() == tokenizer.get_vocab()
    assert load_tokenizer(out).chat_template == tokenizer.chat_template
    ids = torch.tensor([render_prompt([{"role": "user", "content": "Fix add"}], tokenizer)])
    model.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert model_fingerprint(loaded) == model_fingerprint(model)


def test_load_policy_model_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_policy_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="in the local hub cache"):
        load_policy_model("nobody-here/no-such-model")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            load_policy_model(tmp_path, spec=PolicySpec(device="cuda"))


def test_init_policy_copies_a_checkpoint_or_builds_the_tiny_model(tokenizer, tmp_path):
    source = save_policy(build_tiny_model(ModelConfig(tokenizer=SMALL), tokenizer), tokenizer, tmp_path / "src")
    copied = init_policy(PolicySpec(path=str(source)), None, tmp_path / "base")
    assert model_fingerprint(load_policy_model(copied)) == model_fingerprint(load_policy_model(source))
    model, tok = load_policy(copied, spec=PolicySpec(dtype="bfloat16", attn_implementation="eager"))
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    tokenizer_only = tmp_path / "no-template"
    save_policy(build_tiny_model(ModelConfig(tokenizer=SMALL), tokenizer), tokenizer, tokenizer_only)
    import json

    cfg = json.loads((tokenizer_only / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tokenizer_only / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tokenizer_only / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"):
        init_policy(PolicySpec(path=str(tokenizer_only)), None, tmp_path / "base2")
