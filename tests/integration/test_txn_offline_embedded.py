"""``nsjms txn`` with the node stopped on the EMBEDDED defaults (issues 29 and 31): empty ``postgres.dsn`` and
``broker.url``, the node's PostgreSQL cluster and ActiveMQ under its state directory.

* The embedded PostgreSQL is stopped (an orderly stop of the node stops it): ``txn list`` starts it for the command
  under the state directory's lock, reads, and stops it again; a node cannot start meanwhile (``serve`` exits 5).
* The embedded broker is stopped too: a logged COMMIT whose outbox must be re-sent is advised as ``start-node`` and
  ``txn commit`` is refused before anything is touched (the prepared branch stays prepared), never a PostgreSQL
  commit followed by "broker.url is empty".
* The embedded broker still runs (it outlives a killed node): ``txn commit`` re-sends to it with the credentials of
  the state directory, counted at an independent stomp.py consumer.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import stomp

from router.cli import main
from router.db import Database
from router.node.services import EmbeddedActiveMQ, EmbeddedPostgres
from router.routing.t2.transactions import NodeTransactions, OutboxRow, outbox_insert
from xa.pg import PgBranch
from xa.xid import dedupe_id

from bridgekit import prepared_gids
from conftest import free_port, restart_port
from t2kit import Crash, SendBranch

pytestmark = pytest.mark.integration


class Stopped:
    """A stopped node's state directory with an embedded cluster holding one T2 that died after its decision,
    before PostgreSQL committed (safe action: commit, then re-send its outbox rows)."""

    def __init__(self, base: Path) -> None:
        self.state = base / "state"
        self.state.mkdir()
        self.pg = EmbeddedPostgres(self.state, restart_port())
        self.stomp_port, self.openwire_port = free_port(), free_port()
        self.queue = f"txn.embedded.{uuid.uuid4().hex[:8]}"
        self.gtrid = ""

    def env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for key in ("NSJMS_POSTGRES_DSN", "NSJMS_BROKER_URL"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("NSJMS_NODE_NODE_ID", "n1")
        monkeypatch.setenv("NSJMS_POSTGRES_EMBEDDED_PORT", str(self.pg.port))
        monkeypatch.setenv("NSJMS_BROKER_EMBEDDED_STOMP_PORT", str(self.stomp_port))
        monkeypatch.setenv("NSJMS_BROKER_EMBEDDED_OPENWIRE_PORT", str(self.openwire_port))

    def died(self, n: int) -> None:
        from router.node.server import _postgres_may_traverse

        _postgres_may_traverse(self.state)
        dsn = self.pg.start()
        db = Database(dsn, 2)
        db.open()
        node = NodeTransactions("n1", self.state, db, dsn)
        t = node.coordinator.begin(30)
        with db.branch() as conn:
            branch = PgBranch(conn, "pg")
            t.enlist(branch)
            outbox_insert(conn, [OutboxRow(t.gtrid, i, dedupe_id(t.gtrid, i), 7, f"/queue/{self.queue}",
                                           {"nsjms_dedupe_id": dedupe_id(t.gtrid, i), "persistent": "true"},
                                           f"m{i}".encode()) for i in range(n)])

            def crash() -> None:
                raise Crash("after the decision, before committing PostgreSQL")
            branch.commit = crash  # type: ignore[method-assign]
            t.enlist(SendBranch())
            with pytest.raises(Crash):
                t.commit()
        node.pg.close()
        node.log.close()
        db.close()
        self.gtrid = t.gtrid
        self.pg.stop()


@pytest.fixture
def stopped() -> Iterator[Stopped]:
    base = Path(tempfile.mkdtemp(prefix="nsjms-test-txn-embedded-"))
    base.chmod(0o755)                      # the postgres OS user must reach the cluster directory
    s = Stopped(base)
    try:
        yield s
    finally:
        s.pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def txn(s: Stopped, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["txn", *args, "--state-dir", str(s.state)])
    out, err = capsys.readouterr()
    return code, out, err


def prepared_now(s: Stopped) -> list[str]:
    """The prepared transactions of the cluster, read with it started for this check and stopped again."""
    dsn = s.pg.start()
    try:
        return prepared_gids(dsn)
    finally:
        s.pg.stop()


def test_txn_starts_the_stopped_embedded_postgresql_for_the_command_under_the_lock(
        stopped: Stopped, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    s = stopped
    s.died(3)
    s.env(monkeypatch)
    assert not s.pg.is_running()

    code, out, err = txn(s, capsys, "list", "--json")
    assert code == 0, err
    [view] = json.loads(out)["transactions"]
    assert (view["gtrid"], view["decision"]) == (s.gtrid, "commit")
    assert not s.pg.is_running(), "started for the command, stopped after it"

    # the command holds the state directory's lock throughout: a node cannot start meanwhile
    seen: dict[str, Any] = {}

    def ask(prompt: str) -> str:
        seen["pg_running"] = s.pg.is_running()
        serve = subprocess.run([sys.executable, "-m", "router.cli", "serve", "--state-dir", str(s.state)],
                               capture_output=True, text=True, timeout=120, env=dict(os.environ))
        seen["serve"] = (serve.returncode, serve.stderr)
        return "no"

    monkeypatch.setattr(builtins, "input", ask)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    code, _, err = txn(s, capsys, "rollback", s.gtrid, "--why", "look only")
    assert code == 4 and "nothing done" in err
    assert seen["pg_running"] is True
    assert seen["serve"][0] == 5, seen["serve"][1]
    assert not s.pg.is_running()
    assert len(prepared_now(s)) == 1


def test_without_its_embedded_broker_a_stopped_node_is_advised_to_start_and_nothing_is_half_done(
        stopped: Stopped, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    s = stopped
    s.died(3)
    s.env(monkeypatch)
    s.pg.start()                                     # left running by a killed node; its broker was stopped
    code, out, err = txn(s, capsys, "list", "--json")
    assert code == 0, err
    [view] = json.loads(out)["transactions"]
    assert view["action"] == "start-node" and "embedded broker is not running" in view["reason"]
    code, out, err = txn(s, capsys, "commit", s.gtrid, "--yes", "--why", "runbook")
    assert code == 4 and "nothing done" in err and "start the node" in err
    assert s.pg.is_running(), "a cluster the command did not start is left running"
    assert len(prepared_gids(s.pg.dsn)) == 1, "nothing committed that could not be sent"
    code, out, err = txn(s, capsys, "recover")       # what a node's start does first: the PostgreSQL work only
    assert code == 0, err
    assert f"committed {s.gtrid}/pg" in out and "re-sends deferred" in out and "start the node" in out
    [view] = json.loads(txn(s, capsys, "list", "--json")[1])["transactions"]
    assert view["action"] == "start-node" and view["events"] == 3, "its outbox waits for the node's broker"


class Counter(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.cond = threading.Condition()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.ids.append(frame.headers["nsjms_dedupe_id"])
            self.cond.notify_all()


def test_txn_resends_to_the_running_embedded_broker_of_a_killed_node(
        stopped: Stopped, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    s = stopped
    s.died(3)
    s.env(monkeypatch)
    s.pg.start()
    broker = EmbeddedActiveMQ(s.state, s.stomp_port, s.openwire_port, authenticate=True, die_with_parent=True)
    broker.start()                                   # what a killed node leaves running (PostgreSQL too)
    try:
        parts = urlsplit(broker.url)
        conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        counter = Counter()
        conn.set_listener("count", counter)
        conn.connect(broker.login, broker.passcode, wait=True)
        conn.subscribe(f"/queue/{s.queue}", id="1", ack="auto")
        try:
            code, out, err = txn(s, capsys, "list", "--json")
            assert code == 0, err
            [view] = json.loads(out)["transactions"]
            assert view["action"] == "commit", view["reason"]
            code, out, err = txn(s, capsys, "commit", s.gtrid, "--yes", "--why", "runbook")
            assert code == 0, err
            assert f"resent {s.gtrid}/stomp" in out
            with counter.cond:
                counter.cond.wait_for(lambda: len(counter.ids) >= 3, 30)
                assert sorted(counter.ids) == [dedupe_id(s.gtrid, i) for i in range(3)]
        finally:
            conn.disconnect()
        assert prepared_gids(s.pg.dsn) == []
    finally:
        broker.stop()
