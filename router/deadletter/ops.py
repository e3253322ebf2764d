"""The operations on the channel's dead-letter store: list, show, retry, discard (``nsjms deadletter``, the console).

They run inside the node (the CLI reaches them over IIOP through ``NsjmsAdmin::DeadLetterAdmin``,
:mod:`router.deadletter.admin`), because a retry must go into the live queues:

* **retry**: in ONE unit of work the row is locked, the event is stored again as a new event (new event id, new seq,
  the stored QoS: priority, deadline, start time, persistence) with its queue row(s) and ``accepted`` ledger row(s)
  (a new obligation; the old one keeps its ``dead_letter`` row), and the row is deleted; after the commit the event
  is queued in memory. Where it goes is :func:`router.channel.deadletters.retry_target`: back into the proxy supplier
  that gave up on it, or, that proxy gone (or a pulled event the channel refused), routed by the channel again (its
  filters choose the consumers; a pulled event passes the channel's QoS and size checks again). Refused (exception
  :class:`Refused`, the row kept) when the channel is gone or no consumer wants the event. For a persistent event a
  crash after the commit loses nothing (the queue rows are restored at start); a BestEffort event is queued in
  memory only, as BestEffort events are. Routed by the channel again (its proxy gone), it also reaches consumers
  that had received the original (docs/operations.md).
* **discard**: the row is deleted (its ledger obligation already ended ``dead_letter``).

Every retry and discard, done or refused, is appended to the operator log (``<state_dir>/txn-operator.log``,
:func:`router.routing.t2.ops.operator_log`). Results are plain dicts (the JSON ``--json`` prints).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omniORB import CORBA

from router.channel.boundary import describe
from router.channel.channel import RoutePlan
from router.channel.deadletters import DeadLetter, DeadLetterStore, RetryTarget, retry_target
from router.channel.events import Event, Form, decode
from router.channel.queue import Record
from router.db import StoreUnavailable
from router.routing.t2.ops import operator_log

__all__ = ["DeadLetterOps", "Refused", "describe_value"]

_VALUE_CHARS = 200


class Refused(Exception):
    """The operator's request is refused; the message says why (nothing changed)."""


class _ChannelSource:
    """The supplier side of a re-routed pulled event whose proxy consumer is gone: the channel's QoS, no filter."""

    admin = None

    def __init__(self, channel: Any) -> None:
        self.qos = dict(channel.qos)
        self.oid = f"channel {channel.id} (dead-letter retry)"

    def admits(self, event: Event) -> bool:
        return True


