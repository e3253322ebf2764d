"""The operator's joined view of routing transactions (``nsjms txn``): pure functions over plain data, no I/O.

:func:`join` takes a :class:`Snapshot` (what the recovery log holds, the prepared transactions of the node's
database, the outbox/inbox rows of those transactions, the in-flight set, the clock) and returns a :class:`Listing`:
one :class:`TxnView` per transaction of this node with each participant's branch state, the outbox and inbox rows,
age, bridges, destinations, event count, heuristic outcomes, and the SAFE ACTION with its reason. The safe action
is computed by :meth:`xa.recovery.RecoveryManager.view` itself, over frozen stand-ins for the log and PostgreSQL, so
the CLI and recovery can never disagree about what is safe.

Prepared transactions are sorted three ways (``xa.xid``):

* this node's (nsjms format id, a gtrid naming this node): joined with the log, shown as transactions;
* **orphans**: the nsjms format id (``nsj1``) but a gtrid that names no transaction of any node (not
  ``<node>:<token>``: written by another tool or version, or damaged). Listed apart; recovery never touches them,
  and ``txn commit|rollback --xid GID`` is the only way to act on one;
* everything else (other nodes' xids, other applications' prepared transactions): counted as foreign, never shown
  in detail, never touched. Other databases' prepared transactions are not even read (``xa.pg.PgManager``).

:func:`refusal` says why an operator's commit/rollback must be refused (a decision logged the other way, a
transaction this node is driving now), or None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from psycopg import Xid

from xa.errors import BranchUnavailable, HeuristicKind, UsageError
from xa.records import LiveTxn, Participant, Record
from xa.recovery import InDoubt, RecoveryManager, SafeAction
from xa.xid import FORMAT_ID, NodeId, is_ours, parse_gtrid

__all__ = [
    "BranchView", "HeldInfo", "InboxInfo", "Listing", "OrphanView", "OutboxInfo", "Snapshot", "TxnView", "join",
    "parse_duration", "refusal", "select",
]

PG_MANAGER = "postgresql"


@dataclass(frozen=True)
class OutboxInfo:
    gtrid: str
    idx: int
    dedupe_id: str
    bridge_id: int
    destination: str
    created_at: float
    channel_id: int | None = None  # the bridge's channel (None: the bridge is gone)


@dataclass(frozen=True)
class InboxInfo:
    gtrid: str
    bridge_id: int
    message_id: str
    received_at: float
    channel_id: int | None = None


@dataclass(frozen=True)
class HeldInfo:
    """Channel events a PREPARED PostgreSQL branch holds: the queue rows it deleted (still visible to other sessions,
    their ``xmax`` is the prepared transaction's xid, or a MultiXact with it as the updater), by the channel -> JMS
    bridge that routes them. The outbox rows
    the branch wrote are not visible before it commits; these rows are (``router.routing.t2.ops.TxnOps._held``)."""

    gtrid: str
    bridge_id: int | None  # the bridge whose proxy queue held them (None: a consumer that is not a bridge)
    channel_id: int
    destination: str | None  # the bridge's JMS destination, /queue/NAME or /topic/NAME
    events: int


@dataclass(frozen=True)
class Snapshot:
    """Everything the view needs, read by the I/O layer (``router.routing.t2.ops``)."""

    node: str
    now: float  # wall clock, seconds
    guard_s: float  # recovery's in-flight guard (0 when the node is stopped: nothing can be deciding)
    live: Mapping[str, LiveTxn]
    prepared: Sequence[Xid] | None  # every prepared xid of the node's database; None: PostgreSQL did not answer
    pg_error: str = ""
    outbox: Sequence[OutboxInfo] = ()
    inbox: Sequence[InboxInfo] = ()
    in_flight: frozenset[str] = frozenset()
    mode: str = "offline"
    held: Sequence[HeldInfo] = ()
    broker_problem: str | None = None  # offline: why the broker cannot be reached to re-send (None: it can)


@dataclass(frozen=True)
class BranchView:
    name: str
    kind: str
    one_phase: bool
    state: str  # prepared | gone | done | unknown | not-confirmed | heuristic | unreachable
    prepared_at: float | None = None


@dataclass(frozen=True)
class TxnView:
    gtrid: str
    status: str
    decision: str | None  # commit | rollback | None (no decision logged: presumed abort)
    decided_at: float | None
    deadline: float | None
    age_s: float | None
    action: str
    reason: str
    branches: tuple[BranchView, ...] = ()
    outbox: tuple[OutboxInfo, ...] = ()
    inbox: tuple[InboxInfo, ...] = ()
    heuristics: tuple[dict[str, Any], ...] = ()
    held: tuple[HeldInfo, ...] = ()
    send_due: bool = False  # its logged COMMIT names a broker send branch not finished (its rows may be unreadable)

    @property
    def in_doubt(self) -> bool:
        """Waiting for recovery or an operator (what ``nsjms status`` counts)."""
        return self.action != SafeAction.WAIT.value

    @property
    def bridges(self) -> tuple[int, ...]:
        held = {h.bridge_id for h in self.held if h.bridge_id is not None}
        return tuple(sorted({r.bridge_id for r in self.outbox} | {r.bridge_id for r in self.inbox} | held))

    @property
    def channels(self) -> tuple[int, ...]:
        ids = [r.channel_id for r in self.outbox] + [r.channel_id for r in self.inbox] + [h.channel_id for h in
                                                                                          self.held]
        return tuple(sorted({c for c in ids if c is not None}))

    @property
    def destinations(self) -> tuple[str, ...]:
        held = {h.destination for h in self.held if h.destination is not None}
        return tuple(sorted({r.destination for r in self.outbox} | held))

    @property
    def events(self) -> int:
        """Events routed in it: messages sent (outbox rows) plus messages received (inbox rows); for a PREPARED
        branch, whose own rows cannot be read, the channel events it took from the bridges' queues
        (:class:`HeldInfo`)."""
        return len(self.outbox) + len(self.inbox) + sum(h.events for h in self.held)

    @property
    def events_known(self) -> bool:
        """False when a PostgreSQL branch is prepared and nothing of it could be read (a JMS -> channel T2: the
        events and inbox rows it inserted are invisible until it commits), so :attr:`events` is not its count."""
        return bool(self.events) or not any(b.state == "prepared" for b in self.branches)

    @property
    def sends(self) -> bool:
        """Committing it sends messages to the broker (outbox rows, or channel events a prepared branch holds)."""
        return self.send_due or bool(self.outbox) or any(h.bridge_id is not None for h in self.held)

    @property
    def operator_commit(self) -> dict[str, Any] | None:
        """The operator's heuristic COMMIT of it (the last HEURISTIC record of kind commit), or None."""
        marks = [h for h in self.heuristics if h["kind"] == HeuristicKind.COMMIT.value]
        return marks[-1] if marks else None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(in_doubt=self.in_doubt, bridges=list(self.bridges), channels=list(self.channels),
                   destinations=list(self.destinations), events=self.events, events_known=self.events_known)
        return out


@dataclass(frozen=True)
class OrphanView:
    gid: str
    format_id: int | None
    gtrid: str
    bqual: str | None
    prepared_at: float | None
    age_s: float | None
    owner: str | None
    reason: str


@dataclass(frozen=True)
class Listing:
    node: str
    mode: str
    time: float
    transactions: tuple[TxnView, ...]
    orphans: tuple[OrphanView, ...] = ()
    foreign: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "mode": self.mode, "time": self.time,
                "transactions": [t.as_dict() for t in self.transactions],
                "orphans": [asdict(o) for o in self.orphans], "foreign": self.foreign, "errors": list(self.errors)}


