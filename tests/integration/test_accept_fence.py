"""The accept path's write is fenced in its own statement (issue 25): a real PostgreSQL, the node's group committer
(``GroupCommit`` on ``Database.statement``: one autocommit INSERT per lone push), the channel store and the node's
``StatementFence`` (``router/node/cluster.py``).

A node paused past its lease is what it is to the database: a writer that still holds its old epoch. Its pushes after
the takeover (epoch bumped, channel claimed by a survivor), or after its channel moved to another node (a hand-off),
must store nothing and fail with ``TRANSIENT``/``COMPLETED_NO`` (the client retries and reaches the new owner).
The race the lock exists for is made deterministic: the push is shown waiting for the takeover's open transaction,
the takeover commits, and the push stores nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from omniORB import CORBA

from router.channel.groupcommit import GroupCommit
from router.channel.store import NewEvent, Store
from router.cluster import Fenced
from router.cluster import members as M
from router.cluster.lease import LeaseSettings, expired
from router.cluster.ownership import claim_all
from router.db import Database, FenceToken, WriteFenced
from router.node.cluster import _AcceptFence
from router.routing.faults import MINOR_STORE_UNAVAILABLE, store_faults
from router.routing.ledger import LedgerSettings, LedgerWriter, maintain

pytestmark = pytest.mark.integration

LONG = LeaseSettings(renew_s=1.0, expiry_s=60.0)
SHORT = LeaseSettings(renew_s=0.05, expiry_s=0.2)    # a lease that expires while the test waits for it to say so
WAIT_S = 30.0
CID = 7


class _Settings:
    node_id = "n1"


class _Membership:
    def __init__(self) -> None:
        self.noticed: list[Exception] = []

    def notice_fenced(self, exc: Exception) -> None:
        self.noticed.append(exc)


class PausedNode:
    """What ``_AcceptFence`` reads of a node (``router.node.cluster.ClusterRole``): n1 at epoch 1, which it still
    believes live (it was paused: it has not renewed since)."""

    def __init__(self, db: Database) -> None:
        self.s = _Settings()
        self.db = db
        self.membership = _Membership()

    def _live_epoch(self) -> int | None:
        return None if self.membership.noticed else 1


@pytest.fixture
def db(fresh_db: str) -> Iterator[Database]:
    database = Database(fresh_db, 4)
    database.open()
    with database.unit_of_work() as conn:
        maintain(conn, retention_days=2, ahead_days=1)
        conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (%s, '{}', '{}')", (CID,))
    yield database
    database.close()


def _join(db: Database, node: str, settings: LeaseSettings = LONG) -> int:
    with db.unit_of_work() as conn:
        return M.join(conn, node, f"{node}.example:2809", settings)


def _wait_expired(db: Database, node: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.05)):
        with db.statement() as conn:
            if node in expired(M.members(conn)):
                return
        done.wait(0.05)
    raise AssertionError(f"the lease of {node} did not expire within {WAIT_S} s")


def _event(seq: int) -> NewEvent:
    return NewEvent(seq, 2, b"\x00body" * 50, 4, None, None, [(1, 3)])


def _stored(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM nsjms_event WHERE channel_id = %s), "
                           "(SELECT count(*) FROM nsjms_queue WHERE channel_id = %s), "
                           "(SELECT count(*) FROM nsjms_ledger WHERE channel_id = %s)", (CID, CID, CID)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _accept(db: Database, ledgered: bool = True) -> tuple[GroupCommit, PausedNode]:
    node = PausedNode(db)
    db.statement_fence = _AcceptFence(node)  # type: ignore[arg-type]   # the node's wiring (nodecluster)
    store = Store(LedgerWriter(LedgerSettings(enabled=ledgered), node_id="n1"))
    return GroupCommit(db, store, one_statement=True, max_wait=WAIT_S), node


def _push(commits: GroupCommit, events: list[NewEvent]) -> list[int]:
    """As the channel's servant pushes (its store boundary answers the client)."""
    with store_faults():
        return commits.insert(CID, events)


