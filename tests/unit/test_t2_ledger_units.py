"""The ledger calls of a channel → JMS T2 (router.channel.txdelivery) over the twins of tests/unit/test_t2_out.py.

Pinned: an event the bridge dead-letters inside its T2 (after it failed alone) gets a ``dead_letter`` ledger row
with the reason, in that T2's branch, not ``delivered``; the other events' rows are ``delivered``.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_t2_out import FakeStore, Rig

from router.channel.boundary import Outcome
from router.routing.ledger import Outcome as Ledgered


class RecordingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[tuple[list[int], Any, Any]] = []

    def delete_deliveries(self, conn: Any, cid: int, aid: int, pid: int, ids: list[int], **ledger: Any) -> None:
        super().delete_deliveries(conn, cid, aid, pid, ids)
        self.outcomes.append((list(ids), ledger.get("outcome", Ledgered.DELIVERED), ledger.get("reason")))


def test_the_event_the_bridge_dead_letters_in_its_t2_is_a_dead_letter_in_the_ledger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, events=10)
    store = RecordingStore()
    rig.proxy.rt.store = store
    rig.put(5, 6, 7, 8)
    assert rig.round() is Outcome.EVENT_FAILED          # event 7's message is refused: the batch rolls back
    for _ in range(5):
        rig.round()
    assert rig.bodies("out") == ["event 5", "event 6", "event 8"] and len(rig.on("nsjms.DLQ")) == 1
    last = {ids[0]: (outcome, reason) for ids, outcome, reason in store.outcomes if len(ids) == 1}
    assert last[105] == (Ledgered.DELIVERED, None) and last[108] == (Ledgered.DELIVERED, None)
    outcome, reason = last[107]
    assert outcome is Ledgered.DEAD_LETTER and "not authorized" in reason


# -- an event the bridge's mapping cannot express, dead-lettered inside a batch (docs/audit.md, issue 28) ----------
class _Conn:
    """A branch connection that records the ledger's INSERT."""

    def __init__(self) -> None:
        self.inserts: list[list[Any]] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        self.inserts.append(list(params))
        return self


class _Inner:
    name, kind, manager, one_phase_only = "pg", "postgresql", "postgresql", False

    def __init__(self) -> None:
        self.prepared = False

    def sort_key(self) -> str:
        return "pg"

    def begin(self, xid: Any) -> None:
        pass

    def prepare(self) -> None:
        self.prepared = True


def test_a_message_the_bridge_dead_letters_in_a_batch_is_its_events_dead_letter_row() -> None:
    from router.routing.ledger import Direction, LedgerRow, LedgerWriter, T2LedgerBranch, T2Rows, t2_dead_letter

    writer, conn, other = LedgerWriter(node_id="n1"), _Conn(), _Conn()
    rows = T2Rows("n1:g", {1: "n1:g/0", 2: "n1:g/1"}, [
        LedgerRow(f"e{i}/c1/a1/p1", 1, Direction.CHANNEL_TO_JMS, 0.0, Ledgered.DELIVERED, event_id=i,
                  jms_message_id=f"n1:g/{i - 1}", gtrid="n1:g") for i in (1, 2)])
    branch = T2LedgerBranch(writer, conn, _Inner(), rows)
    assert not t2_dead_letter(conn, "n1:g/1", "not mapped"), "no T2 branch on that connection yet"
    branch.begin(None)
    assert t2_dead_letter(conn, "n1:g/1", "event 2 cannot be mapped") and not t2_dead_letter(other, "n1:g/0", "x")
    branch.prepare()
    assert branch.inner.prepared and len(conn.inserts) == 1
    columns = conn.inserts[0]
    outcomes, reasons, messages = columns[15], columns[16], columns[1]
    assert list(zip(messages, outcomes, reasons, strict=True)) == [
        ("n1:g/0", "delivered", None), ("n1:g/1", "dead_letter", "event 2 cannot be mapped")]
    assert not t2_dead_letter(conn, "n1:g/0", "late"), "prepared: the branch's rows are written, none collected"


def test_the_bridge_notes_the_dead_letter_of_an_unmappable_event_in_its_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.bridge import txout

    noted: list[tuple[Any, str, str]] = []
    monkeypatch.setattr(txout, "t2_dead_letter", lambda conn, mid, reason: noted.append((conn, mid, reason)) or True)
    rig = Rig(monkeypatch, events=3)
    rig.put(12, 13, 14)
    assert rig.round() is Outcome.DELIVERED
    gtrid = rig.on("out")[0].headers["nsjms_dedupe_id"].rsplit("/", 1)[0]
    assert [(mid, "cannot be mapped" in reason) for _, mid, reason in noted] == [(f"{gtrid}/1", True)]
    assert noted[0][0] is rig.proxy.rt.db.conn, "on the T2's PostgreSQL branch"
