"""Function-level project imports stay where the allow-list below says, and nowhere else (issue 24).

A ``from router... import`` inside a function hides an import from mypy and from a reader, and usually a cycle.
import-linter sees them (it builds the whole graph) but cannot count them, so this test does: it walks every module
under router/ with ``ast`` and counts the ``router`` imports made inside a function (``if TYPE_CHECKING:`` blocks
are not counted: they never run). A place not listed here may have none; a listed place at most its budget. Lower a
budget when you cut imports there; never raise one without a reason written next to it (docs/architecture.md,
"Layers").
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: path (a module, or a package ending in "/") -> (budget, why the imports there are still function-level)
ALLOWED: dict[str, tuple[int, str]] = {
    "router/node/": (87, "the composition root: server.py and its split-off modules (watches, publish, statedir) "
                         "build a node from every layer on demand; not cut yet"),
    "router/cli/": (80, "the command's entry points import the node or a subcommand's module when that command runs; "
                        "not cut yet (tests patch the node's classes the CLI resolves at call time)"),
    "router/console/": (27, "the console's pages reach the CLI's functions and the node at call time; not cut yet"),
    "router/bridge/core.py": (5, "mapping errors and the bridge's own t2in: `shape` edits this module's imports"),
    "router/bridge/txmgmt.py": (1, "router.node.lifecycle: an upward import the layers contract names (ignored)"),
    "router/jms/transport.py": (2, "the scheme table names each transport inside its factory (the independence "
                                   "contract's documented exception)"),
    "router/channel/proxies.py": (1, "cycle: router.channel.consumers imports proxies at its top"),
}


def _function_level_router_imports(path: Path) -> int:
    count = 0

    def walk(node: ast.AST, in_function: bool) -> None:
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and not in_function and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, ast.Import):
                count += sum(1 for a in child.names if a.name == "router" or a.name.startswith("router."))
            elif in_function and isinstance(child, ast.ImportFrom) and child.level == 0:
                module = child.module or ""
                count += module == "router" or module.startswith("router.")
            walk(child, inner)

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return count


def _place(rel: str) -> str:
    for key in ALLOWED:
        if key.endswith("/") and rel.startswith(key):
            return key
    return rel


def test_function_level_project_imports_stay_within_the_allow_list() -> None:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "router").rglob("*.py")):
        n = _function_level_router_imports(path)
        if n:
            place = _place(path.relative_to(ROOT).as_posix())
            found[place] = found.get(place, 0) + n
    over = {p: (n, ALLOWED.get(p, (0, ""))[0]) for p, n in found.items() if n > ALLOWED.get(p, (0, ""))[0]}
    assert not over, (f"function-level project imports over their budget (found, allowed): {over}; move them to "
                      "module level, or break the cycle they hide (see this test's docstring)")


def test_the_counter_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nimport router.db\nif TYPE_CHECKING:\n"
                      "    from router.jms import model\n\ndef f():\n    from router.db import errors\n"
                      "    import router.jms, os\n    from os import path\n    return errors\n", encoding="utf-8")
    assert _function_level_router_imports(module) == 2
