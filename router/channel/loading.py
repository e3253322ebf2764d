"""Loading a channel into this node, all or nothing (docs/cluster.md, "Loading is all or nothing").

A channel runs here once its servant, its filter factory, its admins and proxies are active, its queued events are
in their proxies' queues and its proxies' workers run (``EventChannelImpl.restore``). A load that fails half-way
(a database error, an activation refused) used to leave the channel registered in the factory with part of its
objects active: the next attempt found it "loaded" and did nothing, so the proxies not activated answered
``OBJECT_NOT_EXIST`` for ever and the flows through them stalled (seen with ``cluster.rebalance_on_join``).

:func:`load` makes the channel and, when anything of it fails, undoes it before re-raising: the workers started are
stopped as a hand-off stops them (:func:`router.cluster.release.stop_channel`: nothing stored is touched), the
channel is unregistered, its filters retired and every object id the load activated deactivated
(``Forwarder.recording``). What PostgreSQL holds of the channel stays as it was, so the next attempt loads it
whole.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator
from typing import Any

from router.channel.txdelivery import drain
from router.cluster.release import stop_channel

__all__ = ["UNLOAD_STOP_S", "LoadFailed", "drop_created", "load", "unload"]

log = logging.getLogger("nsjms.channel")

#: How long an undone load waits for the workers it had started (they have barely begun)
UNLOAD_STOP_S = 10.0


class LoadFailed(Exception):
    """Some channels could not be loaded (each was undone; the others run): ``loaded`` and ``failed`` ids."""

    def __init__(self, loaded: Collection[int], failed: Collection[int]) -> None:
        super().__init__(f"channel(s) {sorted(failed)} could not be loaded (undone; loaded: {sorted(loaded)})")
        self.loaded = sorted(loaded)
        self.failed = sorted(failed)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.loaded, self.failed))


class _NoBridges:
    """The bridge side of :func:`router.cluster.release.stop_channel` when only a channel is undone."""

    def __init__(self) -> None:
        self.bridges: dict[int, Any] = {}

    def forget(self, bid: int) -> None:
        """Nothing to forget."""


@contextlib.contextmanager
def _recording(rt: Any) -> Iterator[list[bytes]]:
    forwarder = getattr(rt, "forwarder", None)
    if forwarder is None or not hasattr(forwarder, "recording"):
        yield []
        return
    with forwarder.recording() as made:
        yield made


def load(factory: Any, cid: int, make: Callable[[], Any]) -> Any:
    """``make()`` the channel ``cid`` of ``factory`` (an ``EventChannelFactoryImpl``), register it and restore it;
    on any failure undo everything (:func:`unload`) and re-raise. Returns the channel."""
    channel = None
    with _recording(factory.rt) as made:
        try:
            channel = make()
            with factory._lock:
                factory.channels[cid] = channel
            channel.restore()
        except BaseException:
            unload(factory, cid, channel, made)
            raise
    return channel


def unload(factory: Any, cid: int, channel: Any, made: Collection[bytes]) -> None:
    """Undo a failed load of channel ``cid``: stop what ``channel`` (None: its servant was not even made) started,
    unregister it, retire its filters, deactivate the ids ``made``. Never raises (logged)."""

    if channel is not None:
        with factory._lock:
            factory.channels[cid] = channel          # stop_channel finds it there (and unregisters it)
        try:
            left = stop_channel(factory, _NoBridges(), cid, (), UNLOAD_STOP_S, drain)
            if left:
                log.warning("channel %d: undoing its failed load, still running: %s", cid,
                            ", ".join(p.label for p in left))
        except Exception:
            log.exception("channel %d: stopping it after its failed load failed", cid)
    with factory._lock:
        if factory.channels.get(cid) is channel:
            del factory.channels[cid]
    node_filters = getattr(factory, "filter_factory", None)
    if node_filters is not None:
        try:
            node_filters.retire(cid)
        except Exception:
            log.exception("channel %d: retiring its filters after its failed load failed", cid)
    for oid in made:
        try:
            factory.rt.deactivate(oid.decode("utf-8", "replace"))
        except Exception:
            log.exception("channel %d: deactivating %r after its failed load failed", cid, oid)
    log.warning("channel %d: its load failed and was undone (%d object(s) deactivated); it is loaded again whole",
                cid, len(made))


def drop_created(rt: Any, cid: int) -> None:
    """A channel just created whose load failed (undone): its stored rows are deleted too, so that nothing is left
    that no node runs (the client was told the create failed). Never raises (logged)."""
    try:
        with rt.db.unit_of_work() as conn:
            rt.store.delete_channel(conn, cid)
    except Exception:
        log.exception("channel %d: deleting it after its failed creation failed; it is loaded at the next start", cid)
