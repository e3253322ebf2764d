"""The node's membership (router/cluster/node.py) with real ``nsjms serve`` processes on one PostgreSQL: a second
process with the same node id is refused (exit 5, naming node.node_id) instead of acting on the same work; a node
restarted after kill -9 takes its own id over at once (a new epoch); a clean stop leaves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from conftest import NsjmsServer, free_port, started_node

pytestmark = pytest.mark.integration


def _member(dsn: str, node: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT epoch, state FROM nsjms_member WHERE node_id = %s", (node,)).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def test_one_process_per_node_id_a_restart_after_kill_rejoins_and_a_stop_leaves(tmp_path: Path, fresh_db: str,
                                                                                 broker_url: str) -> None:
    with started_node(tmp_path / "a", fresh_db, broker_url) as a:
        assert a.endpoints is not None
        node_id = str(a.endpoints["node_id"])
        assert _member(fresh_db, node_id) == (1, "live")
        assert json.loads((a.state_dir / "member.json").read_text())["epoch"] == 1
        assert (a.state_dir / "member.json").stat().st_mode & 0o077 == 0

        other = tmp_path / "b"                                  # same database, same node id, another state dir
        other.mkdir()
        env = dict(os.environ, NSJMS_POSTGRES_DSN=fresh_db)
        proc = subprocess.run([sys.executable, "-m", "router.cli", "serve", "--state-dir", str(other), "--orb-port",
                               str(free_port()), "--broker-url", broker_url], env=env, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 5, proc.stderr[-3000:]
        assert "node.node_id" in proc.stderr and "holds a live lease" in proc.stderr, proc.stderr[-3000:]
        assert _member(fresh_db, node_id) == (1, "live")          # the live node was not disturbed

        clone = tmp_path / "clone"                              # an exact copy of the live node's member.json (a
        clone.mkdir()                                           # cloned VM or container): refused, not a takeover
        shutil.copy2(a.state_dir / "member.json", clone / "member.json")
        proc = subprocess.run([sys.executable, "-m", "router.cli", "serve", "--state-dir", str(clone), "--orb-port",
                               str(free_port()), "--broker-url", broker_url], env=env, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 5 and "holds a live lease" in proc.stderr, proc.stderr[-3000:]
        assert _member(fresh_db, node_id) == (1, "live") and a.proc is not None and a.proc.poll() is None

        a.kill(signal.SIGKILL)                                  # its lease is still live for up to 20 s ...
        a.restart()                                             # ... yet its own restart joins at once
        assert _member(fresh_db, node_id) == (2, "live")
        assert a.stop() == 0
        assert _member(fresh_db, node_id) == (2, "left")


def test_status_shows_the_membership(nsjms_server: NsjmsServer) -> None:
    path = nsjms_server.state_dir / "status.json"   # written just after endpoints.json (the ready signal)
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    status = json.loads(path.read_text())
    assert status["cluster"]["epoch"] == 1 and status["cluster"]["fenced"] is False
