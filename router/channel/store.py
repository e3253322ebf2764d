"""PostgreSQL persistence of the channel: topology always, events when they are persistent (NS 2.5.5.1).

Tables (created by migration ``router/db/migrations/0001_initial.sql``):

* ``nsjms_channel`` — one row per channel: QoS, admin properties, id counters.
* ``nsjms_admin`` — consumer ('C') and supplier ('S') admins, with QoS, operator and filter references.
* ``nsjms_proxy`` — proxies of both sides: kind, QoS, connected client reference (IOR), suspension, filters.
* ``nsjms_event`` — persistent events (CDR encapsulation) with their delivery attributes.
* ``nsjms_queue`` — which proxy supplier still has to deliver which persistent event.
* ``nsjms_ledger`` — the delivery ledger (:mod:`router.routing.ledger`): the store writes its rows for persistent events
  in the same unit of work that stores or removes them (``accepted`` with the event, ``delivered`` / ``discarded`` /
  ``expired`` / ``dead_letter`` with the removal of the queue row), so the ledger never disagrees with the queues.

Every statement is parameterised. Every method takes ``conn``, a connection inside a transaction the caller opened
(``with db.unit_of_work() as conn:``, :class:`router.db.Database`), so a caller can commit several changes together;
an event and its queue rows are written by one statement, so an event acknowledged to its supplier is on disk for
every consumer it was routed to. The pool and the translation of psycopg's errors into :class:`StoreError` /
:class:`StoreUnavailable` live in :mod:`router.db` (re-exported here).
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import psycopg
from psycopg.types.json import Jsonb

from router.cluster.members import CHANNEL_FENCE_CTE
from router.cluster.ownership import disown
from router.db.database import FenceToken
from router.db.errors import StoreError, StoreUnavailable, WriteFenced
from router.db.lane import exec_prepared
from router.routing.ledger import (
    CHANNEL_DEDUPE_SQL,
    CONSUMER,
    Direction,
    LedgerRow,
    LedgerWriter,
    Outcome,
    Route,
    T2Rows,
    channel_dedupe_id,
    inbound_dedupe_id,
    timestamp,
    volatile_dedupe_id,
)

__all__ = ["AdminRow", "ChannelRow", "Conn", "NewEvent", "ProxyRow", "QueuedRow", "Store", "StoreError",
           "StoreUnavailable"]

@dataclass(frozen=True)
class ChannelRow:
    id: int
    qos: dict[str, Any]
    admin_props: dict[str, Any]
    next_admin_c: int
    next_admin_s: int


@dataclass(frozen=True)
class AdminRow:
    channel_id: int
    side: str
    id: int
    es_style: bool
    operator: int
    qos: dict[str, Any]
    next_proxy: int
    filters: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class ProxyRow:
    channel_id: int
    side: str
    admin_id: int
    id: int
    kind: str
    es_style: bool
    qos: dict[str, Any]
    client_ior: str | None
    connected: bool
    suspended: bool
    filters: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class QueuedRow:
    admin_id: int
    proxy_id: int
    event_id: int
    seq: int
    form: int
    body: bytes
    priority: int
    deadline: float | None
    start_at: float | None


@dataclass(frozen=True)
class NewEvent:
    seq: int
    form: int
    body: bytes
    priority: int
    deadline: float | None
    start_at: float | None
    targets: Sequence[tuple[int, int]]   # (consumer admin id, proxy supplier id)
    accepted_at: float | None = None     # unix seconds the channel accepted it (stored as received_at); None: now
    source: tuple[int, int] | None = None  # (supplier admin id, proxy consumer id) it came from, for the ledger
    jms_message_id: str | None = None    # the JMS message it was mapped from (a JMS → channel bridge's event)


Conn = psycopg.Connection[Any]


class Store:
    """Parameterised access to the channel tables on the caller's connection (see the module docstring).

    The only state it keeps is the list of fully delivered events waiting to be deleted in one batch, and the
    ledger writer (``ledger``: its settings say whether persistent events get ledger rows). Every ledger time it
    writes is the node's (``clock``, unix seconds; injectable for tests), as the times the callers pass are, never
    the database's: with the two clocks apart a row could otherwise be acknowledged before it was accepted."""

    def __init__(self, ledger: LedgerWriter | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._reap_lock = threading.Lock()
        self._reap: list[int] = []
        self.ledger = ledger if ledger is not None else LedgerWriter()

    # -- channels ---------------------------------------------------------------------------------------
    def next_channel_id(self, conn: Conn) -> int:
        """Channel ids are never reused, even after a channel is destroyed."""
        row = conn.execute("SELECT nextval('nsjms_channel_id')").fetchone()
        assert row is not None
        return int(row[0])

    def insert_channel(self, conn: Conn, cid: int, qos: dict[str, Any], admin_props: dict[str, Any],
                       default_admin_qos: dict[str, dict[str, Any]]) -> None:
        """A channel and its two default admins (id 0; QoS by side 'C'/'S')."""
        conn.execute("INSERT INTO nsjms_channel(id, qos, admin_props) VALUES (%s, %s, %s)",
                     (cid, Jsonb(qos), Jsonb(admin_props)))
        for side in ("C", "S"):
            conn.execute("INSERT INTO nsjms_admin(channel_id, side, id, qos) VALUES (%s, %s, 0, %s)",
                         (cid, side, Jsonb(default_admin_qos[side])))

    def update_channel(self, conn: Conn, cid: int, **cols: Any) -> None:
        self._update(conn, "nsjms_channel", {"id": cid}, cols)

    def delete_channel(self, conn: Conn, cid: int) -> None:
        self._drop_queue_rows(conn, "q.channel_id = %s", (cid,), cid, "the channel was destroyed")
        conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s", (cid,))
        conn.execute("DELETE FROM nsjms_channel WHERE id = %s", (cid,))
        disown(conn, "channel", cid)       # a destroyed channel is owned by no node (docs/cluster.md)

    def load_channels(self, conn: Conn) -> list[ChannelRow]:
        rows = conn.execute("SELECT id, qos, admin_props, next_admin_c, next_admin_s "
                            "FROM nsjms_channel ORDER BY id").fetchall()
        return [ChannelRow(*r) for r in rows]

    # -- admins -----------------------------------------------------------------------------------------
    def insert_admin(self, conn: Conn, cid: int, side: str, aid: int, es_style: bool, operator: int,
                     qos: dict[str, Any]) -> None:
        counter = "next_admin_c" if side == "C" else "next_admin_s"
        conn.execute("INSERT INTO nsjms_admin(channel_id, side, id, es_style, operator, qos) "
                     "VALUES (%s, %s, %s, %s, %s, %s)", (cid, side, aid, es_style, operator, Jsonb(qos)))
        conn.execute(f"UPDATE nsjms_channel SET {counter} = GREATEST({counter}, %s) WHERE id = %s",
                     (aid + 1, cid))

    def update_admin(self, conn: Conn, cid: int, side: str, aid: int, **cols: Any) -> None:
        self._update(conn, "nsjms_admin", {"channel_id": cid, "side": side, "id": aid}, cols)

    def delete_admin(self, conn: Conn, cid: int, side: str, aid: int) -> None:
        if side == "C":
            self._drop_queue_rows(conn, "q.channel_id = %s AND q.admin_id = %s", (cid, aid), cid,
                                  "its consumer admin was destroyed")
        conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s AND side = %s AND admin_id = %s",
                     (cid, side, aid))
        conn.execute("DELETE FROM nsjms_admin WHERE channel_id = %s AND side = %s AND id = %s",
                     (cid, side, aid))
        self._delete_orphans(conn, cid)

    def load_admins(self, conn: Conn, cid: int) -> list[AdminRow]:
        rows = conn.execute("SELECT channel_id, side, id, es_style, operator, qos, next_proxy, filters, extra "
                            "FROM nsjms_admin WHERE channel_id = %s ORDER BY side, id", (cid,)).fetchall()
        return [AdminRow(*r) for r in rows]

    # -- proxies ----------------------------------------------------------------------------------------
    def insert_proxy(self, conn: Conn, cid: int, side: str, aid: int, pid: int, kind: str, es_style: bool,
                     qos: dict[str, Any]) -> None:
        conn.execute("INSERT INTO nsjms_proxy(channel_id, side, admin_id, id, kind, es_style, qos) "
                     "VALUES (%s, %s, %s, %s, %s, %s, %s)", (cid, side, aid, pid, kind, es_style, Jsonb(qos)))
        conn.execute("UPDATE nsjms_admin SET next_proxy = GREATEST(next_proxy, %s) "
                     "WHERE channel_id = %s AND side = %s AND id = %s", (pid + 1, cid, side, aid))

    def update_proxy(self, conn: Conn, cid: int, side: str, aid: int, pid: int, **cols: Any) -> None:
        self._update(conn, "nsjms_proxy", {"channel_id": cid, "side": side, "admin_id": aid, "id": pid}, cols)

    def delete_proxy(self, conn: Conn, cid: int, side: str, aid: int, pid: int) -> None:
        if side == "C":
            self._drop_queue_rows(conn, "q.channel_id = %s AND q.admin_id = %s AND q.proxy_id = %s",
                                  (cid, aid, pid), cid, "its proxy supplier was destroyed")
        conn.execute("DELETE FROM nsjms_proxy WHERE channel_id = %s AND side = %s AND admin_id = %s "
                     "AND id = %s", (cid, side, aid, pid))
        self._delete_orphans(conn, cid)

    def load_proxies(self, conn: Conn, cid: int) -> list[ProxyRow]:
        rows = conn.execute("SELECT channel_id, side, admin_id, id, kind, es_style, qos, client_ior, connected, "
                            "suspended, filters, extra FROM nsjms_proxy WHERE channel_id = %s "
                            "ORDER BY side, admin_id, id", (cid,)).fetchall()
        return [ProxyRow(*r) for r in rows]

    # -- events -----------------------------------------------------------------------------------------
    # The arrays go in binary (``%(name)b``): psycopg's text dump of a list scans every element's text for quoting
    # (a regular expression over each 1 KB body's hex), more than half of the statement's client-side cost; the
    # binary one does not. A binary list must not mix int and float: the float columns are passed as floats.
    _EV_ROWS = """
            INSERT INTO nsjms_event(channel_id, seq, form, body, priority, deadline, start_at, received_at)
            SELECT %(cid)s, seq, form, body, prio, deadline, start_at, to_timestamp(acc)
            FROM {fence_from}unnest(%(seq)b::bigint[], %(form)b::smallint[], %(body)b::bytea[], %(prio)b::integer[],
                        %(deadline)b::float8[], %(start)b::float8[], %(acc)b::float8[])
                 AS t(seq, form, body, prio, deadline, start_at, acc)
            RETURNING id, seq, received_at"""
    _T_ROWS = """
            SELECT * FROM unnest(%(qseq)b::bigint[], %(qadmin)b::integer[], %(qproxy)b::integer[],
                                 %(qbridge)b::integer[], %(qdest)b::text[], %(qdir)b::text[])
                          AS t(seq, a, p, bridge, dest, dir)"""
    # One event with one target (a lone supplier's push to a channel with one consumer): the same statement with
    # scalar parameters (issue 27: dumping 14 one-element arrays cost ~146 us of the node's CPU per push). Same
    # tables, same rows, same single statement: only the parameters' shape differs.
    _EV_ONE = """
            INSERT INTO nsjms_event(channel_id, seq, form, body, priority, deadline, start_at, received_at)
            SELECT %(cid)s, %(seq)b::bigint, %(form)b::smallint, %(body)b::bytea, %(prio)b::integer,
                   %(deadline)s::float8, %(start)s::float8, to_timestamp(%(acc)b::float8){fence_one}
            RETURNING id, seq, received_at"""
    _T_ONE = """
            SELECT %(seq)b::bigint AS seq, %(qadmin)b::integer AS a, %(qproxy)b::integer AS p,
                   %(qbridge)s::integer AS bridge, %(qdest)s::text AS dest, %(qdir)s::text AS dir"""
    _INSERT_EVENTS = """
        WITH {fence}ev AS ({ev}
        ), t AS ({t}
        ), q AS (
            INSERT INTO nsjms_queue(channel_id, admin_id, proxy_id, event_id)
            SELECT %(cid)s, t.a, t.p, ev.id FROM t JOIN ev ON ev.seq = t.seq
        ){ledger}
        SELECT id, seq, received_at FROM ev"""
    # The ``accepted`` ledger row of each (event, proxy supplier) obligation, in the same statement.
    _LEDGER_ACCEPTED = f""", l AS (
            INSERT INTO nsjms_ledger(event_id, dedupe_id, channel_id, proxy_id, bridge_id, destination, direction,
                                     gtrid, accepted_at, outcome, node_id)
            SELECT ev.id, {CHANNEL_DEDUPE_SQL.format(event="ev.id", channel="%(cid)s", admin="t.a", proxy="t.p")},
                   %(cid)s, t.p, t.bridge, t.dest, t.dir, %(gtrid)s::text, ev.received_at, 'accepted', %(node)s::text
            FROM t JOIN ev ON ev.seq = t.seq
        )"""
    # The ``accepted`` and ``delivered`` rows of the JMS message of each event a JMS -> channel bridge pushed (the
    # channel now durably holds it), in the same statement (outside a T2): ``j<bridge>/<JMS message id>``, or
    # ``event-<id>`` for a message without an id (router.routing.ledger.inbound_dedupe_id). ``delivered``'s
    # acknowledged_at is the node's time (``iack``), like accepted_at (the event's received_at, the node's time of the
    # push). Its arrays go in binary too (a text dump of the message ids and destinations cost ~8 us per element).
    _LEDGER_INBOUND = """, i AS (
            INSERT INTO nsjms_ledger(event_id, jms_message_id, dedupe_id, channel_id, proxy_id, bridge_id, destination,
                                     direction, accepted_at, acknowledged_at, outcome, node_id)
            SELECT ev.id, s.jms, 'j' || COALESCE(s.bridge, 0) || '/' || COALESCE(NULLIF(s.jms, ''), 'event-' || ev.id),
                   %(cid)s, s.p, s.bridge, s.dest, 'jms_to_channel', ev.received_at,
                   CASE WHEN o.n = 2 THEN to_timestamp(%(iack)s::float8) END, o.outcome, %(node)s::text
            FROM unnest(%(iseq)b::bigint[], %(ijms)b::text[], %(iproxy)b::integer[], %(ibridge)b::integer[],
                        %(idest)b::text[]) AS s(seq, jms, p, bridge, dest)
            JOIN ev ON ev.seq = s.seq CROSS JOIN (VALUES (1, 'accepted'), (2, 'delivered')) AS o(n, outcome)
            ORDER BY ev.id, o.n
        )"""
    def insert_events(self, conn: Conn, cid: int, events: Sequence[NewEvent], *,
                      fence: FenceToken | None = None, prepared: bool = False) -> list[int]:
        """Store events, their queue rows and (when the ledger records persistent traffic) the ``accepted`` ledger
        row of each (event, proxy supplier) obligation in one statement; returns the new ids in order.

        For an event a JMS → channel bridge pushed (``source`` is a proxy the bridge registered), the same statement
        writes ``accepted`` and ``delivered`` for the JMS message's obligation (the channel now durably holds it).
        All carry the event's ``received_at`` as ``accepted_at``. So outside a T2 this is always ONE statement.

        Inside a T2 (``conn`` is its PostgreSQL branch, :func:`router.routing.ledger.t2_branch`) the ``accepted`` rows
        carry its gtrid, and the JMS message's rows are collected for the branch's prepare (gtrid, ``dispatched_at`` =
        now, ``prepared_at``) instead of being written here.

        ``fence``: the node's fencing token, checked IN the statement (the accept path, whose statement may be its own
        transaction: docs/cluster.md): unless node ``fence.node_id`` is live with ``fence.epoch`` and owns channel
        ``cid``, nothing is written and :class:`WriteFenced` is raised. Never inside a T2 branch (a prepared branch
        must hold no lock a takeover waits for; T2 is fenced at its decision).

        ``prepared``: ``conn`` is a statement lane's connection (:mod:`router.db.lane`, autocommit, outside a T2): one
        event with one target goes as its prepared statement with the values encoded here (the same statement and
        rows; issue 27)."""
        if not events:
            return []
        now = self._clock()
        ledgered = self.ledger.records(persistent=True)
        t2 = self.ledger.t2_rows(conn) if ledgered else None
        routes = [(self.ledger.route(cid, "C", a, p) or CONSUMER) if ledgered else CONSUMER
                  for ev in events for a, p in ev.targets]
        inbound = [(ev, route) for ev in events if (route := self._inbound_route(cid, ev)) is not None] \
            if ledgered else []
        if len(events) == 1 and len(routes) == 1 and not inbound:
            return self._insert_one(conn, cid, events[0], routes[0], now, ledgered, t2, fence, prepared)
        params: dict[str, Any] = {
            "cid": cid,
            "seq": [ev.seq for ev in events], "form": [ev.form for ev in events],
            "body": [ev.body for ev in events], "prio": [ev.priority for ev in events],
            "deadline": [_float(ev.deadline) for ev in events], "start": [_float(ev.start_at) for ev in events],
            "acc": [float(ev.accepted_at if ev.accepted_at is not None else now) for ev in events],
            "qseq": [ev.seq for ev in events for _ in ev.targets],
            "qadmin": [a for ev in events for a, _ in ev.targets],
            "qproxy": [p for ev in events for _, p in ev.targets],
            "qbridge": [r.bridge_id for r in routes], "qdest": [r.destination for r in routes],
            "qdir": [str(r.direction) for r in routes], "gtrid": t2.gtrid if t2 is not None else None,
            "node": self.ledger.node_id,
        }
        kind = "plain"
        if ledgered:
            kind = "inbound" if inbound and t2 is None else "ledgered"
        if fence is not None:
            params["fnode"], params["fepoch"] = fence.node_id, fence.epoch
        if inbound and t2 is None:
            params.update({
                "iseq": [ev.seq for ev, _ in inbound], "ijms": [ev.jms_message_id for ev, _ in inbound],
                "iproxy": [ev.source[1] if ev.source else None for ev, _ in inbound],
                "ibridge": [r.bridge_id for _, r in inbound], "idest": [r.destination for _, r in inbound],
                "iack": now})
        rows = conn.execute(_insert_statement(False, kind, fence is not None), params).fetchall()
        if not rows and fence is not None:
            raise _refused(fence, cid)
        by_seq = {int(seq): (int(eid), received) for eid, seq, received in rows}
        if ledgered:
            self.ledger.count(len(routes) + (2 * len(inbound) if t2 is None else 0))
            if t2 is not None:
                t2.rows.extend(replace(r, gtrid=t2.gtrid, dispatched_at=now, acknowledged_at=None)
                               for ev, _ in inbound
                               for r in self._inbound_rows(cid, ev, by_seq[ev.seq][0], by_seq[ev.seq][1]))
        return [by_seq[ev.seq][0] for ev in events]

    def _insert_one(self, conn: Conn, cid: int, ev: NewEvent, route: Route, now: float, ledgered: bool,
                    t2: Any, fence: FenceToken | None = None, prepared: bool = False) -> list[int]:
        """:meth:`insert_events` of one event with one target and no inbound JMS message: scalar parameters."""
        ((aid, pid),) = ev.targets
        params: dict[str, Any] = {
            "cid": cid, "seq": ev.seq, "form": ev.form, "body": ev.body, "prio": ev.priority,
            "deadline": _float(ev.deadline), "start": _float(ev.start_at),
            "acc": float(ev.accepted_at if ev.accepted_at is not None else now),
            "qadmin": aid, "qproxy": pid, "qbridge": route.bridge_id, "qdest": route.destination,
            "qdir": str(route.direction), "gtrid": t2.gtrid if t2 is not None else None,
            "node": self.ledger.node_id,
        }
        if fence is not None:
            params["fnode"], params["fepoch"] = fence.node_id, fence.epoch
        row: Any
        if prepared and t2 is None:
            name, query, names, types, formats = _prepared_one(ledgered, fence is not None)
            encoding = conn.info.encoding
            row = exec_prepared(conn, name, query, types, [_encode(params[n], encoding) for n in names], formats)
        else:
            row = conn.execute(_insert_statement(True, "ledgered" if ledgered else "plain", fence is not None),
                               params).fetchone()
        if row is None:
            if fence is not None:
                raise _refused(fence, cid)
            raise StoreError("the event's INSERT returned no row")     # pragma: no cover — it returns its row
        if ledgered:
            self.ledger.count(1)
        return [int(row[0])]

    def one_statement(self, cid: int, events: Sequence[NewEvent]) -> bool:
        """Whether :meth:`insert_events` writes ``events`` of channel ``cid`` in ONE statement, so that its unit of
        work may run on an autocommit connection: always, outside a T2 (a T2's inbound rows go to its prepare)."""
        return True

    def _inbound_route(self, cid: int, ev: NewEvent) -> Any:
        inbound = self.ledger.route(cid, "S", *ev.source) if ev.source is not None else None
        if inbound is None or inbound.direction is not Direction.JMS_TO_CHANNEL:
            return None
        return inbound

    def best_effort_accepted(self, conn: Conn, cid: int, events: Sequence[NewEvent]) -> None:
        """``ledger.best_effort``: the ledger rows of BestEffort events (not stored; one statement). Their dedupe ids
        are :func:`router.routing.ledger.volatile_dedupe_id` (the node's run and the event's seq); ``accepted_at`` is
        ``NewEvent.accepted_at``, which the caller keeps for the terminal rows (:meth:`delete_deliveries`)."""
        ledger, out = self.ledger, []
        for ev in events:
            accepted_at = ev.accepted_at if ev.accepted_at is not None else self._clock()
            for aid, pid in ev.targets:
                route = ledger.route(cid, "C", aid, pid) or CONSUMER
                out.append(LedgerRow(volatile_dedupe_id(ledger.run_id, ev.seq, cid, aid, pid), cid, route.direction,
                                     accepted_at, Outcome.ACCEPTED, proxy_id=pid, bridge_id=route.bridge_id,
                                     destination=route.destination))
            out += self._inbound_rows(cid, ev, None, accepted_at)
        ledger.write(conn, out)

    def _inbound_rows(self, cid: int, ev: NewEvent, eid: int | None, accepted_at: Any) -> list[LedgerRow]:
        inbound = self._inbound_route(cid, ev)
        if inbound is None:
            return []
        fallback = f"event-{eid}" if eid is not None else f"{self.ledger.run_id}-s{ev.seq}"
        row = LedgerRow(inbound_dedupe_id(inbound.bridge_id or 0, ev.jms_message_id or fallback), cid,
                        Direction.JMS_TO_CHANNEL, accepted_at, Outcome.ACCEPTED, event_id=eid,
                        jms_message_id=ev.jms_message_id, proxy_id=ev.source[1] if ev.source else None,
                        bridge_id=inbound.bridge_id, destination=inbound.destination)
        return [row, replace(row, outcome=Outcome.DELIVERED, acknowledged_at=self._clock())]

    def delete_deliveries(self, conn: Conn, cid: int, aid: int, pid: int, event_ids: Iterable[int], *,
                          outcome: Outcome = Outcome.DELIVERED, reason: str | None = None,
                          dispatched_at: float | None = None, gtrid: str | None = None, ledger: bool = True,
                          best_effort: Sequence[tuple[int, float]] = (),
                          acknowledged_at: Mapping[int, float] | None = None,
                          best_effort_acknowledged_at: Mapping[int, float] | None = None,
                          returning: bool = False) -> set[int] | None:
        """The proxy no longer has to deliver these events (one statement), because of ``outcome``
        (``delivered``; ``discarded``, ``expired`` or ``dead_letter`` with a ``reason``). When the ledger records
        persistent traffic, the same statement writes one ``outcome`` row per queue row actually deleted (a row
        already gone, e.g. by a retried unit of work that had committed, writes nothing). ``best_effort``: (seq,
        accepted_at) of BestEffort events leaving the proxy's queue, whose ledger rows a second statement writes.
        For a T2 branch: ``gtrid`` fills the rows' ``gtrid``; ``ledger=False`` writes no ledger row (the caller
        writes its own, e.g. with :meth:`router.routing.ledger.LedgerWriter.t2`). ``acknowledged_at`` (event id → unix
        time) and ``best_effort_acknowledged_at`` (seq → unix time): when each ``delivered`` event was delivered
        (the consumer's call returned), for the rows' ``acknowledged_at``; an event not in them gets now.

        ``returning``: return the ids of the queue rows this statement deleted (a row already gone is not among
        them); otherwise None."""
        ids = list(event_ids)
        reason = _reason(outcome, reason)
        if best_effort and self.ledger.records(persistent=False):
            self._best_effort_finished(conn, cid, aid, pid, best_effort, outcome, reason, dispatched_at,
                                       best_effort_acknowledged_at or {})
        if not ids:
            return set() if returning else None
        if not ledger or not self.ledger.records(persistent=True):
            cur = conn.execute("DELETE FROM nsjms_queue WHERE channel_id = %s AND admin_id = %s AND proxy_id = %s "
                               "AND event_id = ANY(%s)" + (" RETURNING event_id" if returning else ""),
                               (cid, aid, pid, ids))
            return {int(r[0]) for r in cur.fetchall()} if returning else None
        route = self.ledger.route(cid, "C", aid, pid) or CONSUMER
        t2 = self.ledger.t2_rows(conn)
        if t2 is not None:
            gone = self._t2_delete(conn, t2, cid, aid, pid, ids, route, outcome, reason, dispatched_at)
            return gone if returning else None
        acks = None
        if outcome is Outcome.DELIVERED:
            now, given = self._clock(), acknowledged_at or {}
            acks = [given.get(i, now) for i in ids]
        cur = conn.execute(self._DELETE_LEDGERED + (" RETURNING event_id" if returning else ""), {
            "cid": cid, "aid": aid, "pid": pid, "ids": ids, "bridge": route.bridge_id, "dest": route.destination,
            "dir": str(route.direction), "disp": timestamp(dispatched_at), "acks": acks, "outcome": str(outcome),
            "reason": reason, "gtrid": gtrid, "node": self.ledger.node_id})
        self.ledger.count(max(cur.rowcount, 0))
        return {int(r[0]) for r in cur.fetchall()} if returning else None

    def _t2_delete(self, conn: Conn, t2: T2Rows, cid: int, aid: int, pid: int, ids: list[int], route: Route,
                   outcome: Outcome, reason: str | None, dispatched_at: float | None) -> set[int]:
        """Inside a T2: the queue rows leave now; the row of each one actually deleted is collected for the
        branch's prepare (gtrid, ``dispatched_at`` = now unless given, the message's dedupe id as
        ``jms_message_id``), without ``acknowledged_at`` (the broker commit follows the decision). Returns the
        ids of the rows deleted."""
        gone = conn.execute(
            "DELETE FROM nsjms_queue q USING nsjms_event e WHERE q.channel_id = %s AND q.admin_id = %s "
            "AND q.proxy_id = %s AND q.event_id = ANY(%s) AND e.id = q.event_id "
            "RETURNING q.event_id, e.received_at", (cid, aid, pid, ids)).fetchall()
        when = dispatched_at if dispatched_at is not None else self._clock()
        order = {eid: i for i, eid in enumerate(ids)}
        t2.rows.extend(
            LedgerRow(channel_dedupe_id(eid, cid, aid, pid), cid, route.direction, accepted_at, outcome,
                      event_id=eid, jms_message_id=t2.messages.get(eid), proxy_id=pid, bridge_id=route.bridge_id,
                      destination=route.destination, gtrid=t2.gtrid, dispatched_at=when, failure_reason=reason)
            for eid, accepted_at in sorted(gone, key=lambda g: order.get(g[0], 0)))
        return {int(g[0]) for g in gone}

    # One statement: the queue rows leave, and each one actually deleted gets its ledger row.
    _DELETE_LEDGERED = f"""
        WITH gone AS (
            DELETE FROM nsjms_queue q USING nsjms_event e
            WHERE q.channel_id = %(cid)s AND q.admin_id = %(aid)s AND q.proxy_id = %(pid)s
              AND q.event_id = ANY(%(ids)s) AND e.id = q.event_id
            RETURNING q.event_id, e.received_at
        )
        INSERT INTO nsjms_ledger(event_id, dedupe_id, channel_id, proxy_id, bridge_id, destination, direction,
                                 gtrid, accepted_at, dispatched_at, acknowledged_at, outcome, failure_reason, node_id)
        SELECT g.event_id, {CHANNEL_DEDUPE_SQL.format(event="g.event_id", channel="%(cid)s", admin="%(aid)s",
                                                      proxy="%(pid)s")},
               %(cid)s, %(pid)s, %(bridge)s, %(dest)s, %(dir)s, %(gtrid)s, g.received_at, %(disp)s::timestamptz,
               to_timestamp((%(acks)s::float8[])[array_position(%(ids)s::bigint[], g.event_id)]), %(outcome)s,
               %(reason)s, %(node)s::text
        FROM gone g"""

    def _best_effort_finished(self, conn: Conn, cid: int, aid: int, pid: int, events: Sequence[tuple[int, float]],
                              outcome: Outcome, reason: str | None, dispatched_at: float | None,
                              acknowledged_at: Mapping[int, float]) -> None:
        route = self.ledger.route(cid, "C", aid, pid) or CONSUMER
        now = self._clock() if outcome is Outcome.DELIVERED else None
        self.ledger.write(conn, [
            LedgerRow(volatile_dedupe_id(self.ledger.run_id, seq, cid, aid, pid), cid, route.direction, accepted_at,
                      outcome, proxy_id=pid, bridge_id=route.bridge_id, destination=route.destination,
                      dispatched_at=dispatched_at, acknowledged_at=acknowledged_at.get(seq, now) if now else None,
                      failure_reason=reason) for seq, accepted_at in events])

    def _drop_queue_rows(self, conn: Conn, where: str, params: tuple[Any, ...], cid: int, reason: str | None, *,
                         outcome: Outcome = Outcome.DISCARDED, dispatched_at: float | None = None) -> None:
        """Delete the queue rows ``where`` selects (alias ``q``) and write their ledger rows."""
        reason = _reason(outcome, reason)
        if not self.ledger.records(persistent=True):
            conn.execute(f"DELETE FROM nsjms_queue q WHERE {where}", params)
            return
        gone = conn.execute(f"DELETE FROM nsjms_queue q USING nsjms_event e WHERE {where} AND e.id = q.event_id "
                            "RETURNING q.admin_id, q.proxy_id, q.event_id, e.received_at", params).fetchall()
        done = self._clock() if outcome is Outcome.DELIVERED else None
        rows = []
        for a, p, eid, accepted_at in gone:
            route = self.ledger.route(cid, "C", a, p) or CONSUMER
            rows.append(LedgerRow(channel_dedupe_id(eid, cid, a, p), cid, route.direction, accepted_at, outcome,
                                  event_id=eid, proxy_id=p, bridge_id=route.bridge_id, destination=route.destination,
                                  dispatched_at=dispatched_at, acknowledged_at=done,
                                  failure_reason=reason))
        self.ledger.write(conn, rows)

    def delete_events(self, conn: Conn, event_ids: Iterable[int]) -> None:
        """Events no queue holds any more (the caller's reference count reached zero); one statement."""
        ids = list(event_ids)
        if ids:
            conn.execute("DELETE FROM nsjms_event WHERE id = ANY(%s)", (ids,))

    def reap_later(self, event_id: int) -> None:
        """Queue a fully delivered event for deletion in a batch (see :meth:`take_reap`).

        Its queue rows are already gone, so until then it is only an orphan row, which startup also removes."""
        with self._reap_lock:
            self._reap.append(event_id)

    def take_reap(self) -> list[int]:
        """The events queued by :meth:`reap_later` since the last call, for one :meth:`delete_events`; a caller
        whose unit of work failed gives them back with :meth:`reap_again`."""
        with self._reap_lock:
            ids, self._reap = self._reap, []
        return ids

    def reap_again(self, event_ids: Iterable[int]) -> None:
        with self._reap_lock:
            self._reap.extend(event_ids)

    def load_queued(self, conn: Conn, cid: int) -> list[QueuedRow]:
        self._delete_orphans(conn, cid)
        rows = conn.execute(
            "SELECT q.admin_id, q.proxy_id, e.id, e.seq, e.form, e.body, e.priority, e.deadline, e.start_at "
            "FROM nsjms_queue q JOIN nsjms_event e ON e.id = q.event_id WHERE q.channel_id = %s "
            "ORDER BY e.seq", (cid,)).fetchall()
        return [QueuedRow(*r) for r in rows]

    def max_seq(self, conn: Conn) -> int:
        row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM nsjms_event").fetchone()
        return int(row[0]) if row else 0

    def stats(self, conn: Conn) -> dict[str, int]:
        row = conn.execute("SELECT (SELECT count(*) FROM nsjms_channel), (SELECT count(*) FROM nsjms_proxy), "
                           "(SELECT count(*) FROM nsjms_event), (SELECT count(*) FROM nsjms_queue), "
                           "(SELECT count(*) FROM nsjms_dead_letter)").fetchone()
        assert row is not None
        return dict(zip(("channels", "proxies", "events", "queued", "dead_letters"), map(int, row), strict=True))

    # -- helpers ----------------------------------------------------------------------------------------
    @staticmethod
    def _delete_orphans(conn: Conn, cid: int) -> None:
        conn.execute("DELETE FROM nsjms_event e WHERE e.channel_id = %s AND NOT EXISTS "
                     "(SELECT 1 FROM nsjms_queue q WHERE q.event_id = e.id)", (cid,))

    _COLUMNS: ClassVar[frozenset[str]] = frozenset({
        "qos", "admin_props", "operator", "filters", "extra", "client_ior", "connected", "suspended",
        "next_proxy"})

    def _update(self, conn: Conn, table: str, key: dict[str, Any], cols: dict[str, Any]) -> None:
        if not cols:
            return
        bad = set(cols) - self._COLUMNS
        if bad:
            raise ValueError(f"unknown column(s) {sorted(bad)}")
        sets = ", ".join(f"{c} = %s" for c in cols)
        where = " AND ".join(f"{k} = %s" for k in key)
        values = [Jsonb(v) if isinstance(v, dict) else v for v in cols.values()]
        conn.execute(f"UPDATE {table} SET {sets} WHERE {where}", (*values, *key.values()))


