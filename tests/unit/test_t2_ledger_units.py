"""The ledger calls of a channel → JMS T2 (router.channel.txdelivery) over the twins of tests/unit/test_t2_out.py.

Pinned: an event the bridge dead-letters inside its T2 (after it failed alone) gets a ``dead_letter`` ledger row
with the reason, in that T2's branch, not ``delivered``; the other events' rows are ``delivered``.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_t2_out import FakeStore, Rig

from router.channel.boundary import Outcome
from router.ledger import Outcome as Ledgered


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
