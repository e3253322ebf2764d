"""router.routing.crashpoints: parsing, and a real SIGKILL at the N-th passage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.routing.crashpoints import ENV, PAUSE_DIR_ENV, PAUSE_ENV, POINTS, parse


def test_parse_counts_and_refuses_unknown_names() -> None:
    assert parse("t2.after_prepare@3, t2.after_decision") == {"t2.after_prepare": 3, "t2.after_decision": 1}
    assert parse("") == {}
    with pytest.raises(ValueError, match="unknown crash point"):
        parse("t2.after_prepar")
    with pytest.raises(ValueError, match=">= 1"):
        parse("t2.after_prepare@0")


def test_an_armed_point_kills_the_process_at_its_nth_passage() -> None:
    code = ("from router.routing.crashpoints import crashpoint\n"
            "for i in range(5):\n"
            "    print(i, flush=True)\n"
            "    crashpoint('t2.after_decision')\n")
    env = dict(os.environ, **{ENV: "t2.after_decision@3"})
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]


def test_every_point_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "transactions.md").read_text(encoding="utf-8")
    missing = [p for p in POINTS if f"`{p}`" not in doc]
    assert not missing, f"crash points not in docs/transactions.md: {missing}"


def test_a_pause_point_waits_at_its_nth_passage_until_the_test_lets_it_go(tmp_path: Path) -> None:
    code = ("from router.routing.crashpoints import pausepoint\n"
            "for i in range(4):\n"
            "    print(i, flush=True)\n"
            "    pausepoint('t2.in.before_phase_two')\n"
            "print('end', flush=True)\n")
    env = dict(os.environ, **{PAUSE_ENV: "t2.in.before_phase_two@2", PAUSE_DIR_ENV: str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    marker = tmp_path / "t2.in.before_phase_two.2.reached"
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline().strip() for _ in range(2)] == ["0", "1"]
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists() and proc.poll() is None, "paused at the second passage"
        (tmp_path / "t2.in.before_phase_two.2.go").touch()
        out, _ = proc.communicate(timeout=60)
        assert out.split() == ["2", "3", "end"] and proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
