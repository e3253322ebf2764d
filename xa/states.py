"""The states of a routing transaction T2 as data: one ``str`` enum, one transition table, one :func:`apply`.

The table is the single source of truth: the coordinator and recovery move a transaction only through
:func:`apply`, and ``docs/transactions.md`` draws its diagram with :func:`mermaid` from the same table.
The values are plain strings so the recovery log and the operator view stay readable.

Rules the table encodes:

* Before the decision (ACTIVE, ROLLBACK_ONLY, PREPARING, PREPARED) every failure, an explicit rollback or the
  deadline (``DEADLINE_PASSED``) leads to ROLLING_BACK. There is no way from ROLLBACK_ONLY to PREPARING.
* ``DECISION_LOGGED`` (the COMMIT record is durable) is the only way into COMMITTING; after it no event leads to
  ROLLING_BACK: the deadline no longer applies, failures only leave work for recovery (COMMIT_PENDING).
* IN_DOUBT means the coordinator could not tell whether its COMMIT record is durable; only recovery (which reads
  the log back) resolves it.
* Heuristic states persist until an operator forgets them (FORGOTTEN).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from .errors import IllegalTransition

__all__ = ["TERMINAL", "TRANSITIONS", "Event", "State", "apply", "dot", "mermaid"]


class State(enum.StrEnum):
    ACTIVE = "ACTIVE"  # branches enlisted, work in progress
    ROLLBACK_ONLY = "ROLLBACK_ONLY"  # a participant / the bridge forced rollback (NJI 2.7.4)
    PREPARING = "PREPARING"  # phase one running
    PREPARED = "PREPARED"  # every participant voted yes; decision not yet written
    COMMITTING = "COMMITTING"  # COMMIT record durable: the transaction WILL commit; phase two running
    COMMITTED = "COMMITTED"  # phase two finished on every branch
    COMMIT_PENDING = "COMMIT_PENDING"  # decided commit; some branch outcome unknown, left to recovery
    IN_DOUBT = "IN_DOUBT"  # decision write outcome unknown; branches left prepared for recovery
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"
    HEURISTIC_COMMIT = "HEURISTIC_COMMIT"  # decided rollback, a participant committed on its own
    HEURISTIC_ROLLBACK = "HEURISTIC_ROLLBACK"  # decided commit, a participant rolled back on its own
    HEURISTIC_MIXED = "HEURISTIC_MIXED"  # some participants one way, some the other (or unknowable)
    FORGOTTEN = "FORGOTTEN"  # an operator acknowledged the heuristic outcome; the log forgot it


class Event(enum.StrEnum):
    ENLIST = "enlist"
    MARK_ROLLBACK_ONLY = "mark_rollback_only"
    COMMIT_REQUESTED = "commit_requested"
    ALL_PREPARED = "all_prepared"
    PREPARE_FAILED = "prepare_failed"
    DEADLINE_PASSED = "deadline_passed"
    ROLLBACK_REQUESTED = "rollback_requested"
    DECISION_LOGGED = "decision_logged"
    DECISION_NOT_LOGGED = "decision_not_logged"  # the log guarantees the record is absent
    DECISION_UNKNOWN = "decision_unknown"  # the log cannot say
    PHASE_TWO_DONE = "phase_two_done"
    PHASE_TWO_INCOMPLETE = "phase_two_incomplete"
    ROLLBACK_DONE = "rollback_done"
    RECOVERED_COMMIT = "recovered_commit"
    RECOVERED_ROLLBACK = "recovered_rollback"
    HEURISTIC_COMMIT = "heuristic_commit"
    HEURISTIC_ROLLBACK = "heuristic_rollback"
    HEURISTIC_MIXED = "heuristic_mixed"
    FORGET = "forget"


S, E = State, Event
_BEFORE_DECISION = (S.ACTIVE, S.ROLLBACK_ONLY, S.PREPARING, S.PREPARED)
_HEURISTIC_EVENTS = {
    E.HEURISTIC_COMMIT: S.HEURISTIC_COMMIT,
    E.HEURISTIC_ROLLBACK: S.HEURISTIC_ROLLBACK,
    E.HEURISTIC_MIXED: S.HEURISTIC_MIXED,
}


def _table() -> dict[State, dict[Event, State]]:
    table: dict[State, dict[Event, State]] = {
        S.ACTIVE: {E.ENLIST: S.ACTIVE, E.MARK_ROLLBACK_ONLY: S.ROLLBACK_ONLY, E.COMMIT_REQUESTED: S.PREPARING},
        S.ROLLBACK_ONLY: {E.ENLIST: S.ROLLBACK_ONLY, E.MARK_ROLLBACK_ONLY: S.ROLLBACK_ONLY},
        S.PREPARING: {E.ALL_PREPARED: S.PREPARED, E.PREPARE_FAILED: S.ROLLING_BACK,
                      E.MARK_ROLLBACK_ONLY: S.PREPARING},
        S.PREPARED: {E.DECISION_LOGGED: S.COMMITTING, E.DECISION_NOT_LOGGED: S.ROLLING_BACK,
                     E.DECISION_UNKNOWN: S.IN_DOUBT},
        S.COMMITTING: {E.PHASE_TWO_DONE: S.COMMITTED, E.PHASE_TWO_INCOMPLETE: S.COMMIT_PENDING,
                       E.HEURISTIC_ROLLBACK: S.HEURISTIC_ROLLBACK, E.HEURISTIC_MIXED: S.HEURISTIC_MIXED},
        S.COMMIT_PENDING: {E.RECOVERED_COMMIT: S.COMMITTED, E.HEURISTIC_ROLLBACK: S.HEURISTIC_ROLLBACK,
                           E.HEURISTIC_MIXED: S.HEURISTIC_MIXED},
        S.IN_DOUBT: {E.RECOVERED_COMMIT: S.COMMITTED, E.RECOVERED_ROLLBACK: S.ROLLED_BACK, **_HEURISTIC_EVENTS},
        S.ROLLING_BACK: {E.ROLLBACK_DONE: S.ROLLED_BACK, E.HEURISTIC_COMMIT: S.HEURISTIC_COMMIT,
                         E.HEURISTIC_MIXED: S.HEURISTIC_MIXED},
        S.COMMITTED: {},
        S.ROLLED_BACK: {},
        S.HEURISTIC_COMMIT: {E.FORGET: S.FORGOTTEN},
        S.HEURISTIC_ROLLBACK: {E.FORGET: S.FORGOTTEN},
        S.HEURISTIC_MIXED: {E.FORGET: S.FORGOTTEN},
        S.FORGOTTEN: {},
    }
    for state in _BEFORE_DECISION:
        table[state][E.DEADLINE_PASSED] = S.ROLLING_BACK
        table[state][E.ROLLBACK_REQUESTED] = S.ROLLING_BACK
    return table


#: state -> {event -> next state}; everything absent is illegal.
TRANSITIONS: Mapping[State, Mapping[Event, State]] = _table()

#: states a transaction never leaves.
TERMINAL: frozenset[State] = frozenset(s for s, moves in TRANSITIONS.items() if not moves)


def apply(state: State, event: Event, *, gtrid: str | None = None) -> State:
    """The state after ``event`` in ``state``; raises :class:`IllegalTransition` for a move the table lacks."""
    try:
        return TRANSITIONS[state][event]
    except KeyError:
        raise IllegalTransition(
            f"event {event.value!r} is illegal in state {state.value}",
            gtrid=gtrid, state=state.value, event=event.value,
        ) from None


def _edges() -> list[tuple[State, Event, State]]:
    return [(s, e, t) for s, moves in TRANSITIONS.items() for e, t in moves.items() if s is not t]


def mermaid() -> str:
    """The table as a Mermaid ``stateDiagram-v2`` (self-loops omitted)."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.ACTIVE.value}"]
    lines += [f"    {s.value} --> {t.value}: {e.value}" for s, e, t in _edges()]
    lines += [f"    {s.value} --> [*]" for s in sorted(TERMINAL, key=lambda x: x.value)]
    return "\n".join(lines) + "\n"


def dot() -> str:
    """The table as a Graphviz ``digraph`` (self-loops omitted)."""
    lines = ["digraph T2 {", "    rankdir=LR;"]
    lines += [f'    {s.value} [shape=doublecircle];' for s in sorted(TERMINAL, key=lambda x: x.value)]
    lines += [f'    {s.value} -> {t.value} [label="{e.value}"];' for s, e, t in _edges()]
    return "\n".join(lines) + "\n}\n"
