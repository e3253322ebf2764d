"""The T2 state table: legal moves, illegal moves raise, the decision is a one-way door, diagrams."""

from __future__ import annotations

import pickle

import pytest

from xa.errors import IllegalTransition
from xa.states import TERMINAL, TRANSITIONS, Event, State, apply, dot, mermaid

BEFORE = (State.ACTIVE, State.ROLLBACK_ONLY, State.PREPARING, State.PREPARED)
AFTER = (State.COMMITTING, State.COMMITTED, State.COMMIT_PENDING)


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(State)


def test_happy_path() -> None:
    s = State.ACTIVE
    for e in (Event.ENLIST, Event.COMMIT_REQUESTED, Event.ALL_PREPARED, Event.DECISION_LOGGED,
              Event.PHASE_TWO_DONE):
        s = apply(s, e)
    assert s is State.COMMITTED


@pytest.mark.parametrize("state", BEFORE)
def test_deadline_and_rollback_before_the_decision(state: State) -> None:
    assert apply(state, Event.DEADLINE_PASSED) is State.ROLLING_BACK
    assert apply(state, Event.ROLLBACK_REQUESTED) is State.ROLLING_BACK


@pytest.mark.parametrize("state", AFTER)
def test_no_way_back_after_the_decision(state: State) -> None:
    for event in (Event.DEADLINE_PASSED, Event.ROLLBACK_REQUESTED, Event.MARK_ROLLBACK_ONLY):
        with pytest.raises(IllegalTransition):
            apply(state, event)


def test_no_state_after_the_decision_reaches_rollback() -> None:
    reachable = {State.COMMITTING}
    frontier = [State.COMMITTING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()].values():
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert not reachable & {State.ROLLING_BACK, State.ROLLED_BACK, State.HEURISTIC_COMMIT}


def test_decision_logged_only_from_prepared() -> None:
    sources = [s for s, moves in TRANSITIONS.items() if Event.DECISION_LOGGED in moves]
    assert sources == [State.PREPARED]


def test_rollback_only_cannot_prepare() -> None:
    with pytest.raises(IllegalTransition) as info:
        apply(State.ROLLBACK_ONLY, Event.COMMIT_REQUESTED, gtrid="n1:" + "0" * 24)
    err = info.value
    assert (err.state, err.event, err.gtrid) == ("ROLLBACK_ONLY", "commit_requested", "n1:" + "0" * 24)
    again = pickle.loads(pickle.dumps(err))
    assert (again.state, again.event, again.gtrid, str(again)) == (err.state, err.event, err.gtrid, str(err))


def test_terminal_states() -> None:
    assert {State.COMMITTED, State.ROLLED_BACK, State.FORGOTTEN} == TERMINAL
    for state in TERMINAL:
        for event in Event:
            with pytest.raises(IllegalTransition):
                apply(state, event)


def test_heuristics_wait_for_forget() -> None:
    for state in (State.HEURISTIC_COMMIT, State.HEURISTIC_ROLLBACK, State.HEURISTIC_MIXED):
        assert TRANSITIONS[state] == {Event.FORGET: State.FORGOTTEN}


def test_values_are_readable_strings() -> None:
    assert State.COMMIT_PENDING == "COMMIT_PENDING"
    assert all(isinstance(s.value, str) for s in State)


def test_diagrams_are_drawn_from_the_table() -> None:
    text, graph = mermaid(), dot()
    assert text.startswith("stateDiagram-v2\n")
    for state, moves in TRANSITIONS.items():
        for event, target in moves.items():
            if state is not target:
                assert f"{state.value} --> {target.value}: {event.value}" in text
                assert f'{state.value} -> {target.value} [label="{event.value}"];' in graph


def test_the_docs_diagram_is_the_table() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "transactions.md").read_text()
    block = doc.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block == mermaid(), "regenerate the diagram: python -c 'from xa.states import mermaid; print(mermaid())'"
