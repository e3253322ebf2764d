"""The old owner's side of a hand-off (router/cluster/handoff.py): stop one channel and its bridges on this node
without touching what PostgreSQL keeps of them, so that another node can load them and resume.

Order (each step bounded by ``timeout_s``; docs/cluster.md, "Placement and operations"):

1. the bridges' own loops (JMS -> channel receive, channel pulled by the bridge) stop after the round in flight,
   a routing transaction included: nothing more comes in from the broker here;
2. the channel's gate closes (:class:`router.channel.gate.Gate`): the accepts in flight end, new ones get
   ``TRANSIENT``, and so do a proxy's connect, suspend and resume (a proxy made during the stop cannot start a
   worker here); then every proxy stops (``stop_for_handoff``, the protocol
   :class:`router.channel.proxyport.HandOffProxy`) and its delivery or pull thread ends after its push or T2 in
   flight and the delete of its delivered events' rows; then the phase two of its decided T2s ends (channel -> JMS:
   the broker's COMMIT of the sends; JMS -> channel: the broker's COMMIT of the acknowledgements); then the rows of
   delivered events whose delete failed (the database away) are deleted, retried until it works;
3. each bridge's T2s in progress end (``quiesce``) and its broker connections close (unacknowledged messages go
   back to the broker, which redelivers them to the new owner);
4. the servants are deactivated and forgotten. Stored rows stay: queued events, proxies, admins, bridges.

The caller then moves the ownership in ONE fenced transaction (:func:`router.cluster.handoff.release`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Pending", "stop_channel", "wait_pending"]

log = logging.getLogger("nsjms.cluster")


@dataclass(frozen=True)
class Pending:
    """Something of a stopping channel that had not ended in time: ``label`` for the log, ``wait(deadline)`` waits
    again (until the ``time.monotonic()`` deadline) and says whether it has ended. The hand-off keeps these and waits
    on them at each later pass; the channel is released only once every one has ended (review of this session: they
    were kept as text, and a later pass found nothing to wait for and released the channel with an accept or a
    phase two still running)."""

    label: str
    wait: Callable[[float], bool]


def wait_pending(pending: Iterable[Pending], deadline: float) -> list[Pending]:
    """Wait for each in order (until ``deadline``); returns those still running: the first that has not ended and
    every one after it, not asked (a later step counts only once the earlier ones ended: the delete of a proxy's
    delivered rows after its delivery thread's last delete)."""
    items = list(pending)
    for i, p in enumerate(items):
        if not p.wait(deadline):
            return items[i:]
    return []


def _thread(t: threading.Thread) -> Pending:
    def wait(deadline: float) -> bool:
        t.join(max(0.0, deadline - time.monotonic()))
        return not t.is_alive()
    return Pending(f"thread {t.name}", wait)


def _threads(names: Iterable[str], deadline: float) -> list[Pending]:
    wanted = set(names)
    return _each([_thread(t) for t in threading.enumerate()
                  if t.name in wanted and t is not threading.current_thread()], deadline)


def _each(pending: Iterable[Pending], deadline: float) -> list[Pending]:
    """Wait for each of these independent ones (until ``deadline``); returns those still running."""
    return [p for p in pending if not p.wait(deadline)]


def _drained(drain: Callable[[Any, float], bool], obj: Any) -> Callable[[float], bool]:
    def wait(deadline: float) -> bool:
        return bool(drain(obj, max(0.0, deadline - time.monotonic())))
    return wait


def _retried(attempt: Callable[[], bool]) -> Callable[[float], bool]:
    """``attempt`` until it says True or the deadline passed (backing off: it waits for the database)."""
    def wait(deadline: float) -> bool:
        backoff = 0.05
        while not attempt():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, 1.0)
        return True
    return wait


def _guarded(what: str, fn: Callable[..., Any], *args: Any) -> None:
    """One step of a stop that must not end the stop when it fails (logged): the rest of the teardown still runs,
    so the channel is never left registered here with its gate closed and its proxies stopped (nothing could load
    it again: it would answer TRANSIENT for ever)."""
    try:
        fn(*args)
    except Exception:  # logged; the teardown goes on
        log.exception("hand-off stop: %s failed (the stop goes on)", what)