@functools.cache
def _insert_statement(one: bool, kind: str, fenced: bool) -> str:
    """:meth:`Store.insert_events`'s statement: scalar (``one``) or array parameters; ledger CTEs by ``kind``
    (``plain``, ``ledgered``, ``inbound``: ledgered with the JMS message's rows); ``fenced``: with the node's fence
    (:data:`router.cluster.members.CHANNEL_FENCE_CTE`), the event rows selected ``FROM fence``, so a refused check
    writes nothing (no event, hence no queue or ledger row) and returns no row. Built once per shape (a constant
    text per shape, so psycopg prepares each on a connection that runs it often)."""
    ledger = {"plain": "", "ledgered": Store._LEDGER_ACCEPTED,
              "inbound": Store._LEDGER_ACCEPTED + Store._LEDGER_INBOUND}[kind]
    ev = (Store._EV_ONE if one else Store._EV_ROWS).format(
        fence_from="fence, " if fenced else "", fence_one="\n            FROM fence" if fenced else "")
    return Store._INSERT_EVENTS.format(ev=ev, t=Store._T_ONE if one else Store._T_ROWS, ledger=ledger,
                                       fence=f"{CHANNEL_FENCE_CTE}, " if fenced else "")


#: The one-event statement's parameters for its prepared form (:func:`_prepared_one`): their PostgreSQL types (OIDs).
_ONE_TYPES = {"cid": 23, "seq": 20, "form": 21, "body": 17, "prio": 23, "deadline": 701, "start": 701, "acc": 701,
              "qadmin": 23, "qproxy": 23, "qbridge": 23, "qdest": 25, "qdir": 25, "gtrid": 25, "node": 25,
              "fnode": 25, "fepoch": 20}