@pytest.mark.parametrize("size", [1, 3])      # the scalar one-event statement, the array statement
def test_a_paused_node_taken_over_stores_nothing_and_its_push_is_transient(db: Database, fresh_db: str,
                                                                            size: int) -> None:
    assert _join(db, "n1", SHORT) == 1
    survivor = _join(db, "n2")
    with db.unit_of_work() as conn:
        M.assign(conn, ("channel", CID), "n1")
    commits, node = _accept(db)
    assert len(_push(commits, [_event(s) for s in range(1, size + 1)])) == size     # the owner's push stores
    assert _stored(fresh_db) == (size, size, size)
    assert commits._lane.statements == 1                     # on the group committer's lane (router/db/lane.py)
    _wait_expired(db, "n1")                                  # n1 paused past its lease: n2 takes it over
    with db.unit_of_work() as conn:
        assert claim_all(conn, "n1", "n2", survivor)[0] == 2
    with pytest.raises(CORBA.TRANSIENT) as err:              # n1 wakes (epoch 1 still in its memory) and accepts
        _push(commits, [_event(s) for s in range(10, 10 + size)])
    assert err.value.minor == MINOR_STORE_UNAVAILABLE and err.value.completed == CORBA.COMPLETED_NO
    assert isinstance(err.value.__cause__, WriteFenced)
    assert _stored(fresh_db) == (size, size, size)           # nothing of the refused push reached a table
    assert len(node.membership.noticed) == 1 and isinstance(node.membership.noticed[0], Fenced)
    with pytest.raises(CORBA.TRANSIENT):                      # it knows now: refused before any statement
        _push(commits, [_event(20)])
    assert _stored(fresh_db) == (size, size, size)


def test_a_channel_that_moved_is_not_written_by_its_old_owner(db: Database, fresh_db: str) -> None:
    _join(db, "n1")
    _join(db, "n2")
    with db.unit_of_work() as conn:
        M.assign(conn, ("channel", CID), "n1")
    commits, node = _accept(db, ledgered=False)
    with db.unit_of_work() as conn:                          # a hand-over: n1 stays live, the channel is n2's
        assert M.claim(conn, ("channel", CID), "n1", "n2")
    with pytest.raises(CORBA.TRANSIENT):
        _push(commits, [_event(1)])
    assert _stored(fresh_db) == (0, 0, 0)
    assert node.membership.noticed == []                     # still a live member: it keeps running
    with db.statement() as conn:                             # the new owner's statement is accepted
        Store(LedgerWriter(LedgerSettings(enabled=False))).insert_events(conn, CID, [_event(2)],
                                                                         fence=FenceToken("n2", 1))
    assert _stored(fresh_db) == (1, 1, 0)


def test_a_push_waiting_for_the_takeover_stores_nothing_once_it_commits(db: Database, fresh_db: str) -> None:
    _join(db, "n1", SHORT)
    survivor = _join(db, "n2")
    with db.unit_of_work() as conn:
        M.assign(conn, ("channel", CID), "n1")
    commits, _ = _accept(db)
    _wait_expired(db, "n1")
    takeover = psycopg.connect(fresh_db)                      # the survivor's takeover, open (not committed)
    assert claim_all(takeover, "n1", "n2", survivor)[0] == 2
    outcome: list[Any] = []

    def push() -> None:
        try:
            outcome.append(_push(commits, [_event(1)]))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread's assertion
            outcome.append(exc)

    t = threading.Thread(target=push)
    t.start()
    with psycopg.connect(fresh_db, autocommit=True) as watch:  # the push waits for the takeover's row lock
        for _ in range(int(WAIT_S / 0.02)):
            waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND query LIKE '%%INSERT INTO nsjms_event%%'").fetchone()
            if waiting and waiting[0]:
                break
            threading.Event().wait(0.02)
        else:
            raise AssertionError("the push never waited for the takeover's lock")
    assert not outcome                                        # still waiting
    takeover.commit()
    takeover.close()
    t.join(WAIT_S)
    assert len(outcome) == 1 and isinstance(outcome[0], CORBA.TRANSIENT), outcome
    assert _stored(fresh_db) == (0, 0, 0)
