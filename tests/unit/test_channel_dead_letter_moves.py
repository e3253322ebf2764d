"""The channel's dead-letter decisions without services: a poison event moves to the dead-letter store in the unit
of work that removes it from the queue (never a log line only), the reason an operator reads, where a retry goes.

The proxy machinery and its fakes are those of ``test_channel_delivery`` (the database is a ``NullDatabase``, whose
units of work are distinct objects, so "the same unit of work" is an identity check).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_channel_delivery import Consumer, make_proxy, record, run_worker, stop, wait_for

from omniORB import CORBA

from router.channel import proxies as P
from router.channel.boundary import POISON_ATTEMPTS
from router.channel.deadletters import DeadLetter, RetryTarget, readable_reason, retry_target


def _refusing(exc: BaseException, seq: int) -> Consumer:
    return Consumer(lambda seqs: exc if seq in seqs else None)


@pytest.mark.parametrize("exc, words", [
    (CORBA.DATA_CONVERSION(0, CORBA.COMPLETED_NO), "code set"),
    (CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO), "bad parameter"),
    (CORBA.MARSHAL(0, CORBA.COMPLETED_NO), "unmarshal"),
])
def test_a_poison_event_moves_to_the_dead_letter_store_in_the_unit_of_work_that_dequeues_it(
        monkeypatch: pytest.MonkeyPatch, exc: BaseException, words: str) -> None:
    consumer = _refusing(exc, 2)
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    for i in (1, 2, 3):
        proxy.queue.put(record(i, db_id=100 + i))
    t = run_worker(proxy)
    try:
        wait_for(lambda: consumer.got == [1, 3], "the events around the refused one")
        wait_for(lambda: proxy.rt.dead_letters.queued, "the dead letter")
    finally:
        stop(proxy, t)
    [(conn, eid, details)] = proxy.rt.dead_letters.queued          # before: deleted with a log line only
    assert eid == 102
    assert (102, conn) in proxy.rt.store.conns                     # the SAME unit of work removed its queue row
    assert details["dedupe_id"] == "e102/c0/a0/p1"                 # the ledger obligation it ended
    assert details["attempts"] == POISON_ATTEMPTS
    assert words in details["reason"] and f"{POISON_ATTEMPTS} time(s)" in details["reason"]
    assert details["exception"].startswith(type(exc).__name__)
    assert proxy.rt.store.outcomes[102][0] == "dead_letter"


def test_when_the_dead_letter_cannot_be_written_the_event_stays_queued_and_the_write_is_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _refusing(CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO), 1)
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy.rt.dead_letters.refuse = 2                               # PostgreSQL restarting, say
    proxy.queue.put(record(1, db_id=201))
    proxy.queue.put(record(2, db_id=202))
    t = run_worker(proxy)
    try:
        wait_for(lambda: consumer.got == [2], "the event behind it")
        wait_for(lambda: proxy.rt.dead_letters.queued, "the dead letter, once the store answers")
    finally:
        stop(proxy, t)
    db = proxy.rt.db
    assert db.rolled_back >= 2                                     # the failed attempts removed nothing
    assert [eid for _, eid, _ in proxy.rt.dead_letters.queued] == [201]
    assert proxy.rt.store.deleted.count(201) == 1                  # deleted once, with the dead letter written


def test_a_best_effort_poison_event_is_kept_too(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _refusing(CORBA.DATA_CONVERSION(0, CORBA.COMPLETED_NO), 1)
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy.channel.volatile_accepted_at = lambda seq: 1_700_000_000.0
    proxy.rt.store.ledger.run_id = "run1"
    proxy.queue.put(record(1))                                     # not stored: no queue row to copy
    t = run_worker(proxy)
    try:
        wait_for(lambda: proxy.rt.dead_letters.rows, "the BestEffort dead letter")
    finally:
        stop(proxy, t)
    [(_, row)] = proxy.rt.dead_letters.rows
    assert (row.side, row.persistent, row.seq, row.dedupe_id) == ("C", False, 1, "brun1/s1/c0/a0/p1")
    assert "code set" in row.reason
    # The fake event (an int) has no CDR encoding: kept without a body, and the reason says so.
    assert row.body is None and "could not be encoded" in row.reason


def test_the_readable_reason_names_the_failure_and_the_attempts() -> None:
    assert readable_reason(ValueError("x"), 3) == ("the channel could not convert it for this consumer (ValueError); "
                                                   "failed alone 3 time(s), so the channel stopped trying")
    assert "NO_PERMISSION" in readable_reason(CORBA.NO_PERMISSION(0, CORBA.COMPLETED_NO), 1)


def _dl(**kw: Any) -> DeadLetter:
    base: dict[str, Any] = dict(id=1, dedupe_id="e1/c7/a0/p2", channel_id=7, side="C", admin_id=0, proxy_id=2,
                                event_id=1, seq=5, form=1, body=b"x", priority=0, deadline=None, start_at=None,
                                persistent=True, event_name="d/t/n", reason="r", exception="e", attempts=3,
                                received_at=0.0, dead_at=1.0)
    base.update(kw)
    return DeadLetter(**base)


@pytest.mark.parametrize("dl, channel, proxy, target", [
    (_dl(), True, True, RetryTarget.PROXY),                        # back into that proxy's queue
    (_dl(), True, False, RetryTarget.CHANNEL),                     # the proxy is gone: the channel routes it
    (_dl(), False, True, RetryTarget.REFUSED),                     # the channel is gone
    (_dl(side="S"), True, True, RetryTarget.CHANNEL),              # a refused pulled event: routed (and checked)
    (_dl(body=None), True, True, RetryTarget.REFUSED),             # nothing to deliver
])
def test_where_a_retry_goes(dl: DeadLetter, channel: bool, proxy: bool, target: RetryTarget) -> None:
    got, why = retry_target(dl, channel_alive=channel, proxy_alive=proxy)
    assert got is target and why


def test_the_summary_has_no_body_but_its_size() -> None:
    summary = _dl(body=b"abc").summary()
    assert "body" not in summary and summary["size"] == 3 and summary["reason"] == "r"