# ------------------------------------------------------------------------------------- frozen stand-ins
class _FrozenLog:
    def __init__(self, node: NodeId, live: Mapping[str, LiveTxn]) -> None:
        self._node, self._live = node, live

    @property
    def node(self) -> NodeId:
        return self._node

    def append(self, record: Record, *, durable: bool) -> None:
        raise UsageError("the operator view never writes the log")

    def live(self) -> Mapping[str, LiveTxn]:
        return self._live


class _FrozenManager:
    key = PG_MANAGER

    def __init__(self, prepared: Sequence[Xid] | None, error: str) -> None:
        self._prepared, self._error = prepared, error

    def recover(self) -> Sequence[Xid]:
        if self._prepared is None:
            raise BranchUnavailable(self._error or "PostgreSQL did not answer")
        return self._prepared

    def commit_branch(self, xid: Xid) -> None:
        raise UsageError("the operator view never finishes a branch")

    def rollback_branch(self, xid: Xid) -> None:
        raise UsageError("the operator view never finishes a branch")


class _FrozenClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now


def _refuse_resend(gtrid: str, participant: Participant) -> None:
    raise UsageError("the operator view never re-sends")


# ------------------------------------------------------------------------------------------------- join
def safe_actions(snap: Snapshot) -> list[InDoubt]:
    """Recovery's own operator view (safe action and reason) over the snapshot."""
    node = NodeId(snap.node)
    rm = RecoveryManager(node, _FrozenLog(node, snap.live), [_FrozenManager(snap.prepared, snap.pg_error)],
                         _refuse_resend, _FrozenClock(snap.now), in_flight_guard=snap.guard_s,
                         in_flight=lambda: snap.in_flight)
    return rm.view()


