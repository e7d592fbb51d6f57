"""`orchard export`: a trajectory store written out as a dataset other trainers load.

    orchard export tokens --trajectories runs/<run>/distill/trajectories --model runs/<run>/sft/model \
                          --out tokens.parquet [--mode whole|resolved_only|credited] [--logprobs]
    orchard export openai --trajectories runs/<run>/distill/trajectories --out messages.parquet

`tokens` is the token-level record (components/sft/tokens.py: prompt_ids, response_ids, loss_mask,
response_logprobs, reward, failure_reason, metadata), rendered with the model's own tokenizer and chat template,
the same functions SFT and RL train with; `--logprobs` also scores each response token under that model.
`openai` is the OpenAI-messages shape of the published dataset (components/core/rendering/openai_format.py).
A missing store, an empty one or a model that cannot be loaded is one line on stderr (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from components.sft.data import SFTMode


class ExportError(ValueError):
    """What the user asked for cannot be exported; the message says why."""


def _trajectories(store_dir: str):
    from components.core.data.parquet_store import StoreError, TrajectoryStore

    try:
        trajectories = TrajectoryStore(store_dir).read()
    except StoreError as err:
        raise ExportError(str(err)) from None
    if not trajectories:
        raise ExportError(f"{store_dir} holds no trajectories")
    return trajectories


def export_tokens_from(
    store_dir: str, model: str, out: str, *, mode: SFTMode = "whole", logprobs: bool = False, device: str = "cpu"
) -> Path:
    """The token-level dataset of the trajectories in `store_dir`, under `model`'s tokenizer, at `out`."""
    from components.core.policy.modeling import LoadOptions, load_policy, load_tokenizer
    from components.sft.tokens import export_tokens

    trajectories = _trajectories(store_dir)
    try:
        if logprobs:
            scorer, tokenizer = load_policy(model, spec=LoadOptions(device=device))
        else:
            scorer, tokenizer = None, load_tokenizer(model)
    except (OSError, ValueError) as err:
        raise ExportError(f"cannot load the model {model!r}: {err}") from None
    return export_tokens(trajectories, tokenizer, out, mode=mode, model=scorer)


def export_openai_from(store_dir: str, out: str) -> Path:
    """The OpenAI-messages dataset of the trajectories in `store_dir`, at `out`."""
    from components.core.rendering.openai_format import export_openai

    return export_openai(_trajectories(store_dir), out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="orchard export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="format", required=True)
    p = sub.add_parser("tokens", help="token-level rows (ids, loss mask, logprobs, reward) as parquet")
    p.add_argument("--trajectories", required=True, help="a trajectory store directory (e.g. distill/trajectories)")
    p.add_argument("--model", required=True, help="checkpoint directory (or cached hub id) whose tokenizer renders")
    p.add_argument("--out", required=True, help="parquet file to write")
    p.add_argument(
        "--mode",
        default="whole",
        choices=["whole", "resolved_only", "credited"],
        help="the SFT loss rule that sets loss_mask (default: whole)",
    )
    p.add_argument("--logprobs", action="store_true", help="fill response_logprobs by scoring with --model")
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="where --logprobs scores")
    p = sub.add_parser("openai", help="OpenAI-messages rows (tools, messages, metadata) as parquet")
    p.add_argument("--trajectories", required=True, help="a trajectory store directory (e.g. distill/trajectories)")
    p.add_argument("--out", required=True, help="parquet file to write")
    args = parser.parse_args(argv)
    try:
        if args.format == "tokens":
            path = export_tokens_from(
                args.trajectories, args.model, args.out, mode=args.mode, logprobs=args.logprobs, device=args.device
            )
        else:
            path = export_openai_from(args.trajectories, args.out)
    except ExportError as err:
        print(f"orchard export: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
