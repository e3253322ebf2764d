"""Sequence proxies with ``PacingInterval`` 0 deliver what is queued (NS 2.5.5), push and pull.

NS 2.5.5 defines PacingInterval as "the maximum period of time the channel will collect individual events into a
sequence before delivering the sequence"; with 0 no time is spent collecting. Before the fix a sequence push proxy
with fewer than MaximumBatchSize events queued and PacingInterval 0 never delivered them (``_ready`` answered
"take 0"), and a blocking sequence pull waited until it gave up with TRANSIENT.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from router.channel import proxies as P
from router.channel.events import Event, Form
from router.channel.gate import Gate
from router.channel.queue import FIFO_ORDER, ProxyQueue, Record

_TIMET = 10_000_000     # TimeBase::TimeT units per second


class _Rt:
    max_event_bytes = 0
    shutting_down = threading.Event()


def _proxy(cls: type, *, batch: int, pacing_s: float) -> Any:
    proxy: Any = object.__new__(cls)
    proxy.rt = _Rt()
    proxy.form = "SEQUENCE"
    proxy.qos = {"MaximumBatchSize": batch, "PacingInterval": int(pacing_s * _TIMET)}
    proxy.connected, proxy.suspended, proxy.destroyed = True, False, False
    proxy.closing, proxy.channel = False, SimpleNamespace(gate=Gate())   # a pull checks its channel is not moving
    proxy.queue = ProxyQueue(FIFO_ORDER, 0, 0, lambda entries, why: None)
    return proxy


def _fill(proxy: Any, n: int) -> None:
    for seq in range(1, n + 1):
        proxy.queue.put(Record(seq, Event(Form.STRUCTURED, seq), 0, None, None, False))


def test_sequence_push_without_pacing_delivers_a_partial_batch() -> None:
    proxy = _proxy(P.SequenceProxyPushSupplierImpl, batch=10, pacing_s=0)
    _fill(proxy, 3)
    assert proxy.ready_count(None) == (3, None)          # before the fix: (0, None), forever


def test_sequence_push_takes_at_most_a_full_batch() -> None:
    proxy = _proxy(P.SequenceProxyPushSupplierImpl, batch=10, pacing_s=0)
    _fill(proxy, 25)
    assert proxy.ready_count(None) == (10, None)


def test_sequence_push_with_pacing_still_collects_a_partial_batch() -> None:
    proxy = _proxy(P.SequenceProxyPushSupplierImpl, batch=10, pacing_s=3600)
    _fill(proxy, 3)
    n, since = proxy.ready_count(None)
    assert n == 0 and since is not None             # the pacing interval has not elapsed: keep collecting


def test_sequence_pull_without_pacing_returns_what_is_queued() -> None:
    proxy = _proxy(P.SequenceProxyPullSupplierImpl, batch=10, pacing_s=0)
    proxy.max_pull_wait = 1.0                       # before the fix: TRANSIENT after this wait, nothing returned
    _fill(proxy, 3)
    entries = proxy._blocking_wait(lambda: 10)
    assert [e.record.seq for e in entries] == [1, 2, 3]