def join(snap: Snapshot) -> Listing:
    """The joined view (see the module docstring); oldest transaction first."""
    node = NodeId(snap.node)
    prepared = list(snap.prepared or ())
    ours = [x for x in prepared if is_ours(x, node)]
    orphans = tuple(_orphan(x, snap.now) for x in prepared if _is_orphan(x))
    foreign = len(prepared) - len(ours) - len(orphans)
    outbox = _by_gtrid(snap.outbox)
    inbox = _by_gtrid(snap.inbox)
    held: dict[str, list[HeldInfo]] = {}
    for h in snap.held:
        held.setdefault(h.gtrid, []).append(h)
    txns = []
    for entry in safe_actions(snap):
        xids = [x for x in ours if x.gtrid == entry.gtrid]
        txns.append(_txn(entry, snap.live.get(entry.gtrid), xids, snap, outbox.get(entry.gtrid, ()),
                         inbox.get(entry.gtrid, ()),
                         tuple(sorted(held.get(entry.gtrid, ()), key=lambda h: (h.bridge_id or -1, h.channel_id)))))
    errors = (f"PostgreSQL: {snap.pg_error or 'did not answer'}",) if snap.prepared is None else ()
    return Listing(snap.node, snap.mode, snap.now, tuple(txns), orphans, foreign, errors)


def _by_gtrid(rows: Sequence[Any]) -> dict[str, tuple[Any, ...]]:
    out: dict[str, list[Any]] = {}
    for r in rows:
        out.setdefault(r.gtrid, []).append(r)
    return {g: tuple(sorted(v, key=lambda r: (getattr(r, "idx", 0), getattr(r, "message_id", "")))) for g, v in
            out.items()}


def _is_orphan(xid: Xid) -> bool:
    return xid.format_id == FORMAT_ID and parse_gtrid(xid.gtrid) is None


def _orphan(xid: Xid, now: float) -> OrphanView:
    at = xid.prepared.timestamp() if xid.prepared is not None else None
    return OrphanView(str(xid), xid.format_id, xid.gtrid, xid.bqual, at, None if at is None else now - at,
                      xid.owner, "nsjms format id, but the gtrid names no transaction of any node: recovery never "
                      "touches it; decide it with --xid after checking what it holds")


