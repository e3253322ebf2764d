"""The delivery ledger: the router's writes, in the caller's database transaction (docs/audit.md).

Table ``nsjms_ledger`` (migration ``router/db/migrations/0003_ledger.sql``), append-only, partitioned by UTC day on
``accepted_at``. One *obligation* (one event for one consumer proxy, or one JMS message for one bridge) is named
by its ``dedupe_id``; all its rows carry the same ``dedupe_id`` and ``accepted_at``: one ``accepted`` row, then a
row per later step (``in_doubt``, ``rolled_back``) and one terminal row (``delivered``, ``dead_letter``,
``discarded``, ``expired``).

Every write takes ``conn``, a connection inside the caller's transaction, and plain data, and is ONE statement
(``INSERT … SELECT … FROM unnest(arrays)``) however many rows: the rows commit or roll back with whatever the
caller moved in that transaction, and a failing ledger insert fails the caller's unit of work (there is no second
write path that could disagree). psycopg's errors propagate to the caller's boundary (:mod:`router.db`).

Partition maintenance (:func:`ensure_partitions`, :func:`drop_expired_partitions`, :func:`maintain`) is DDL: run it
in its own short transaction, never inside a routing transaction. Nothing here runs at import.
"""

from __future__ import annotations

import re
import secrets
import threading
import time as _time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from importlib import resources
from typing import Any

import psycopg
from psycopg import Xid, sql

from xa.observer import Guarded, Observer, Phase
from xa.pg import translate
from xa.records import LiveTxn
from xa.states import State
from xa.xid import dedupe_id as message_dedupe_id

__all__ = [
    "CHANNEL_DEDUPE_SQL",
    "COLUMNS",
    "DEFAULT_PARTITION",
    "HOP_COLUMNS",
    "MAINTENANCE_LOCK",
    "MIGRATION",
    "TABLE",
    "Direction",
    "LedgerRow",
    "LedgerSettings",
    "LedgerWriter",
    "Outcome",
    "Route",
    "T2HopRecorder",
    "T2Hops",
    "T2Item",
    "T2LedgerBranch",
    "T2Rows",
    "channel_dedupe_id",
    "day_bounds",
    "drop_expired_partitions",
    "ensure_partitions",
    "inbound_dedupe_id",
    "list_partitions",
    "maintain",
    "partition_name",
    "schema_sql",
    "t2_branch",
    "t2_dead_letter",
    "timestamp",
    "volatile_dedupe_id",
]

TABLE = "nsjms_ledger"
DEFAULT_PARTITION = "nsjms_ledger_default"
MIGRATION = "0003_ledger.sql"
_PARTITION_RE = re.compile(r"^nsjms_ledger_p(\d{8})$")

#: The hop timestamps, in the order a delivery passes them.
HOP_COLUMNS: tuple[str, ...] = (
    "accepted_at", "dispatched_at", "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at",
)
#: Every column, in table order (``entry_id`` and ``recorded_at`` are filled by PostgreSQL on insert; ``node_id``,
#: added by migration 0009, is the writer's :attr:`LedgerWriter.node_id`, NULL on older rows).
COLUMNS: tuple[str, ...] = (
    "entry_id", "event_id", "jms_message_id", "dedupe_id", "channel_id", "proxy_id", "bridge_id", "destination",
    "direction", "gtrid", *HOP_COLUMNS, "outcome", "failure_reason", "recorded_at", "node_id",
)


class Outcome(StrEnum):
    """What a ledger row records (``outcome`` column)."""

    ACCEPTED = "accepted"        # nsjms took responsibility for the item
    IN_DOUBT = "in_doubt"        # T2 prepared, decision not yet known
    ROLLED_BACK = "rolled_back"  # T2 rolled back; the item stays queued and is retried
    DELIVERED = "delivered"      # terminal: handed over and acknowledged
    DEAD_LETTER = "dead_letter"  # terminal: dead-lettered, failure_reason says why
    DISCARDED = "discarded"      # terminal: discarded by a QoS policy, failure_reason says which
    EXPIRED = "expired"          # terminal: its deadline passed, failure_reason says which

    @property
    def terminal(self) -> bool:
        return self in (Outcome.DELIVERED, Outcome.DEAD_LETTER, Outcome.DISCARDED, Outcome.EXPIRED)

    @property
    def needs_reason(self) -> bool:
        """The schema requires ``failure_reason`` exactly for these outcomes (a CHECK constraint)."""
        return self in (Outcome.ROLLED_BACK, Outcome.DEAD_LETTER, Outcome.DISCARDED, Outcome.EXPIRED)


