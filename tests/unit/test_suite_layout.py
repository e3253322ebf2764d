"""The test tree stays collectable as one run.

The README's ``bash scripts/test.sh`` collects ``tests/unit`` and ``tests/integration`` in ONE pytest run, while CI
collects them in separate phases. pytest's default import mode ("prepend", no ``__init__.py`` in the test folders)
imports each test module by its basename, so two modules of one basename in different folders collect apart and
refuse to collect together ("import file mismatch"): CI stays green while the README's command fails. This test
fails first instead.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts or path.name == "__init__.py":
            continue
        where[path.name].append(str(path.relative_to(TESTS)))
    # conftest.py is the one name pytest imports per folder by design (each folder's own conftest)
    clashes = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1 and name != "conftest.py"}
    assert clashes == {}, f"test modules sharing a basename (rename one): {clashes}"
