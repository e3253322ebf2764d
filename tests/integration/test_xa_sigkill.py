"""A process running T2s over real PostgreSQL and the file journal is SIGKILLed at random moments; recovery in
a fresh process must leave no prepared transaction behind, keep both PostgreSQL branches of every transaction
atomic, lose no send (every committed transaction reaches the "broker", directly or by re-send) and invent
none (nothing reaches it that PostgreSQL did not commit)."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import LiteralString

import psycopg
import pytest

from xa.log import FileLog
from xa.pg import PgManager
from xa.records import Participant
from xa.recovery import RecoveryManager
from xa.resource import SystemClock
from xa.xid import NodeId

pytestmark = pytest.mark.integration
NODE = NodeId("n1")
ROUNDS = 6
WAIT_S = 60.0

CHILD = r'''
import sys
from pathlib import Path
import psycopg
from xa.coordinator import Coordinator
from xa.log import FileLog
from xa.pg import PgBranch
from xa.resource import SystemClock
from xa.xid import NodeId, dedupe_id

dsn, state, sent = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])


class Broker:
    """A one-phase branch: its commit appends the transaction's dedupe ids to a file (the 'broker')."""
    name, kind, manager, one_phase_only = "stomp", "file-broker", "broker", True

    def sort_key(self):
        return "stomp"

    def begin(self, xid):
        self.gtrid = xid.gtrid

    def prepare(self):
        pass

    def commit(self):
        with sent.open("a") as f:
            f.write(dedupe_id(self.gtrid, 0) + "\n")

    def rollback(self):
        pass


node = NodeId("n1")
log = FileLog(state, node)
coord = Coordinator(node, log, SystemClock())
queue, outbox = psycopg.connect(dsn), psycopg.connect(dsn)
print("ready", flush=True)
while True:
    t = coord.begin(30)
    a, b = PgBranch(queue, "channel-queue"), PgBranch(outbox, "outbox")
    t.enlist(a)
    t.enlist(b)
    t.enlist(Broker())
    queue.execute("INSERT INTO events (gtrid) VALUES (%s)", (t.gtrid,))
    outbox.execute("INSERT INTO outbox (dedupe_id, gtrid) VALUES (%s, %s)", (dedupe_id(t.gtrid, 0), t.gtrid))
    t.commit()
'''


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def committed_at_least(dsn: str, n: int) -> bool:
    return len(table(dsn, "SELECT gtrid FROM events")) >= n


def table(dsn: str, query: LiteralString, *params: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(query, params).fetchall()]


def test_sigkill_at_random_points_then_recover(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (gtrid text PRIMARY KEY)")
        conn.execute("CREATE TABLE outbox (dedupe_id text PRIMARY KEY, gtrid text NOT NULL)")
    sent = tmp_path / "broker.txt"
    sent.touch()
    resent: list[str] = []
    rng = random.Random(20261122)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    kills = 0
    for _ in range(ROUNDS):
        before = len(table(fresh_db, "SELECT gtrid FROM events"))
        child = subprocess.Popen([sys.executable, "-c", CHILD, fresh_db, str(tmp_path), str(sent)],
                                 stdout=subprocess.PIPE, env=env)
        try:
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
            target = before + rng.randint(1, 40)
            wait_for(functools.partial(committed_at_least, fresh_db, target), "some commits")
            time.sleep(rng.random() * 0.05)  # a random kill moment inside the next transaction, not a wait
            child.send_signal(signal.SIGKILL)
            kills += 1
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        log = FileLog(tmp_path, NODE)
        pg = PgManager(lambda: psycopg.connect(fresh_db), key="postgresql")

        def resend(gtrid: str, p: Participant) -> None:
            resent.extend(table(fresh_db, "SELECT dedupe_id FROM outbox WHERE gtrid = %s", gtrid))

        try:
            report = RecoveryManager(NODE, log, [pg], resend, SystemClock(), in_flight_guard=0).run()
            assert report.errors == []
            assert log.live() == {}
        finally:
            pg.close()
            log.close()
        assert table(fresh_db, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()") == []
    events = set(table(fresh_db, "SELECT gtrid FROM events"))
    outbox = table(fresh_db, "SELECT dedupe_id FROM outbox")
    assert {d.rsplit("/", 1)[0] for d in outbox} == events  # both branches of each T2, or neither
    delivered = sent.read_text().split() + resent
    assert set(delivered) == set(outbox)  # nothing lost, nothing invented
    duplicates = len(delivered) - len(set(delivered))
    print(f"\n{kills} SIGKILLs, {len(events)} transactions committed, {len(resent)} re-sent by recovery, "
          f"{duplicates} duplicate deliveries (each with its original dedupe id)")
    assert kills == ROUNDS and len(events) > ROUNDS
