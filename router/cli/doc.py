"""Generate ``docs/cli.md`` from the ``nsjms`` argparse tree, so the CLI reference cannot drift from the parser.

``python -m router.cli.doc --write`` rewrites ``docs/cli.md``; without ``--write`` it prints the page.
``tests/unit/test_cli_doc.py`` fails when the committed page differs from what the parser gives.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["DOC_PATH", "main", "render"]

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_GLOBAL = {"--state-dir", "--config", "--json", "-h"}

_HEADER = """# CLI reference

<!-- Generated from the argparse tree by `python -m router.cli.doc --write`; do not edit by hand.
     tests/unit/test_cli_doc.py fails when this page and the parser differ. -->

"""


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _signature(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{flags}`"
    metavar = action.metavar or action.dest.upper()
    if action.choices and not action.metavar:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    return f"`{flags} {metavar}`"


def _default(action: argparse.Action) -> str:
    default = action.default
    if default in (None, argparse.SUPPRESS, False, [], "") or action.nargs == 0:
        return ""
    return f"`{default}`"


def _options(parser: argparse.ArgumentParser, skip_global: bool) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if skip_global and set(action.option_strings) & _GLOBAL:
            continue
        text = (action.help or "").replace("|", "\\|").replace("<", "\\<").replace(">", "\\>")
        extra = " (repeatable)" if isinstance(action, argparse._AppendAction) and "repeatable" not in text else ""
        rows.append(f"| {_signature(action)} | {_default(action)} | {text}{extra} |")
    if not rows:
        return []
    return ["| option | default | meaning |", "| --- | --- | --- |", *rows, ""]


def _usage(path: Sequence[str], parser: argparse.ArgumentParser) -> str:
    parts = ["nsjms", *path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parts.append("{" + ",".join(action.choices) + "} …")
        elif set(action.option_strings) & _GLOBAL:
            continue
        elif not action.option_strings:
            parts.append(str(action.metavar or action.dest.upper()))
        else:
            sig = _signature(action).strip("`")
            parts.append(sig.split(", ")[-1] if action.required else f"[{sig.split(', ')[-1]}]")
    return " ".join(parts)


def _section(path: list[str], help_text: str, parser: argparse.ArgumentParser) -> Iterator[str]:
    level = "#" * min(len(path) + 1, 4)
    yield f"{level} `nsjms {' '.join(path)}`"
    yield ""
    if help_text:
        yield help_text[0].upper() + help_text[1:] + "."
        yield ""
    yield "```"
    yield _usage(path, parser) + "  [--state-dir DIR] [--config FILE] [--json]"
    yield "```"
    yield ""
    yield from _options(parser, skip_global=True)
    if parser.epilog:
        yield parser.epilog.replace("<", "\\<").replace(">", "\\>")
        yield ""
    for name, sub_help, sub in _subcommands(parser):
        yield from _section([*path, name], sub_help, sub)


def render() -> str:
    """The whole page, from :func:`router.cli.build_parser`."""
    from router import cli

    parser = cli.build_parser()
    lines = [_HEADER.rstrip("\n"), "", parser.description or "", "",
             "## Global options", "",
             "Accepted by every command, before or after the subcommand name "
             "(`nsjms --json channel list` = `nsjms channel list --json`).", ""]
    lines += _options(parser, skip_global=False)
    lines += ["## Exit codes", "", "| code | meaning |", "| --- | --- |",
              *(f"| {code} | {meaning} |" for code, meaning in cli.EXIT_CODES.items()), "",
              "What to do about each: [operations.md](operations.md).", ""]
    for name, help_text, sub in _subcommands(parser):
        lines += list(_section([name], help_text, sub))
    return "\n".join(line.rstrip() for line in lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    text = render()
    if args == ["--write"]:
        DOC_PATH.write_text(text)
        return 0
    if args:
        print("usage: python -m router.cli.doc [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