class Direction(StrEnum):
    CHANNEL_TO_JMS = "channel_to_jms"            # an event for a bridge's proxy supplier, towards JMS
    JMS_TO_CHANNEL = "jms_to_channel"            # a JMS message a bridge hands to the channel
    CHANNEL_TO_CONSUMER = "channel_to_consumer"  # an event for a CORBA consumer of the channel (no JMS)


Time = float | datetime   # unix seconds (time.time()) or an aware datetime


def timestamp(t: Time | None) -> datetime | None:
    """``t`` as an aware UTC datetime (unix seconds are read as UTC)."""
    if t is None or isinstance(t, datetime):
        return t
    return datetime.fromtimestamp(t, UTC)


@dataclass(frozen=True)
class LedgerSettings:
    """The ``ledger:`` section of the node's configuration (router/node/config/, docs/configuration.md)."""

    enabled: bool = True              # rows for persistent and transactional traffic
    best_effort: bool = False         # rows for BestEffort events too (their own short transaction)
    retention_days: int = 30          # whole UTC days kept before today
    ahead_days: int = 3               # day partitions created ahead of today
    maintenance_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.retention_days < 1:
            raise ValueError(f"ledger.retention_days must be >= 1, got {self.retention_days}")
        if not 0 <= self.ahead_days <= 366:
            raise ValueError(f"ledger.ahead_days must be in 0..366, got {self.ahead_days}")
        if self.maintenance_interval_s <= 0:
            raise ValueError(f"ledger.maintenance_interval_s must be > 0, got {self.maintenance_interval_s}")

    def records(self, persistent: bool) -> bool:
        """Whether traffic of this kind gets ledger rows."""
        return self.enabled and (persistent or self.best_effort)


@dataclass(frozen=True)
class Route:
    """Where the obligations of one channel proxy flow: a bridge's proxy says which bridge and destination."""

    direction: Direction
    bridge_id: int | None = None
    destination: str | None = None    # ``queue/NAME`` or ``topic/NAME``


CONSUMER = Route(Direction.CHANNEL_TO_CONSUMER)


@dataclass(frozen=True)
class LedgerRow:
    """One ledger row (every column but ``entry_id`` and ``recorded_at``). Times: unix seconds or aware datetimes."""

    dedupe_id: str
    channel_id: int
    direction: Direction
    accepted_at: Time
    outcome: Outcome
    event_id: int | None = None
    jms_message_id: str | None = None
    proxy_id: int | None = None
    bridge_id: int | None = None
    destination: str | None = None
    gtrid: str | None = None
    dispatched_at: Time | None = None
    prepared_at: Time | None = None
    decided_at: Time | None = None
    broker_committed_at: Time | None = None
    acknowledged_at: Time | None = None
    failure_reason: str | None = None


@dataclass(frozen=True)
class T2Item:
    """One obligation moved by a T2 transaction (see :meth:`LedgerWriter.t2`)."""

    dedupe_id: str
    channel_id: int
    direction: Direction
    accepted_at: Time
    event_id: int | None = None
    jms_message_id: str | None = None
    proxy_id: int | None = None
    bridge_id: int | None = None
    destination: str | None = None
    dispatched_at: Time | None = None


@dataclass
class T2Rows:
    """The ledger rows of one T2's PostgreSQL branch, collected while the branch's statements run (the store's
    calls add them instead of writing them) and written by :class:`T2LedgerBranch` in one statement, the branch's
    last before ``PREPARE TRANSACTION``. ``messages``: event id -> the ``nsjms_dedupe_id`` of the JMS message the
    T2 sends for it (channel → JMS). ``dead_letters``: ``nsjms_dedupe_id`` -> reason of the messages the bridge
    dead-lettered instead of sending them to their destination (:func:`t2_dead_letter`)."""

    gtrid: str
    messages: dict[int, str] = field(default_factory=dict)
    rows: list[LedgerRow] = field(default_factory=list)
    dead_letters: dict[str, str] = field(default_factory=dict)