class DeadLetterOps:
    """List, show, retry and discard the dead letters of one node's channels (see the module docstring)."""

    def __init__(self, node: str, state_dir: Path, db: Any, dead_letters: DeadLetterStore, channels: Any, *,
                 next_seq: Callable[[], int], mode: str = "online") -> None:
        """``channels``: the node's channel factory (its ``channels`` dict by id); ``next_seq``: the runtime's."""
        self.node, self.state_dir, self.db, self.store = node, state_dir, db, dead_letters
        self.channels, self.next_seq, self.mode = channels, next_seq, mode
        self._serial = threading.Lock()     # one operator action at a time (rows are also locked FOR UPDATE)

    # --------------------------------------------------------------------------------------------------- read
    def listing(self, channel: int | None = None, limit: int = 1000) -> dict[str, Any]:
        with self.db.unit_of_work() as conn:
            rows, total = self.store.listing(conn, channel=channel, limit=limit)
        return {"node": self.node, "channel": channel, "total": total,
                "dead_letters": [dl.summary() for dl in rows]}

    def show(self, dl_id: int) -> dict[str, Any]:
        with self.db.unit_of_work() as conn:
            dl = self.store.get(conn, dl_id)
        if dl is None:
            raise Refused(self._unknown(dl_id))
        out = dl.summary()
        out["event"] = _event_view(dl)
        channel_alive, proxy = self._live(dl)
        out["retry"] = retry_target(dl, channel_alive=channel_alive, proxy_alive=proxy is not None)[1]
        return out

    # ---------------------------------------------------------------------------------------------------- act
    def retry(self, dl_id: int, who: str) -> dict[str, Any]:
        return self._audited("deadletter retry", dl_id, who, "", lambda: self._retry(dl_id))

    def discard(self, dl_id: int, who: str, why: str) -> dict[str, Any]:
        return self._audited("deadletter discard", dl_id, who, why, lambda: self._discard(dl_id))

    def _audited(self, action: str, dl_id: int, who: str, why: str, act: Callable[[], dict[str, Any]]
                 ) -> dict[str, Any]:
        with self._serial:
            try:
                result = act()
            except Refused as exc:
                operator_log(self.state_dir, self.node, self.mode, who, why, action, str(dl_id), f"refused: {exc}")
                raise
            except Exception as exc:
                operator_log(self.state_dir, self.node, self.mode, who, why, action, str(dl_id),
                             f"failed: {type(exc).__name__}: {exc}")
                raise
        operator_log(self.state_dir, self.node, self.mode, who, why, action, str(dl_id), result)
        return result

    def _retry(self, dl_id: int) -> dict[str, Any]:
        stored: Any = None                             # (channel, plan) once the plan's rows are in the transaction
        try:
            with self.db.unit_of_work() as conn:
                dl = self.store.get(conn, dl_id, lock=True)
                if dl is None:
                    raise Refused(self._unknown(dl_id))
                channel_alive, proxy = self._live(dl)
                if proxy is not None and not self.store.proxy_stored(conn, dl.channel_id, dl.admin_id,
                                                                     dl.proxy_id):
                    proxy = None                       # being destroyed: its row is gone
                target, why = retry_target(dl, channel_alive=channel_alive, proxy_alive=proxy is not None)
                if target is RetryTarget.REFUSED:
                    raise Refused(f"dead letter {dl_id}: {why}")
                channel = self.channels.channels[dl.channel_id]
                plan = self._plan(channel, dl, proxy if target is RetryTarget.PROXY else None)
                channel.store_in(conn, plan)
                stored = (channel, plan, dl, target, why)
                self.store.delete(conn, dl_id)
        except StoreUnavailable as exc:
            # the COMMIT's answer was lost (review finding): if it committed, the dead letter is gone and the event
            # stored; queue it now, or it waits for the next start (a second retry would find no dead letter)
            if not exc.in_doubt or stored is None or not self._committed(stored[1]):
                raise
        channel, plan, dl, target, why = stored
        channel.publish(plan)
        rec, targets = plan.plans[0]
        return {"id": dl_id, "retried": True, "target": target.value, "how": why, "channel": dl.channel_id,
                "proxies": [f"{p.admin.id}/{p.id}" for p in targets], "event_id": rec.db_id, "seq": rec.seq}

    def _committed(self, plan: Any) -> bool:
        """Whether the rows of a retry whose COMMIT broke exist (one more short unit of work; an unreachable store
        raises, and the operator is told the retry failed: its event is then queued at the next start)."""
        ids = [rec.db_id for rec, _ in plan.plans if rec.db_id is not None]
        if not ids:
            return False
        with self.db.unit_of_work() as conn:
            row = conn.execute("SELECT count(*) FROM nsjms_event WHERE id = ANY(%s)", (ids,)).fetchone()
        return bool(row and int(row[0]))

    def _discard(self, dl_id: int) -> dict[str, Any]:
        with self.db.unit_of_work() as conn:
            dl = self.store.get(conn, dl_id, lock=True)
            if dl is None:
                raise Refused(self._unknown(dl_id))
            self.store.delete(conn, dl_id)
        return {"id": dl_id, "discarded": True, "channel": dl.channel_id, "event": dl.event_name,
                "dedupe_id": dl.dedupe_id}

    # ------------------------------------------------------------------------------------------------ helpers
    def _live(self, dl: DeadLetter) -> tuple[bool, Any]:
        """Whether its channel exists, and its proxy supplier when that one still does."""
        channel = self.channels.channels.get(dl.channel_id)
        if channel is None or channel.destroyed:
            return False, None
        if dl.side != "C":
            return True, None
        admin = channel.consumer_admins.get(dl.admin_id)
        proxy = admin.proxies.get(dl.proxy_id) if admin is not None else None
        gone = proxy is None or proxy.destroyed or getattr(proxy, "closing", False)
        return True, None if gone else proxy

    def _plan(self, channel: Any, dl: DeadLetter, proxy: Any) -> RoutePlan:
        """The event stored again and where it goes: ``proxy``, else the channel's routing (refused: nobody)."""
        assert dl.body is not None                     # retry_target refuses a row without a body
        event = decode(dl.form, dl.body)
        if dl.side == "S":
            plan = self._routed(channel, dl, event)
        else:
            seq = self.next_seq()
            rec = Record(seq, event, dl.priority, dl.deadline, dl.start_at, dl.persistent, size=len(dl.body),
                         on_released=channel.released)
            targets = [proxy] if proxy is not None else [
                p for admin in list(channel.consumer_admins.values()) for p in admin.targets_for(event)]
            plan = RoutePlan([(rec, targets)] if targets else [], {seq: dl.body}, 0, None, time.time())
        if not plan.plans:
            raise Refused(f"dead letter {dl.id}: no consumer of channel {dl.channel_id} wants it now (filters, or no "
                          "connected proxy supplier); kept")
        return plan

    @staticmethod
    def _routed(channel: Any, dl: DeadLetter, event: Event) -> RoutePlan:
        """A refused pulled event: through the channel's checks again (QoS headers, size, MaxQueueLength)."""
        admin = channel.supplier_admins.get(dl.admin_id)
        source = admin.proxies.get(dl.proxy_id) if admin is not None else None
        if source is None or source.destroyed:
            source = _ChannelSource(channel)
        try:
            plan: RoutePlan = channel.plan_in(source, [event])
        except CORBA.SystemException as exc:
            raise Refused(f"dead letter {dl.id}: channel {dl.channel_id} refuses it again ({describe(exc)}); "
                          "kept") from None
        return plan

    def _unknown(self, dl_id: int) -> str:
        return f"no dead letter {dl_id} on node {self.node} (retried or discarded already?); `nsjms deadletter list`"


