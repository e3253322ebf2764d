"""docs/architecture.md stays true to the code (issue 24): every package under router/ is named there."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_router_package_is_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in (ROOT / "router").iterdir() if (p / "__init__.py").is_file())
    assert packages, "no package found under router/"
    missing = [name for name in packages if f"router/{name}" not in page]
    assert not missing, f"packages under router/ not described in docs/architecture.md: {missing}"