#: The T2 branches collecting rows, by connection (every writer's): :func:`t2_dead_letter` finds them from the
#: connection alone (the bridge has the branch's connection, not the node's writer).
_BRANCHES: dict[int, tuple[Any, T2Rows]] = {}
_BRANCHES_LOCK = threading.Lock()


def t2_dead_letter(conn: Any, message_id: str, reason: str) -> bool:
    """The bridge dead-lettered the message ``message_id`` (its ``nsjms_dedupe_id``) of the T2 whose PostgreSQL
    branch runs on ``conn`` (an event its mapping cannot express, in a batch): that event's terminal row is written
    ``dead_letter`` with ``reason`` instead of ``delivered`` (:class:`T2LedgerBranch`). False when ``conn`` is no T2
    branch collecting ledger rows (ledger disabled, or not in a T2): nothing to record."""
    with _BRANCHES_LOCK:
        got = _BRANCHES.get(id(conn))
    if got is None or got[0] is not conn:
        return False
    got[1].dead_letters[message_id] = reason
    return True


def channel_dedupe_id(event_id: int, channel_id: int, admin_id: int, proxy_id: int) -> str:
    """The obligation of a stored event for one proxy supplier: ``e<event>/c<channel>/a<admin>/p<proxy>``."""
    return f"e{event_id}/c{channel_id}/a{admin_id}/p{proxy_id}"


#: :func:`channel_dedupe_id` as a SQL expression (``str.format`` with ``event``, ``channel``, ``admin``, ``proxy``
#: SQL operands), for statements that write the rows of the queue rows they insert or delete.
CHANNEL_DEDUPE_SQL = "('e' || {event} || '/c' || {channel} || '/a' || {admin} || '/p' || {proxy})"


def volatile_dedupe_id(run_id: str, seq: int, channel_id: int, admin_id: int, proxy_id: int) -> str:
    """The obligation of a BestEffort event (never stored) for one proxy supplier, with ``ledger.best_effort``:
    ``b<run>/s<seq>/c<channel>/a<admin>/p<proxy>`` (``run``: :attr:`LedgerWriter.run_id`, new at every start)."""
    return f"b{run_id}/s{seq}/c{channel_id}/a{admin_id}/p{proxy_id}"


def inbound_dedupe_id(bridge_id: int, jms_message_id: str) -> str:
    """The obligation of a JMS message for a JMS → channel bridge: ``j<bridge>/<JMS message id>``."""
    return f"j{bridge_id}/{jms_message_id}"


_INSERT = sql.SQL("""
    INSERT INTO nsjms_ledger (event_id, jms_message_id, dedupe_id, channel_id, proxy_id, bridge_id, destination,
                              direction, gtrid, accepted_at, dispatched_at, prepared_at, decided_at,
                              broker_committed_at, acknowledged_at, outcome, failure_reason, node_id)
    SELECT u.*, n.node FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::integer[], %s::integer[], %s::integer[],
                                   %s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[],
                                   %s::timestamptz[], %s::timestamptz[], %s::timestamptz[], %s::timestamptz[],
                                   %s::text[], %s::text[]) AS u CROSS JOIN (SELECT %s::text) AS n(node)""")

_FIELDS = ("event_id", "jms_message_id", "dedupe_id", "channel_id", "proxy_id", "bridge_id", "destination",
           "direction", "gtrid", "accepted_at", "dispatched_at", "prepared_at", "decided_at", "broker_committed_at",
           "acknowledged_at", "outcome", "failure_reason")
_TIMES = frozenset(HOP_COLUMNS)