def _txn(entry: InDoubt, txn: LiveTxn | None, xids: list[Xid], snap: Snapshot, outbox: tuple[OutboxInfo, ...],
         inbox: tuple[InboxInfo, ...], held: tuple[HeldInfo, ...] = ()) -> TxnView:
    decision_rec = (txn.commit or txn.rollback) if txn is not None else None
    decision = None if txn is None else "commit" if txn.commit else "rollback" if txn.rollback else None
    deadline = txn.commit.deadline if txn is not None and txn.commit is not None else None
    heuristics = tuple({"kind": h.kind.value, "branch": h.branch, "who": h.who, "why": h.why, "at": h.at}
                       for h in (txn.heuristics if txn is not None else ()))
    reason = entry.reason
    action = entry.action.value
    if entry.action is SafeAction.RESEND and txn is not None and not outbox and _acks_only(txn):
        reason = reason.replace("re-send the outbox rows with their dedupe ids", ACK_RESEND)
    if entry.action in (SafeAction.COMMIT, SafeAction.RESEND) and decision == "commit" and outbox:
        reason += f"; re-sends carry dedupe ids {outbox[0].dedupe_id}..{outbox[-1].dedupe_id}"
    if entry.action is SafeAction.ROLLBACK and decision is None and snap.guard_s == 0 and snap.mode == "offline":
        reason += " (the node is stopped: nothing can be deciding it)"
    if held and decision is None:
        n = sum(h.events for h in held)
        dests = ", ".join(sorted({h.destination for h in held if h.destination})) or "a consumer that is not a bridge"
        reason += (f"; it holds {n} channel event(s) for {dests}: a rollback gives them back to the queue (the node "
                   "delivers them again), a commit needs --heuristic and re-sends them")
    send_due = txn is not None and txn.commit is not None and any(
        p.one_phase and p.manager == SEND_MANAGER and p.name not in txn.done for p in txn.commit.participants)
    view = TxnView(entry.gtrid, entry.status, decision, decision_rec.at if decision_rec else None, deadline,
                   entry.age_s, action, reason, _branches(txn, xids, snap), outbox, inbox, heuristics, held, send_due)
    if snap.broker_problem and view.sends and action in (SafeAction.COMMIT.value, SafeAction.RESEND.value):
        view = replace(view, action=START_NODE, reason=(
            f"{reason}; but the broker cannot be reached from here ({snap.broker_problem}): start the node (its "
            "recovery does this at start, with its broker); nothing is committed here that cannot be sent"))
    return view


#: The action shown instead of commit/resend when the node is stopped and its broker cannot be reached to re-send.
START_NODE = "start-node"
ACK_RESEND = ("nothing to re-send in this direction (JMS -> channel: no outbox rows): the broker redelivers "
              "the messages whose ACKs it did not commit and the bridge acknowledges them again, the inbox "
              "recognising each (no second event)")


def _acks_only(txn: LiveTxn) -> bool:
    """Every unfinished one-phase branch of its COMMIT acknowledges (JMS -> channel), none sends."""
    assert txn.commit is not None
    left = [p for p in txn.commit.participants if p.one_phase and p.name not in txn.done]
    return bool(left) and all(p.manager == ACK_MANAGER for p in left)


ACK_MANAGER = "stomp-ack"  # transactions.ACK_MANAGER (not imported: this module stays free of I/O modules)
SEND_MANAGER = "stomp-send"  # router.routing.t2.transactions.SEND_MANAGER


