"""Every `orchard` command the README and the docs show has a config that validates, the cheap ones run as
written, and the `orchard run` commands on the tiny preset run in a slow test.

The commands are read from the README and every page under docs/: fenced bash blocks (backslash continuations joined,
shell
variables set earlier in the block expanded) and inline code spans. For `orchard run`, `demo`, `compile` and
`config show` the same preset, `--config` and `--set` items go through `orchard config show`, so a setting the
README names wrongly, or a combination the config refuses (imported tasks with the scripted teacher), fails
here instead of in a reader's terminal. `orchard compile` and `orchard config show` run as written (into a
temporary directory); `orchard run --preset tiny …` runs as written in a slow test. Not run: commands that
name a checkpoint under /models or an endpoint (a GPU and a model server), servers (`orchard env serve`,
exercised by tests/components/envs), `orchard schedule` (a KFP host), `orchard ui` (a server;
tests/pipelines/test_ui.py),
runs of the demo and quick presets or with `--retrain` (minutes each; `make demo` is the demo preset's own run),
and the bring-your-own example (tests/test_examples.py runs its block as written).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import DEFAULT_PRESET, main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
_CONFIG_COMMANDS = ("run", "demo", "compile", "config")


def readme_commands(text: str) -> list[str]:
    """The `orchard ...` command lines of the README (placeholders such as `…` or `<dir>` left out)."""
    found: list[str] = []
    for block in _shell_blocks(text):
        variables: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if m := re.fullmatch(r"([A-Z_]+)=(.+)", line):
                variables[m.group(1)] = shlex.split(m.group(2))[0]
            elif line.startswith("orchard "):
                for name, value in variables.items():
                    line = line.replace(f"${name}", value.replace('"', '\\"'))
                found.append(line)
    found += [m for m in re.findall(r"`(orchard [^`]+)`", text)]
    return [c for c in dict.fromkeys(found) if not re.search(r"…|\.\.\.|<[^>]+>|\[", c)]


def _shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks marked bash/sh/console (or unmarked)."""
    blocks, body, lang = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, lang = [], line[3:].strip()
            else:
                if lang in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(body) + "\n")
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def _config_show_argv(command: str) -> list[str] | None:
    """`orchard config show` with the command's preset, --config and --set items (None: not a config command)."""
    words = shlex.split(command)[1:]
    if not words or words[0] not in _CONFIG_COMMANDS:
        return None
    argv, i = ["config", "show", "--preset", DEFAULT_PRESET if words[0] != "demo" else "demo"], 1
    while i < len(words):
        if words[i] in ("--preset", "--set", "--config") and i + 1 < len(words):
            if words[i] == "--preset":
                argv[3] = words[i + 1]
            else:
                argv += [words[i], words[i + 1]]
            i += 2
        else:
            i += 1
    return argv


ALL_COMMANDS = readme_commands("\n".join(page.read_text() for page in PAGES))
COMMANDS = [c for c in ALL_COMMANDS if _config_show_argv(c) is not None]
CHEAP = [
    c
    for c in ALL_COMMANDS
    if shlex.split(c)[1:3] in (["config", "show"], ["compile"]) or shlex.split(c)[1:2] == ["compile"]
]
# (the bring-your-own example's run needs its checkouts, checkpoint and teacher first: tests/test_examples.py
# runs that whole block as written)
TINY_RUNS = [
    c
    for c in ALL_COMMANDS
    if shlex.split(c)[1:2] == ["run"]
    and "--preset tiny" in c
    and "--retrain" not in c
    and "/models/" not in c
    and "--config examples/" not in c
]


def test_the_readme_commands_are_found():
    assert len(COMMANDS) >= 8, COMMANDS
    assert any("provision.source" in c and "distill.teacher=openai" in c for c in COMMANDS)  # the SWE-bench example


@pytest.mark.parametrize("command", COMMANDS)
def test_every_orchard_command_in_the_readme_has_a_valid_config(command, capsys):
    code = main(_config_show_argv(command))
    assert code == 0, f"{command}\n{capsys.readouterr().err}"


def test_the_cheap_commands_run_as_written(tmp_path, monkeypatch, capsys):
    assert any("compile" in c for c in CHEAP) and any("config show" in c for c in CHEAP), CHEAP
    monkeypatch.chdir(tmp_path)  # `compile --out build/pipelines` writes here, not into the checkout
    for command in CHEAP:
        code = main(shlex.split(command)[1:])
        assert code == 0, f"{command}\n{capsys.readouterr().err}"
    assert list((tmp_path / "build" / "pipelines").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("command", TINY_RUNS)
def test_the_tiny_runs_run_as_written(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(shlex.split(command)[1:])
    assert code == 0, f"{command}\n{capsys.readouterr().err}"