class LedgerWriter:
    """Writes ledger rows on the caller's connection, and knows which channel proxies belong to bridges.

    Thread-safe; holds no connection. ``settings.enabled`` False makes every write a no-op (the callers need not
    check). ``node_id``: the node this process runs as (``node.node_id``); every row it writes carries it (column
    ``node_id``, migration 0009), None writes NULL (unknown, as on rows written before that migration).
    Route registry: a bridge registers the channel proxy it uses (:meth:`set_route`) so the channel's rows for that
    proxy carry the bridge, its destination and the direction; any other proxy is a CORBA consumer.
    """

    def __init__(self, settings: LedgerSettings | None = None, node_id: str | None = None) -> None:
        self.settings = settings or LedgerSettings()
        self.node_id = node_id
        self._routes: dict[tuple[int, str, int, int], Route] = {}
        self._lock = threading.Lock()
        self.rows_written = 0
        self.run_id = secrets.token_hex(6)   # names this run's BestEffort obligations (their seqs restart)
        self._t2: dict[int, tuple[Any, T2Rows]] = {}     # id(conn) -> (conn, rows) of a T2 branch in progress

    # -- T2 branches ----------------------------------------------------------------------------------------
    def t2_rows(self, conn: Any) -> T2Rows | None:
        """The rows being collected for the T2 whose PostgreSQL branch runs on ``conn``, or None (not in a T2)."""
        with self._lock:
            got = self._t2.get(id(conn))
        return got[1] if got is not None and got[0] is conn else None

    def _attach(self, conn: Any, rows: T2Rows) -> None:
        with self._lock:
            self._t2[id(conn)] = (conn, rows)
        with _BRANCHES_LOCK:
            _BRANCHES[id(conn)] = (conn, rows)

    def _detach(self, conn: Any) -> T2Rows | None:
        with _BRANCHES_LOCK:
            mine = _BRANCHES.get(id(conn))
            if mine is not None and mine[0] is conn:
                del _BRANCHES[id(conn)]
        with self._lock:
            got = self._t2.get(id(conn))
            if got is None or got[0] is not conn:
                return None
            del self._t2[id(conn)]
        return got[1]

    # -- routes -------------------------------------------------------------------------------------------
    def set_route(self, channel_id: int, side: str, admin_id: int, proxy_id: int, route: Route) -> None:
        """``side``: ``"C"`` for a proxy supplier (channel → consumer), ``"S"`` for a proxy consumer."""
        with self._lock:
            self._routes[(channel_id, side, admin_id, proxy_id)] = route

    def forget_route(self, channel_id: int, side: str, admin_id: int, proxy_id: int) -> None:
        with self._lock:
            self._routes.pop((channel_id, side, admin_id, proxy_id), None)

    def route(self, channel_id: int, side: str, admin_id: int, proxy_id: int) -> Route | None:
        """The registered route, or None (for a proxy supplier: a plain CORBA consumer, :data:`CONSUMER`)."""
        return self._routes.get((channel_id, side, admin_id, proxy_id))

    def records(self, persistent: bool) -> bool:
        return self.settings.records(persistent)

    # -- writes -------------------------------------------------------------------------------------------
    def write(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow]) -> int:
        """Insert ``rows`` in one statement; returns how many. Raises ValueError (nothing written) for a row whose
        ``failure_reason`` does not match its outcome; psycopg's errors propagate (the caller's transaction fails)."""
        if not rows or not self.settings.enabled:
            return 0
        for r in rows:
            if Outcome(r.outcome).needs_reason != (r.failure_reason is not None):
                raise ValueError(f"ledger row {r.dedupe_id!r}: outcome {r.outcome} "
                                 f"{'needs' if Outcome(r.outcome).needs_reason else 'takes no'} failure_reason")
        columns = [[timestamp(getattr(r, f)) if f in _TIMES else _plain(getattr(r, f)) for r in rows]
                   for f in _FIELDS]
        conn.execute(_INSERT, [*columns, self.node_id])
        self.count(len(rows))
        return len(rows)

    def count(self, n: int) -> None:
        """Count ``n`` rows a caller wrote in its own statement (``rows_written``; its transaction may roll back)."""
        with self._lock:
            self.rows_written += n

    def accepted(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow]) -> int:
        """nsjms took responsibility: ``rows`` with their outcome set to ``accepted``."""
        return self.write(conn, [_with(r, Outcome.ACCEPTED, None) for r in rows])

    def delivered(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow]) -> int:
        return self.write(conn, [_with(r, Outcome.DELIVERED, None) for r in rows])

    def dead_lettered(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow], reason: str) -> int:
        return self.write(conn, [_with(r, Outcome.DEAD_LETTER, reason) for r in rows])

    def discarded(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow], reason: str) -> int:
        return self.write(conn, [_with(r, Outcome.DISCARDED, reason) for r in rows])

    def expired(self, conn: psycopg.Connection[Any], rows: Sequence[LedgerRow], reason: str) -> int:
        return self.write(conn, [_with(r, Outcome.EXPIRED, reason) for r in rows])

    def t2(self, conn: psycopg.Connection[Any], *, gtrid: str, outcome: Outcome, items: Sequence[T2Item],
           prepared_at: Time | None = None, decided_at: Time | None = None,
           broker_committed_at: Time | None = None, acknowledged_at: Time | None = None,
           reason: str | None = None) -> int:
        """One step of a T2 transaction for all its ``items`` in one statement: ``in_doubt`` (in the prepared
        PostgreSQL branch), ``delivered`` / ``dead_letter`` (committed), ``rolled_back`` (``reason`` required for
        rolled_back, dead_letter, discarded, expired). The hop times are the transaction's, common to its items."""
        rows = [LedgerRow(i.dedupe_id, i.channel_id, i.direction, i.accepted_at, outcome, i.event_id,
                          i.jms_message_id, i.proxy_id, i.bridge_id, i.destination, gtrid, i.dispatched_at,
                          prepared_at, decided_at, broker_committed_at, acknowledged_at, reason) for i in items]
        return self.write(conn, rows)