def _branches(txn: LiveTxn | None, xids: list[Xid], snap: Snapshot) -> tuple[BranchView, ...]:
    prepared = {x.bqual or "": x for x in xids}
    decision = (txn.commit or txn.rollback) if txn is not None else None
    out: list[BranchView] = []
    settled = {h.branch for h in txn.heuristics} if txn is not None else set()
    for p in decision.participants if decision is not None else ():
        out.append(BranchView(p.name, p.kind, p.one_phase, _state(p, txn, prepared, settled, snap),
                              _at(prepared.get(p.name))))
        prepared.pop(p.name, None)
    for name, xid in sorted(prepared.items()):  # no decision logged: what PostgreSQL holds
        out.append(BranchView(name, "postgresql", False, "prepared", _at(xid)))
    return tuple(out)


def _state(p: Participant, txn: LiveTxn | None, prepared: Mapping[str, Xid], settled: set[str],
           snap: Snapshot) -> str:
    assert txn is not None
    if p.name in txn.done:
        return "done"
    if p.name in settled or "*" in settled:
        return "heuristic"
    if p.one_phase:
        if txn.rollback is not None:
            return "done"  # a one-phase branch never committed before the decision: nothing to undo
        return "unknown" if p.name in txn.unknown else "not-confirmed"
    if snap.prepared is None:
        return "unreachable"
    return "prepared" if p.name in prepared else "gone"


def _at(xid: Xid | None) -> float | None:
    return xid.prepared.timestamp() if xid is not None and xid.prepared is not None else None


# -------------------------------------------------------------------------------------------- operator
def refusal(view: TxnView, action: str, *, heuristic: bool = False) -> str | None:
    """Why an operator's ``commit`` / ``rollback`` of ``view`` must be refused, or None. ``heuristic``: the operator
    asked for a heuristic commit (``--heuristic``), needed to commit what has no COMMIT logged."""
    if view.status == "in-flight":
        return f"{view.gtrid}: this node is driving it now; wait for it to finish"
    mark = view.operator_commit
    if action == "rollback" and mark is not None:
        return (f"{view.gtrid}: it was committed heuristically by {mark['who']} at {_when(mark['at'])} "
                f"({mark['why']}): its PostgreSQL branch is committed and its messages re-sent or being re-sent, "
                "so there is nothing left to roll back. Check the data, then `nsjms txn forget` it")
    if action == "commit" and view.action == START_NODE:
        return f"{view.gtrid}: nothing done: {view.reason}"
    if action == "commit" and view.decision is None and not heuristic:
        count = (f"{view.events} event(s)" if view.events_known else "an unknown number of events (a prepared "
                 "branch's own rows cannot be read)")
        where = f" to {', '.join(view.destinations)}" if view.destinations else ""
        return (f"{view.gtrid}: no COMMIT is logged (its coordinator never decided; safe action {view.action}): "
                f"committing it is a HEURISTIC decision that commits {count}{where}; nothing done. Add --heuristic "
                "to commit it (its outbox rows are then re-sent with their dedupe ids), or roll it back")
    if action == "rollback" and view.decision == "commit":
        return (f"{view.gtrid}: the decision COMMIT is logged (at {_when(view.decided_at)}): branches may already be "
                "committed and the broker may hold its messages, so a rollback would break atomicity. "
                f"Safe action: {view.action} ({view.reason})")
    if action == "commit" and view.decision == "rollback":
        return (f"{view.gtrid}: the decision ROLLBACK is logged (at {_when(view.decided_at)}): committing what is "
                f"left would commit part of a transaction whose other branches rolled back. Safe action: "
                f"{view.action} ({view.reason})")
    return None


def _when(at: float | None) -> str:
    import time

    return "unknown time" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def select(listing: Listing, *, in_doubt: bool = False, older_than: float | None = None) -> tuple[TxnView, ...]:
    """``txn list --in-doubt --older-than``."""
    return tuple(t for t in listing.transactions
                 if (not in_doubt or t.in_doubt) and (older_than is None or (t.age_s or 0.0) >= older_than))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` as seconds; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise ValueError(f"expected a duration like 90s, 15m, 2h or 1d, got {text!r}")
    return float(match[1]) * _UNITS[match[2]]
