"""scripts/images.sh tags images with a hash of what they are built from (issue 29: the hash included the checkout's
absolute path, so a second clone of the same commit rebuilt every image)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _hash(root: Path, *files: str, recipe: str = "recipe v1") -> str:
    function = re.search(r"^hash_files\(\) \{.*?^\}", (REPO / "scripts" / "images.sh").read_text(), re.M | re.S)
    assert function is not None
    script = f'{function.group(0)}\nROOT="$1"; shift\nhash_files <(echo "$RECIPE") "$@"\n'
    done = subprocess.run(["bash", "-c", script, "hash", str(root), *(str(root / f) for f in files)],
                          capture_output=True, text=True, check=True, env={"RECIPE": recipe, "PATH": "/usr/bin:/bin"})
    return done.stdout.strip()


def _clone(where: Path) -> Path:
    shutil.copytree(REPO / "deploy" / "images" / "base", where / "deploy" / "images" / "base")
    return where


def test_image_hash_depends_on_content_not_on_the_checkout_path(tmp_path: Path) -> None:
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "deploy" / "images" / "base").rglob("*") if p.is_file())
    one, two = _clone(tmp_path / "one"), _clone(tmp_path / "elsewhere" / "two")
    assert re.fullmatch(r"[0-9a-f]{12}", _hash(one, *files))
    assert _hash(one, *files) == _hash(two, *files)
    (two / files[0]).write_text((two / files[0]).read_text() + "\n# changed\n")
    assert _hash(one, *files) != _hash(two, *files)
    assert _hash(one, *files) != _hash(one, *files, recipe="recipe v2")