class T2LedgerBranch:
    """A T2's PostgreSQL branch (any :class:`xa.resource.Resource`) that writes the T2's ledger rows.

    From ``begin`` on, the store's calls on ``conn`` collect their rows in :class:`T2Rows` (with the gtrid and the
    statement's time as ``dispatched_at``) instead of writing them; ``prepare`` writes them all in ONE statement
    with ``prepared_at`` = now, then prepares the branch: the rows are in the branch, so they commit exactly when
    the T2 commits and vanish with a rollback. A failing insert votes no (:class:`xa.errors.PrepareFailed`)."""

    def __init__(self, writer: LedgerWriter, conn: psycopg.Connection[Any], inner: Any, rows: T2Rows) -> None:
        self.writer = writer
        self.conn = conn
        self.inner = inner
        self.rows = rows
        self.name, self.kind, self.manager = inner.name, inner.kind, inner.manager
        self.one_phase_only = inner.one_phase_only

    def sort_key(self) -> str:
        key: str = self.inner.sort_key()
        return key

    def begin(self, xid: Xid) -> None:
        self.inner.begin(xid)
        self.writer._attach(self.conn, self.rows)

    def prepare(self) -> None:
        rows = self.writer._detach(self.conn)
        if rows is not None and rows.rows:
            now = datetime.now(UTC)
            dead = rows.dead_letters
            try:
                self.writer.write(self.conn, [replace(_dead_lettered(r, dead), prepared_at=now) for r in rows.rows])
            except psycopg.Error as exc:
                raise translate(exc, step="prepare", gtrid=rows.gtrid, branch=self.name) from exc
        self.inner.prepare()

    def commit(self) -> None:
        self.inner.commit()

    def rollback(self) -> None:
        self.writer._detach(self.conn)
        self.inner.rollback()


def t2_branch(ledger: Any, conn: Any, branch: Any, gtrid: str, outbox: Sequence[int | None] = ()) -> Any:
    """``branch`` (a T2's PostgreSQL branch on ``conn``) as a :class:`T2LedgerBranch` when ``ledger`` records
    persistent traffic, else unchanged. ``outbox``: the event ids of the T2's messages in send order (channel →
    JMS: message ``i`` carries ``xa.xid.dedupe_id(gtrid, i)``); the rows of those events record that id."""
    if not isinstance(ledger, LedgerWriter) or not ledger.records(persistent=True):
        return branch
    messages = {eid: message_dedupe_id(gtrid, i) for i, eid in enumerate(outbox) if eid is not None}
    return T2LedgerBranch(ledger, conn, branch, T2Rows(gtrid, messages))