def stop_channel(factory: Any, bridges: Any, cid: int, bids: Collection[int], timeout_s: float,
                 drain_supplier: Callable[[Any, float], bool]) -> list[Pending]:
    """Stop channel ``cid`` of ``factory`` (the node's EventChannelFactoryImpl) and the bridges ``bids`` of
    ``bridges`` (its BridgeFactoryImpl) here, as the module docstring says; those not loaded are skipped.
    ``drain_supplier(proxy, timeout_s)``: waits for the phase two of a proxy supplier's decided T2s
    (``router.channel.txdelivery.drain``; this package sits below the channel's). Returns what did not end within
    ``timeout_s`` (:class:`Pending`, to be waited on again; empty: a clean stop)."""
    deadline = time.monotonic() + timeout_s
    loaded = [b for b in (bridges.bridges.get(bid) for bid in sorted(bids)) if b is not None]
    stuck: list[Pending] = []
    for b in loaded:                                            # 1. the bridges' own loops
        b.stop_event.set()
    stuck += _threads([n for b in loaded for n in (f"bridge-{b.id}-recv", f"bridge-{b.id}-pull")], deadline)
    channel = factory.channels.get(cid)
    if channel is not None:                                     # 2. the channel
        gate = channel.gate
        if not gate.close(max(0.0, deadline - time.monotonic())):
            stuck.append(Pending(f"channel {cid}: accepts in flight",
                                 _drained(lambda g, timeout: bool(g.close(timeout)), gate)))
        suppliers = [p for a in list(channel.consumer_admins.values()) for p in list(a.proxies.values())]
        admins = list(channel.consumer_admins.values()) + list(channel.supplier_admins.values())
        proxies = [p for a in admins for p in list(a.proxies.values())]
        for p in proxies:                   # a proxy made after this list cannot connect: the gate is closed
            _guarded(f"proxy {p.oid}: stop", p.stop_for_handoff)
        stuck += _threads([n for p in proxies for n in (f"push-{p.oid}", f"pull-{p.oid}")], deadline)
        # the phase two of their decided T2s (completer threads): channel -> JMS (a proxy supplier's), JMS -> channel
        # (a proxy consumer's inbound driver, router/channel/t2in.py)
        phase_two = [Pending(f"proxy {p.oid}: phase two of its routing transactions", _drained(drain_supplier, p))
                     for p in suppliers]
        phase_two += [Pending(f"proxy {p.oid}: phase two of its inbound routing transactions",
                              _drained(lambda obj, timeout: bool(obj.drain_inbound(timeout)), p)) for p in proxies]
        stuck += _each(phase_two, deadline)
        # the rows of delivered events whose delete failed (the database away during the stop): deleted before the
        # release, else the next owner delivers those events again. Waited on at later passes with the rest when
        # something had not ended (its delivery thread's last delete comes after)
        deletes = [Pending(f"proxy {p.oid}: delete of its delivered events' rows", _retried(p.delete_delivered_rows))
                   for p in proxies]
        stuck += deletes if stuck else wait_pending(deletes, deadline)
    for b in loaded:                                            # 3. the bridges' T2s and broker connections
        with b._lock:
            b.started = False
            b.destroyed = True                                  # in memory only: its supervisor ends
        b._wake.set()
        _guarded(f"bridge {b.id}: its T2 sender", b._close_t2_out)
        if b.transport is not None:
            _guarded(f"bridge {b.id}: its broker connection", b.transport.close)
    rt = factory.rt
    for b in loaded:                                            # 4. servants: forgotten first (a request for a
        bridges.forget(b.id)                                    # deactivated id then finds it not loaded here:
        if b._t2_ior is not None and getattr(rt, "t2", None) is not None:      # retry, not "gone")
            _guarded(f"bridge {b.id}: its T2 registration", rt.t2.unregister_local, b._t2_ior)
        _guarded(f"bridge {b.id}: its endpoint", rt.endpoints.remove, b.endpoint_servant)
        rt.deactivate(b._endpoint_oid())
        rt.deactivate(b.oid)
    if channel is not None:
        channel.destroyed = True                                # in memory only: nothing more is routed here
        factory.forget(cid)
        for a in admins:
            for p in list(a.proxies.values()):
                rt.deactivate(p.oid)
            rt.deactivate(a.oid)
        rt.deactivate(channel.oid)
    if stuck:
        log.warning("hand-off of channel %d: still running after %g s: %s", cid, timeout_s,
                    ", ".join(p.label for p in stuck))
    return stuck
