"""ProxyQueue.park (issue 27): a dispatcher that cannot deliver (its proxy suspended, not connected or closing) is
not woken by every new entry, only by wake(), close() or its timeout; a waiting dispatcher still is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from router.channel.events import Event, Form
from router.channel.queue import FIFO_ORDER, ProxyQueue, Record

DEADLINE_S = 20.0


def wait_for(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def _queue() -> tuple[ProxyQueue, list[int]]:
    q = ProxyQueue(FIFO_ORDER, 0, 0, lambda entries, reason: None)
    notified: list[int] = []
    real = q.cond.notify_all

    def notify_all() -> None:
        notified.append(1)
        real()

    q.cond.notify_all = notify_all  # type: ignore[method-assign]
    return q, notified


def _record(seq: int) -> Record:
    return Record(seq, Event(Form.STRUCTURED, seq), 0, None, None, False, None)


def _in_wait(q: ProxyQueue, wait: Callable[[float], None]) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        wait(DEADLINE_S * 3)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_parked_dispatcher_is_not_woken_by_new_entries_but_by_wake() -> None:
    q, notified = _queue()
    done = _in_wait(q, q.park)
    wait_for(lambda: q._parked == 1, "the dispatcher to park")   # counted under the lock, before it waits
    q.put(_record(1))
    q.put(_record(2))
    assert notified == [] and not done.is_set() and len(q) == 2
    q.wake()
    assert done.wait(DEADLINE_S)
    assert q._parked == 0
    q.put(_record(3))                                            # nobody parked: a put notifies again
    assert notified == [1, 1]


def test_close_ends_a_park() -> None:
    q, _ = _queue()
    done = _in_wait(q, q.park)
    wait_for(lambda: q._parked == 1, "the dispatcher to park")
    q.close()
    assert done.wait(DEADLINE_S)


def test_a_waiting_dispatcher_is_woken_by_a_new_entry() -> None:
    q, notified = _queue()
    done = _in_wait(q, q.wait)
    wait_for(lambda: len(q.cond._waiters) == 1, "the dispatcher to wait")   # type: ignore[attr-defined]
    q.put(_record(1))
    assert notified == [1]
    wait_for(done.is_set, "the waiting dispatcher to wake")