# -- the hops after a T2's PostgreSQL branch ---------------------------------------------------------------------
#: The one-phase broker participants of a T2, by ``kind``: True when what the broker commits is the ACKs of the
#: messages the T2 took (JMS → channel), so that commit is also their acknowledgement.
BROKER_KINDS: Mapping[str, bool] = {"stomp-send": False, "stomp-ack": True}


@dataclass
class T2Hops:
    """The times of one T2 after its PostgreSQL branch was prepared (unix seconds, the node's clock)."""

    decided_at: float | None = None            # the COMMIT record was durable in the recovery log
    broker_committed_at: float | None = None   # the STOMP COMMIT of its broker transaction was receipted
    acks: bool = False                         # that broker transaction held ACKs (JMS → channel)
    committing: dict[str, str] = field(default_factory=dict)   # broker branch -> kind, while its commit runs

    def merge(self, other: T2Hops) -> None:
        """Fill what this one lacks from ``other`` (the first time recorded wins)."""
        if self.decided_at is None:
            self.decided_at = other.decided_at
        if self.broker_committed_at is None and other.broker_committed_at is not None:
            self.broker_committed_at, self.acks = other.broker_committed_at, other.acks


_HOPS_UPDATE = sql.SQL("""
    UPDATE nsjms_ledger l
    SET decided_at = COALESCE(l.decided_at, h.decided),
        broker_committed_at = COALESCE(l.broker_committed_at, h.committed),
        acknowledged_at = CASE WHEN l.acknowledged_at IS NULL AND h.acks AND l.direction = 'jms_to_channel'
                               THEN COALESCE(l.broker_committed_at, h.committed) ELSE l.acknowledged_at END
    FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[], %s::boolean[]) AS h(gtrid, decided, committed, acks)
    WHERE l.gtrid IS NOT NULL AND l.gtrid = h.gtrid AND l.outcome IN ('delivered', 'dead_letter')
      AND (l.decided_at IS NULL OR l.broker_committed_at IS NULL)""")