@functools.cache
def _prepared_one(ledgered: bool, fenced: bool) -> tuple[bytes, bytes, tuple[str, ...], tuple[int, ...],
                                                         tuple[int, ...]]:
    """The one-event statement of :func:`_insert_statement` for :func:`router.db.lane.exec_prepared`: its name, its
    text with ``$n`` parameters (a name used twice is one parameter, as psycopg makes it), the parameter names in
    order, their types and formats (the body binary, the rest text)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)[sb]", number, _insert_statement(True, "ledgered" if ledgered else "plain", fenced))
    assert "%" not in text, "a placeholder left in the prepared statement"
    return (f"nsjms_accept_one_{int(ledgered)}{int(fenced)}".encode(), text.encode(), tuple(names),
            tuple(_ONE_TYPES[n] for n in names), tuple(1 if n == "body" else 0 for n in names))


def _encode(value: Any, encoding: str) -> bytes | None:
    """A parameter of :func:`_prepared_one` as PostgreSQL's text input (the body as binary bytea); None is NULL. Floats
    as ``repr`` (the shortest text that reads back as the same float8)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode(encoding)
    return repr(value).encode() if isinstance(value, float) else str(int(value)).encode()


def _refused(fence: FenceToken, cid: int) -> WriteFenced:
    return WriteFenced(f"write refused: node {fence.node_id!r} epoch {fence.epoch} is fenced or does not own channel "
                       f"{cid} any more; nothing was stored (retry: the channel's owner takes it)")


def _reason(outcome: Outcome, reason: str | None) -> str | None:
    """The failure reason the ledger's CHECK constraint wants: none for a delivery, always one otherwise (a caller
    that gave none gets the outcome's name rather than a constraint violation that would fail its retries)."""
    if not outcome.needs_reason:
        return None
    return reason or str(outcome)


def _float(value: float | None) -> float | None:
    """A float column's value for a binary array (which must not mix int and float); None stays NULL."""
    return None if value is None else float(value)


def dumps(obj: Any) -> str:
    """JSON for logs and status output."""
    return json.dumps(obj, sort_keys=True, default=str)
