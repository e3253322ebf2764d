"""The dedupe id of an event for one proxy supplier, and how it reaches a channel → JMS bridge (issue 31).

Every JMS message a bridge sends for a channel event carries the JMS property ``nsjms_dedupe_id``, the same each
time the same event is sent to the same bridge again (a batch whose broker receipt was lost, an event delivered
again after a crash), so a JMS consumer recognises a duplicate. Routing transactions (T2) number their messages
themselves (``<gtrid>/<index>``, ``router.bridge.txout``); without T2 the id is the channel's id of the obligation,
the one its ledger records (``router.routing.ledger``):

* ``e<event>/c<channel>/a<admin>/p<proxy>`` for a stored event (:func:`router.routing.ledger.channel_dedupe_id`): stable
  across restarts, since the event's row id and the proxy are;
* ``b<run>/s<seq>/c<channel>/a<admin>/p<proxy>`` for a BestEffort event
  (:func:`router.routing.ledger.volatile_dedupe_id`), which never outlives the run that accepted it.

A bridge fed in-process by its push proxy (``router.channel.localpush``) gets the ids with each batch. A bridge the
channel pushes to, or that pulls, over CORBA (an acknowledging proxy, a pull endpoint) gets the events as CORBA
values: for a proxy that feeds a bridge of this node (its ledger route names one), ``convert`` appends the id to
each event's variable header as ``nsjms_dedupe_id`` (:func:`router.mapping.dedupe.stamped`, replacing one from
upstream), and the bridge takes it out again before mapping (:func:`router.mapping.dedupe.taken`), so the JMS
message carries it as its property and nothing else of the event changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from router.channel.queue import Entry
from router.routing.ledger import channel_dedupe_id, volatile_dedupe_id

if TYPE_CHECKING:
    from router.channel.proxyport import ProxyView

__all__ = ["dedupe_ids"]


def dedupe_ids(proxy: ProxyView, entries: Sequence[Entry]) -> list[str]:
    """Each entry's dedupe id for ``proxy`` (see the module docstring)."""
    cid, aid, pid = proxy.channel.id, proxy.admin.id, proxy.id
    suffix = channel_dedupe_id(0, cid, aid, pid)[2:]       # "/c…/a…/p…": one format per batch, not per event
    run = None
    out: list[str] = []
    for e in entries:
        db_id = e.record.db_id
        if db_id is not None:
            out.append(f"e{db_id}{suffix}")                 # = channel_dedupe_id(db_id, cid, aid, pid)
        else:
            if run is None:
                run = proxy.rt.store.ledger.run_id
            out.append(volatile_dedupe_id(run, e.record.seq, cid, aid, pid))
    return out