class T2HopRecorder:
    """Records, per T2, when its COMMIT decision was durable and when its broker transaction committed, and fills
    those hops into the T2's terminal ledger rows in the transaction that ends the T2's durable state
    (:meth:`write`, called by ``router.routing.t2.transactions.NodeTransactions`` in the outbox purge, docs/audit.md).

    It is the coordinator's :class:`xa.observer.Observer` (every call is forwarded to ``inner``, the node's
    telemetry): ``decided("commit")`` stamps ``decided_at``; a one-phase broker branch (:data:`BROKER_KINDS`)
    whose COMMIT phase ends ``COMMITTED`` stamps ``broker_committed_at``; ``ended`` in COMMITTED or
    COMMIT_PENDING makes the times ready. Recovery adds what it finishes (:meth:`recovered`). Thread-safe; the
    times live in memory until written (a crash before the next purge loses them: the hops stay NULL)."""

    def __init__(self, inner: Observer | None = None, clock: Callable[[], float] = _time.time) -> None:
        self.inner = Guarded(inner)
        self.clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, T2Hops] = {}    # decided COMMIT, the coordinator still drives it
        self._ready: dict[str, T2Hops] = {}      # the coordinator or recovery is done with it
        self.rows_updated = 0

    # -- the observer protocol (xa.observer.Observer) -------------------------------------------------------
    def begun(self, gtrid: str, timeout: float | None) -> None:
        self.inner.begun(gtrid, timeout)

    def phase_started(self, gtrid: str, phase: Phase, branch: str, kind: str) -> None:
        if phase is Phase.COMMIT and kind in BROKER_KINDS:
            with self._lock:
                hops = self._running.get(gtrid)
                if hops is not None:
                    hops.committing[branch] = kind
        self.inner.phase_started(gtrid, phase, branch, kind)

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        if phase is Phase.COMMIT:
            now = self.clock()
            with self._lock:
                hops = self._running.get(gtrid)
                kind = hops.committing.pop(branch, None) if hops is not None else None
                if hops is not None and kind is not None and result == "COMMITTED":
                    hops.broker_committed_at, hops.acks = now, BROKER_KINDS[kind]
        self.inner.phase_ended(gtrid, phase, branch, result, error)

    def decided(self, gtrid: str, decision: str, reason: str) -> None:
        if decision == "commit":
            now = self.clock()
            with self._lock:
                self._running[gtrid] = T2Hops(decided_at=now)
        self.inner.decided(gtrid, decision, reason)

    def ended(self, gtrid: str, state: State, timed_out: bool, duration_s: float) -> None:
        with self._lock:
            hops = self._running.pop(gtrid, None)
            if hops is not None and state in (State.COMMITTED, State.COMMIT_PENDING):
                hops.committing.clear()
                self._merge(gtrid, hops)
        self.inner.ended(gtrid, state, timed_out, duration_s)

    def recovery_pass(self, report: Any, duration_s: float, failed: str) -> None:
        self.inner.recovery_pass(report, duration_s, failed)

    # -- recovery ---------------------------------------------------------------------------------------------
    def recovered(self, before: Mapping[str, LiveTxn], ended: Collection[str], resent_at: Mapping[str, float]) -> None:
        """Recovery ended the transactions ``ended``; ``before``: the log's live entries read before that pass;
        ``resent_at``: gtrid -> when the re-send of its outbox rows was committed at the broker. A COMMIT finished
        by recovery gets ``decided_at`` = its COMMIT record's time and, when recovery re-sent its messages,
        ``broker_committed_at`` = that re-send's commit. A broker ACK transaction is never re-sent (the broker
        redelivers and the inbox acknowledges): its hops stay unknown."""
        with self._lock:
            for gtrid in ended:
                txn = before.get(gtrid)
                if txn is None or txn.commit is None:
                    continue
                hops = T2Hops(decided_at=txn.commit.at)
                sends = [p for p in txn.commit.participants if p.one_phase and BROKER_KINDS.get(p.kind) is False]
                if sends and gtrid in resent_at:
                    hops.broker_committed_at = resent_at[gtrid]
                self._merge(gtrid, hops)

    def _merge(self, gtrid: str, hops: T2Hops) -> None:
        have = self._ready.get(gtrid)
        if have is None:
            self._ready[gtrid] = hops
        else:
            have.merge(hops)

    # -- writing ----------------------------------------------------------------------------------------------
    def take(self, keep: Collection[str] = ()) -> dict[str, T2Hops]:
        """The ready times of every T2 not in ``keep`` (removed; :meth:`give_back` if their write fails)."""
        with self._lock:
            out = {g: h for g, h in self._ready.items() if g not in keep}
            for g in out:
                del self._ready[g]
        return out

    def give_back(self, hops: Mapping[str, T2Hops]) -> None:
        with self._lock:
            for g, h in hops.items():
                self._merge(g, h)

    def pending(self) -> int:
        with self._lock:
            return len(self._ready)

    def write(self, conn: psycopg.Connection[Any], hops: Mapping[str, T2Hops]) -> int:
        """Fill the hops of ``hops``' T2s into their terminal rows (``delivered``, ``dead_letter``) in ONE statement
        on the caller's transaction: ``decided_at``, ``broker_committed_at``, and for ``jms_to_channel`` rows of a
        T2 whose broker transaction held the ACKs, ``acknowledged_at`` = that commit. Rows that already have them
        are left alone. Returns the rows updated."""
        items = [(g, h) for g, h in hops.items() if h.decided_at is not None or h.broker_committed_at is not None]
        if not items:
            return 0
        cur = conn.execute(_HOPS_UPDATE, ([g for g, _ in items], [timestamp(h.decided_at) for _, h in items],
                                          [timestamp(h.broker_committed_at) for _, h in items],
                                          [h.acks for _, h in items]))
        n = max(cur.rowcount, 0)
        self.rows_updated += n
        return n


def _dead_lettered(row: LedgerRow, dead: Mapping[str, str]) -> LedgerRow:
    """``row`` as ``dead_letter`` with its reason when it is the ``delivered`` row of a message the bridge
    dead-lettered (:attr:`T2Rows.dead_letters`), else unchanged."""
    reason = dead.get(row.jms_message_id) if dead and row.jms_message_id is not None else None
    if reason is None or Outcome(row.outcome) is not Outcome.DELIVERED:
        return row
    return _with(row, Outcome.DEAD_LETTER, reason)


