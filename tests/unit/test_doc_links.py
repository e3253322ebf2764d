"""The documentation stays inside the repository: README.md and docs/*.md link only to files that exist in it and
name no path of the team's machines (``/work/...``, ``../shared/...``), which a reader of the repository lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"/work/|\.\./shared/|(?<![\w.-])shared/[A-Za-z]")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_page_names_no_path_outside_the_repository(page: Path) -> None:
    found = [f"{page.name}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_relative_links_reach_files_in_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            broken.append(target)
    assert not broken, f"{page.name}: links that leave the repository or reach nothing: {broken}"
