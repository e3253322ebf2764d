"""A destroy that fails part-way (router.channel.inflight.stopped_pushing): an admin's or a channel's destroy marks
every proxy ``closing`` with one shared teardown deadline, then tears them down one after another. When one
teardown raises StoreError (the client gets TRANSIENT and may retry), the proxies after it were never torn down:
they are re-opened (their queued events delivered meanwhile), and a retried destroy waits a fresh bound, not the
first attempt's deadline (long past: a push in flight would be recorded stuck at once).

Twins: the admin and the channel are plain objects run through the real ``teardown`` / ``destroy``; the proxy
that must go on delivering is a real push supplier built bare (tests/unit/test_channel_delivery.py) running its
real dispatcher loop; the others are twins of a proxy's teardown.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

from omniORB import CORBA

from router.channel import inflight
from router.channel import proxies as P
from router.channel.admins import _AdminBase
from router.channel.channel import EventChannelImpl
from router.channel.inflight import Flight, teardown_bound_s
from router.db.errors import StoreError
from tests.unit.test_channel_delivery import Consumer, make_proxy, record, run_worker, stop, wait_for


class TwinProxy:
    """A proxy's teardown as :meth:`ProxyBase.teardown` does it; ``fail`` makes the store refuse the delete."""

    def __init__(self, fail: bool = False) -> None:
        self._lock = threading.RLock()
        self.destroyed = False
        self.closing = False
        self.connected = True
        self.stop_event = threading.Event()
        self.fail = fail
        self.woken = 0
        self._teardown_deadline: float | None = None  # set by stop_pushing
        self.deadlines: list[float | None] = []      # the deadline each teardown would wait until

    def teardown(self, *, notify_client: bool, retry: bool = False) -> None:
        self.deadlines.append(self._teardown_deadline)
        with self._lock:
            self.closing, self.connected = True, False
            self.stop_event.set()
        if self.fail:
            raise StoreError("injected: the store refused the delete")
        self.destroyed = True

    def _wake(self) -> None:
        self.woken += 1


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def twin_admin(proxies: list[Any], rt: Any) -> Any:
    return types.SimpleNamespace(_lock=threading.RLock(), destroyed=False, rt=rt,
                                 proxies={i: p for i, p in enumerate(proxies)})


def pushing_proxy(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Consumer]:
    consumer = Consumer()
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, consumer, monkeypatch)
    proxy._lock = threading.RLock()
    proxy.push_flight = Flight()
    return proxy, consumer


def test_an_admin_destroy_that_fails_on_the_second_proxy_re_opens_the_third(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(100.0)
    monkeypatch.setattr(inflight, "time", clock)
    first, second = TwinProxy(), TwinProxy(fail=True)
    third, consumer = pushing_proxy(monkeypatch)
    admin = twin_admin([first, second, third], third.rt)
    worker = run_worker(third)
    try:
        third.queue.put(record(1))
        wait_for(lambda: consumer.got == [1], "the first event")
        with pytest.raises(StoreError):
            _AdminBase.teardown(admin, deactivate=False)
        assert first.destroyed and not second.destroyed and not third.destroyed
        third.queue.put(record(2))                    # queued after the failed destroy: delivered, not stranded
        wait_for(lambda: consumer.got == [1, 2], "the third proxy's event after the failed destroy")
        assert worker.is_alive()
        assert not third.closing and third._teardown_deadline is None
        assert second.closing and second.stop_event.is_set(), "the failed teardown's proxy stays stopped"
        assert second._teardown_deadline is None

        clock.now = 500.0                             # the destroy is retried later: a fresh bound
        inflight.stop_pushing([second, third], third.rt)
        fresh = 500.0 + teardown_bound_s(third.rt)
        assert second._teardown_deadline == fresh and third._teardown_deadline == fresh
        assert third.closing
    finally:
        stop(third, worker)


def test_a_retried_admin_destroy_waits_a_fresh_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first destroy (at t=100) fails on the second proxy; the retry at t=500 must not wait until the first
    attempt's deadline (t=100+bound, long past: a push in flight would be recorded stuck at once)."""
    clock = Clock(100.0)
    monkeypatch.setattr(inflight, "time", clock)
    rt = types.SimpleNamespace(push_timeout_ms=1000)
    bound = teardown_bound_s(rt)
    first, second, third = TwinProxy(), TwinProxy(fail=True), TwinProxy()
    admin = twin_admin([first, second, third], rt)
    with pytest.raises(StoreError):
        _AdminBase.teardown(admin, deactivate=False)
    assert third.deadlines == [] and not third.closing and third.woken == 1
    clock.now, second.fail = 500.0, False
    del admin.proxies[0]                               # the first one was torn down (its admin forgot it)
    _AdminBase.teardown(admin, deactivate=False)
    assert second.deadlines == [100.0 + bound, 500.0 + bound]
    assert third.deadlines == [500.0 + bound]
    assert second.destroyed and third.destroyed


def test_a_channel_destroy_that_fails_in_one_admin_re_opens_the_other_admins_proxies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(100.0)
    monkeypatch.setattr(inflight, "time", clock)
    failing, later = TwinProxy(fail=True), TwinProxy()
    third, consumer = pushing_proxy(monkeypatch)
    rt = third.rt

    class Admin:
        def __init__(self, proxies: list[Any]) -> None:
            self._lock, self.destroyed, self.rt = threading.RLock(), False, rt
            self.proxies = {i: p for i, p in enumerate(proxies)}

        def teardown(self, *, deactivate: bool = True) -> None:
            _AdminBase.teardown(self, deactivate=deactivate)  # type: ignore[arg-type]

    channel = types.SimpleNamespace(_lock=threading.RLock(), _deleted=False, destroyed=False, rt=rt,
                                    consumer_admins={0: Admin([failing, later]), 1: Admin([third])},
                                    supplier_admins={})
    worker = run_worker(third)
    try:
        with pytest.raises(CORBA.PERSIST_STORE):      # the StoreError as the boundary answers it to the client
            EventChannelImpl.destroy(channel)  # type: ignore[arg-type]
        assert not later.closing and later.woken >= 1 and later._teardown_deadline is None
        assert not third.closing and third._teardown_deadline is None
        third.queue.put(record(7))
        wait_for(lambda: consumer.got == [7], "the other admin's proxy's event after the failed destroy")
        assert failing.closing and failing._teardown_deadline is None
    finally:
        stop(third, worker)