def _with(row: LedgerRow, outcome: Outcome, reason: str | None) -> LedgerRow:
    if row.outcome is outcome and row.failure_reason == reason:
        return row
    return LedgerRow(row.dedupe_id, row.channel_id, row.direction, row.accepted_at, outcome, row.event_id,
                     row.jms_message_id, row.proxy_id, row.bridge_id, row.destination, row.gtrid, row.dispatched_at,
                     row.prepared_at, row.decided_at, row.broker_committed_at, row.acknowledged_at, reason)


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, StrEnum) else value


# -- schema and partitions -------------------------------------------------------------------------------------
def schema_sql() -> str:
    """The text of the ledger's migration (``router/db/migrations/0003_ledger.sql``)."""
    return (resources.files("router.db") / "migrations" / MIGRATION).read_text(encoding="utf-8")


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """``[day 00:00 UTC, next day 00:00 UTC)``."""
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def list_partitions(conn: psycopg.Connection[Any]) -> list[date]:
    """The days that have a partition, ascending (the default partition is not a day)."""
    rows = conn.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                        "WHERE i.inhparent = %s::regclass", (TABLE,)).fetchall()
    days = []
    for (name,) in rows:
        m = _PARTITION_RE.match(str(name))
        if m:
            days.append(datetime.strptime(m.group(1), "%Y%m%d").date())
    return sorted(days)


def ensure_partitions(conn: psycopg.Connection[Any], first: date, days: int) -> list[date]:
    """Create the partitions of ``first`` and the ``days - 1`` following days that are missing; return them.

    Rows the default partition already holds for such a day are moved into it in the same transaction."""
    have = set(list_partitions(conn))
    created = []
    for n in range(days):
        day = first + timedelta(days=n)
        if day not in have:
            _create(conn, day)
            created.append(day)
    return created


def _create(conn: psycopg.Connection[Any], day: date) -> None:
    lo, hi = day_bounds(day)
    name, parent, default = (sql.Identifier(partition_name(day)), sql.Identifier(TABLE),
                             sql.Identifier(DEFAULT_PARTITION))
    bounds = sql.SQL("FOR VALUES FROM ({}) TO ({})").format(sql.Literal(lo), sql.Literal(hi))
    stray = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE accepted_at >= %s AND accepted_at < %s)")
                         .format(default), (lo, hi)).fetchone()
    if not (stray and stray[0]):
        conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} {}").format(name, parent, bounds))
        return
    # Rows already arrived for this day: move them out of the default partition, then attach.
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(name, parent))
    conn.execute(sql.SQL("WITH moved AS (DELETE FROM {} WHERE accepted_at >= %s AND accepted_at < %s RETURNING *) "
                         "INSERT INTO {} SELECT * FROM moved").format(default, name), (lo, hi))
    conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(parent, name, bounds))


def drop_expired_partitions(conn: psycopg.Connection[Any], retention_days: int, today: date) -> list[date]:
    """Drop the day partitions whose day ended more than ``retention_days`` whole days before ``today``.

    A day ``d`` is dropped when ``d < today - retention_days``; with ``retention_days=1`` yesterday is kept.
    Rows in the default partition are never dropped here."""
    if retention_days < 1:
        raise ValueError(f"retention_days must be >= 1, got {retention_days}")
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for day in list_partitions(conn):
        if day < cutoff:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition_name(day))))
            dropped.append(day)
    return dropped


#: The advisory lock key of ledger partition maintenance (the ASCII of "nsjmsldg").
MAINTENANCE_LOCK = 0x6E736A6D736C6467


def maintain(conn: psycopg.Connection[Any], retention_days: int, ahead_days: int,
             today: date | None = None) -> tuple[list[date], list[date]]:
    """Create today's and ``ahead_days`` next partitions, drop expired ones; return (created, dropped).

    Nodes of a cluster maintain one ledger: the transaction first takes :data:`MAINTENANCE_LOCK` (a
    transaction-level advisory lock, released at its end), so two nodes never create the same day's partition at
    once (the second failed with "already exists" and gave up until its next period); the second then finds the
    first's partitions."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MAINTENANCE_LOCK,))
    today = today or datetime.now(UTC).date()
    created = ensure_partitions(conn, today, ahead_days + 1)
    dropped = drop_expired_partitions(conn, retention_days, today)
    return created, dropped