def _event_view(dl: DeadLetter) -> dict[str, Any]:
    """The event's header and filterable data, readable (values shortened); the body's size only."""
    if dl.body is None:
        return {"form": "unknown", "note": "its content could not be encoded"}
    try:
        event = decode(dl.form, dl.body)
    except Exception as exc:  # noqa: BLE001 — shown, not fatal
        return {"form": str(dl.form), "note": f"cannot be decoded: {type(exc).__name__}: {exc}"}
    if event.form is not Form.STRUCTURED:
        return {"form": "any", "value": describe_value(event.value)}
    se: Any = event.value
    fixed = se.header.fixed_header
    return {"form": "structured", "domain": fixed.event_type.domain_name, "type": fixed.event_type.type_name,
            "name": fixed.event_name,
            "variable_header": {p.name: describe_value(p.value) for p in se.header.variable_header},
            "filterable_data": {p.name: describe_value(p.value) for p in se.filterable_data},
            "remainder_of_body": describe_value(se.remainder_of_body)}


def describe_value(value: Any) -> str:
    """A CORBA Any (or any value) as short text for an operator."""
    try:
        inner = value.value() if isinstance(value, CORBA.Any) else value
        text = inner.decode("latin-1") if isinstance(inner, bytes) else str(inner)
    except Exception as exc:  # noqa: BLE001 — shown, not fatal
        text = f"<{type(exc).__name__}>"
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS] + f"… ({len(text)} characters)"
