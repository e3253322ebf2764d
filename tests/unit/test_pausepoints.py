"""Pause points (router.routing.crashpoints.pausepoint): faults injected at counted points, never by timing (issue
29)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.routing.crashpoints import PAUSE_POINTS, parse_pauses

REPO = Path(__file__).resolve().parents[2]


def test_parse_pauses() -> None:
    assert parse_pauses("in.local.after_take@2/4, in.local.before_commit") == {
        "in.local.after_take": frozenset({2, 4}), "in.local.before_commit": frozenset({1})}
    with pytest.raises(ValueError, match="unknown pause point"):
        parse_pauses("in.local.nowhere@1")
    with pytest.raises(ValueError, match="counted from 1"):
        parse_pauses("in.local.after_take@0")


def test_every_pause_point_is_in_the_code() -> None:
    code = "".join((REPO / "router" / path).read_text() for path in ("channel/t2in.py", "routing/t2/transactions.py"))
    assert all(f'pausepoint("{name}")' in code for name in PAUSE_POINTS)


def test_a_process_waits_at_its_armed_passages_only(tmp_path: Path) -> None:
    script = ("from router.routing.crashpoints import pausepoint\n"
              "for i in range(1, 5):\n"
              "    pausepoint('in.local.after_take')\n"
              "    print(i, flush=True)\n")
    env = {"NSJMS_PAUSE_AT": "in.local.after_take@2/3", "NSJMS_PAUSE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "1\n"
    deadline = time.monotonic() + 60
    while not (tmp_path / "in.local.after_take.2.reached").exists():
        assert time.monotonic() < deadline, "the 2nd passage was never reached"
        time.sleep(0.01)
    assert not (tmp_path / "in.local.after_take.3.reached").exists(), "it waits at the 2nd passage"
    (tmp_path / "in.local.after_take.2.go").write_text("")
    assert proc.stdout.readline() == "2\n"
    while not (tmp_path / "in.local.after_take.3.reached").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (tmp_path / "in.local.after_take.3.go").write_text("")
    assert proc.stdout.read() == "3\n4\n"
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert sorted(p.name for p in tmp_path.glob("*.reached")) == ["in.local.after_take.2.reached",
                                                                    "in.local.after_take.3.reached"]
