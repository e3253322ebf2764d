"""docs/cli.md is generated from the parser: this test fails when someone changes one without the other."""

from __future__ import annotations

import argparse

import pytest

from router import cli
from router.cli import doc as clidoc


def test_docs_cli_md_is_generated_from_the_current_parser() -> None:
    committed = clidoc.DOC_PATH.read_text()
    assert committed == clidoc.render(), "docs/cli.md is stale: run `python -m router.cli.doc --write` and commit it"


def test_every_command_and_option_is_in_the_reference() -> None:
    page = clidoc.render()

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert f"`nsjms {' '.join([*path, name])}`" in page, [*path, name]
                    walk(sub, [*path, name])
            for flag in action.option_strings:
                assert flag in page, (path, flag)

    walk(cli.build_parser(), [])
    for code, meaning in cli.EXIT_CODES.items():
        assert f"| {code} | {meaning} |" in page


def test_render_does_not_depend_on_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = clidoc.render()
    monkeypatch.setenv("COLUMNS", "300")
    assert clidoc.render() == narrow
