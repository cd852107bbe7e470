"""``energon-pack --help``: plain text, every option has a help line showing its default, and --version."""

from __future__ import annotations

import argparse

import pytest

from energon_pack import __version__
from energon_pack.cli import build_parser, main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def option_help(lines: list[str], flag: str) -> str:
    """The help block of one option: its line and the deeper-indented lines that continue it."""
    listing = next(i for i, line in enumerate(lines) if line.endswith("arguments:") or line == "options:")
    first = next(i for i, line in enumerate(lines) if i > listing and line.strip().startswith(flag))
    block = [lines[first].strip()]
    for line in lines[first + 1 :]:
        if not line.startswith(" " * 6) or line.strip().startswith("-"):
            break
        block.append(line.strip())
    return " ".join(block)


def help_text(argv: list[str], capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_is_plain_text_and_lists_every_command(capsys, monkeypatch):
    text = help_text(["--help"], capsys, monkeypatch)
    assert "``" not in text and ":func:" not in text
    for name in subcommands():
        assert name in text


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_has_help_with_its_default(name, capsys, monkeypatch):
    text = help_text([name, "--help"], capsys, monkeypatch)
    assert "``" not in text
    lines = text.splitlines()
    for action in subcommands()[name]._actions:
        if action.dest == "help":
            continue
        flag = action.option_strings[0] if action.option_strings else action.dest
        line = option_help(lines, flag)
        assert action.help and action.help.split()[0] in line, f"{name} {flag}: no help line"
        if action.option_strings and not action.required:
            assert "default" in line, f"{name} {flag}: the help does not show the default"


def test_version(capsys, monkeypatch):
    assert help_text(["--version"], capsys, monkeypatch).strip() == f"energon-pack {__version__}"
