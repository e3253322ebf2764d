"""examples/java compiles against the OMG IDL-to-Java mapping (no ORB runs it here; see docs/clients.md, "Java").

No Java ORB is installable on the project's machines, so the Java example cannot run. This check compiles it with
``javac -Xlint:all -Werror`` against stand-ins for the ``org.omg`` classes it uses (``java_omg_standins.txt``: the
mapping's names, signatures and checked exceptions, no behaviour). That catches syntax errors, misspelled types and
operations, and unhandled checked exceptions; it says nothing about behaviour on a real ORB.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).with_name("java_omg_standins.txt")


def _write_standins(root: Path) -> list[Path]:
    files: list[Path] = []
    for chunk in STANDINS.read_text().split("\n// FILE ")[1:]:  # the text before the first marker is a comment
        name, source = chunk.split("\n", 1)
        path = root / name.strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        files.append(path)
    return files


def test_java_example_compiles_against_the_omg_mapping(tmp_path: Path) -> None:
    javac = shutil.which("javac")
    if javac is None:
        pytest.fail("javac is missing: scripts/bootstrap.sh installs default-jdk-headless")
    standins = _write_standins(tmp_path / "src")
    assert len(standins) > 40, "the stand-in file was not split into classes"
    subprocess.run([javac, "-d", str(tmp_path / "omg"), *map(str, standins)], check=True, timeout=300)
    example = sorted((REPO / "examples" / "java").glob("*.java"))
    assert {p.name for p in example} == {"Example.java", "Supplier.java", "Consumer.java"}
    done = subprocess.run([javac, "-Xlint:all", "-Werror", "-cp", str(tmp_path / "omg"), "-d", str(tmp_path / "out"),
                           *map(str, example)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
