"""Unit tests for :mod:`router.channel.qos`: property table, set/validate rules, event QoS, admin properties.

No service is needed; CORBA values are built locally (one test marshals them in a child process with an ORB).
"""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from typing import Any

import pytest

# omniORB must come first: importing it puts the COS stubs on sys.path.
# isort: off
import omniORB
import omniORB.any
from omniORB import CORBA

import CosNotification as N
import TimeBase
# isort: on

from router.channel import qos as Q

LONG_MAX = 2**31 - 1
TIMET_MAX = 2**64 - 1
BE, P = N.BestEffort, N.Persistent

CHANNEL = Q.Target(Q.Level.CHANNEL)
CADMIN = Q.Target(Q.Level.CONSUMER_ADMIN)
SADMIN = Q.Target(Q.Level.SUPPLIER_ADMIN)
PSUP = Q.Target(Q.Level.PROXY_SUPPLIER)
PCON = Q.Target(Q.Level.PROXY_CONSUMER)
SEQ_PSUP = Q.Target(Q.Level.PROXY_SUPPLIER, sequence=True)
SEQ_PCON = Q.Target(Q.Level.PROXY_CONSUMER, sequence=True)
ALL_TARGETS = (CHANNEL, CADMIN, SADMIN, PSUP, PCON, SEQ_PSUP, SEQ_PCON)
NO_CTX = Q.Context()


# -- value builders ----------------------------------------------------------------------------------------
def short(v: int) -> Any:
    return CORBA.Any(CORBA.TC_short, v)


def long_(v: int) -> Any:
    return CORBA.Any(CORBA.TC_long, v)


def ulong(v: int) -> Any:
    return CORBA.Any(CORBA.TC_ulong, v)


def boolean(v: bool) -> Any:
    return CORBA.Any(CORBA.TC_boolean, v)


def timet(v: int) -> Any:
    return CORBA.Any(TimeBase._tc_TimeT, v)


def ulonglong(v: int) -> Any:
    return CORBA.Any(CORBA.TC_ulonglong, v)


def utct(t: int) -> Any:
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(t, 0, 0, 0))


def prop(name: str, value: Any) -> Any:
    return N.Property(name, value)


def problems_of(exc: pytest.ExceptionInfo[Q.PropertiesError]) -> dict[str, Q.PropertyProblem]:
    return {p.name: p for p in exc.value.problems}


def chan(**overrides: object) -> dict[str, object]:
    return {**Q.channel_defaults(), **overrides}


def sec(n: float) -> int:
    return int(n * Q.TIMET_PER_SECOND)


# -- defaults and inheritance -------------------------------------------------------------------------------
def test_channel_defaults_are_the_documented_ones() -> None:
    assert Q.channel_defaults() == {
        N.EventReliability: BE, N.ConnectionReliability: BE, N.Priority: 0, N.Timeout: 0,
        N.OrderPolicy: N.PriorityOrder, N.DiscardPolicy: N.AnyOrder, N.MaximumBatchSize: 1,
        N.PacingInterval: 0, N.MaxEventsPerConsumer: 0, N.StartTimeSupported: True,
        N.StopTimeSupported: True, Q.DELIVERY_RELIABILITY: Q.ACK_NONE, Q.RETRIES: 3,
        Q.RETRY_INTERVAL: 10_000_000, Q.ENABLE_TRANSACTION: False,
    }


def test_channel_defaults_returns_a_fresh_dict() -> None:
    d = Q.channel_defaults()
    d[N.Priority] = 5
    assert Q.channel_defaults()[N.Priority] == 0


@pytest.mark.parametrize("target,absent", [
    (CADMIN, set()),
    (SADMIN, {N.MaxEventsPerConsumer, N.DiscardPolicy}),
    (PSUP, {N.MaximumBatchSize, N.PacingInterval}),
    (SEQ_PSUP, set()),
    (PCON, {N.MaxEventsPerConsumer, N.DiscardPolicy, N.MaximumBatchSize, N.PacingInterval}),
    (SEQ_PCON, {N.MaxEventsPerConsumer, N.DiscardPolicy}),
])
def test_inherit_copies_what_the_level_holds(target: Q.Target, absent: set[str]) -> None:
    parent = chan(**{N.Priority: 7, N.OrderPolicy: N.FifoOrder, N.MaximumBatchSize: 10, N.EventReliability: P,
                     N.ConnectionReliability: P, N.MaxEventsPerConsumer: 4})
    child = Q.inherit(parent, target)
    assert set(child) == set(parent) - absent
    assert all(child[k] == parent[k] for k in child)
    assert N.StartTime not in child and N.StopTime not in child


def test_inherit_fills_defaults_for_missing_parent_values() -> None:
    child = Q.inherit({N.Priority: 3}, SEQ_PSUP)
    assert child[N.Priority] == 3
    assert child[N.MaximumBatchSize] == 1 and child[Q.RETRIES] == 3


# -- set_qos: incremental, atomic ---------------------------------------------------------------------------
def test_apply_is_incremental_and_returns_a_new_dict() -> None:
    current = Q.channel_defaults()
    snapshot = dict(current)
    new = Q.apply_qos(current, [(N.Priority, short(5))], CHANNEL, NO_CTX)
    assert new == {**snapshot, N.Priority: 5}
    assert current == snapshot
    newer = Q.apply_qos(new, [prop(N.Timeout, timet(50))], CHANNEL, NO_CTX)
    assert newer[N.Priority] == 5 and newer[N.Timeout] == 50


def test_apply_is_atomic_and_lists_every_bad_property() -> None:
    current = Q.channel_defaults()
    snapshot = dict(current)
    request = [(N.Priority, short(9)), ("NoSuchThing", short(1)), (N.MaximumBatchSize, long_(0)),
               (N.Timeout, long_(5)), (N.StartTime, utct(1))]
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(current, request, CHANNEL, NO_CTX)
    assert {n: p.code for n, p in problems_of(exc).items()} == {
        "NoSuchThing": "BAD_PROPERTY", N.MaximumBatchSize: "BAD_VALUE", N.Timeout: "BAD_TYPE",
        N.StartTime: "UNSUPPORTED_PROPERTY"}
    assert current == snapshot


def test_last_duplicate_wins() -> None:
    new = Q.apply_qos(Q.channel_defaults(), [(N.Priority, short(1)), (N.Priority, short(2))], CHANNEL, NO_CTX)
    assert new[N.Priority] == 2


def test_get_qos_round_trip_on_a_channel() -> None:
    qos = chan(**{N.Priority: -4, N.Timeout: sec(3), N.ConnectionReliability: P, N.EventReliability: P})
    assert Q.apply_qos(Q.channel_defaults(), Q.to_properties(qos), CHANNEL, NO_CTX) == qos


# -- types -------------------------------------------------------------------------------------------------
GOOD_VALUES: list[tuple[str, Any, object]] = [
    (N.EventReliability, short(P), P),
    (N.ConnectionReliability, short(P), P),
    (N.Priority, short(-32767), -32767),
    (N.Priority, short(32767), 32767),
    (N.Timeout, timet(sec(10)), sec(10)),
    (N.Timeout, ulonglong(sec(10)), sec(10)),
    (N.StartTimeSupported, boolean(False), False),
    (N.StopTimeSupported, boolean(False), False),
    (N.MaxEventsPerConsumer, long_(100), 100),
    (N.MaximumBatchSize, long_(LONG_MAX), LONG_MAX),
    (N.PacingInterval, timet(TIMET_MAX), TIMET_MAX),
    (N.PacingInterval, ulonglong(0), 0),
    (Q.DELIVERY_RELIABILITY, short(Q.ACK_ACKNOWLEDGMENT), 1),
    (Q.RETRIES, long_(0), 0),
    (Q.RETRY_INTERVAL, timet(0), 0),
    (Q.ENABLE_TRANSACTION, boolean(True), True),
    *[(N.OrderPolicy, short(v), v) for v in (N.AnyOrder, N.FifoOrder, N.PriorityOrder, N.DeadlineOrder)],
    *[(N.DiscardPolicy, short(v), v)
      for v in (N.AnyOrder, N.FifoOrder, N.PriorityOrder, N.DeadlineOrder, N.LifoOrder)],
]


@pytest.mark.parametrize("name,value,expected", GOOD_VALUES)
def test_every_implemented_value_is_accepted_on_a_channel(name: str, value: Any, expected: object) -> None:
    extra = [(N.ConnectionReliability, short(P))] if name in (N.EventReliability, Q.ENABLE_TRANSACTION) else []
    assert Q.apply_qos(Q.channel_defaults(), [*extra, (name, value)], CHANNEL, NO_CTX)[name] == expected


BAD_TYPES: list[tuple[str, Any]] = [
    (N.EventReliability, long_(0)),
    (N.ConnectionReliability, boolean(True)),
    (N.Priority, long_(1)),
    (N.Priority, omniORB.any.to_any(1)),
    (N.Timeout, long_(5)),
    (N.Timeout, utct(5)),
    (N.Timeout, CORBA.Any(CORBA.TC_longlong, 5)),
    (N.StartTimeSupported, short(1)),
    (N.MaxEventsPerConsumer, short(1)),
    (N.MaxEventsPerConsumer, ulong(1)),
    (N.OrderPolicy, long_(1)),
    (N.DiscardPolicy, CORBA.Any(CORBA.TC_ushort, 1)),
    (N.MaximumBatchSize, short(2)),
    (N.PacingInterval, long_(2)),
    (Q.DELIVERY_RELIABILITY, long_(1)),
    (Q.RETRIES, short(1)),
    (Q.RETRY_INTERVAL, ulong(1)),
    (Q.ENABLE_TRANSACTION, short(1)),
    (N.Priority, CORBA.Any(CORBA.TC_string, "high")),
    (N.Priority, 5),                                   # not an Any at all
]


@pytest.mark.parametrize("name,value", BAD_TYPES)
def test_wrong_typecode_is_bad_type(name: str, value: Any) -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(name, value)], CHANNEL, NO_CTX)
    assert exc.value.problems == (Q.PropertyProblem("BAD_TYPE", name),)


def test_malformed_any_content_is_bad_type() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(N.Priority, CORBA.Any(CORBA.TC_short, "x"))], CHANNEL, NO_CTX)
    assert exc.value.problems[0].code == "BAD_TYPE"


# -- values ------------------------------------------------------------------------------------------------
BAD_VALUES: list[tuple[str, Any, object, object]] = [
    (N.MaximumBatchSize, long_(0), 1, LONG_MAX),
    (N.MaximumBatchSize, long_(-3), 1, LONG_MAX),
    (N.Priority, short(-32768), -32767, 32767),
    (N.Priority, short(40000), -32767, 32767),
    (Q.RETRIES, long_(-1), 0, LONG_MAX),
    (N.MaxEventsPerConsumer, long_(-1), 0, LONG_MAX),
    (N.OrderPolicy, short(N.LifoOrder), N.AnyOrder, N.DeadlineOrder),
    (N.OrderPolicy, short(-1), N.AnyOrder, N.DeadlineOrder),
    (N.DiscardPolicy, short(5), N.AnyOrder, N.LifoOrder),
    (N.EventReliability, short(2), BE, P),
    (N.ConnectionReliability, short(-1), BE, P),
    (Q.DELIVERY_RELIABILITY, short(2), 0, 1),
    (N.Timeout, timet(-1), 0, TIMET_MAX),
]


@pytest.mark.parametrize("name,value,low,high", BAD_VALUES)
def test_illegal_value_is_bad_value_with_the_legal_range(name: str, value: Any, low: object,
                                                         high: object) -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(name, value)], CHANNEL, NO_CTX)
    assert exc.value.problems == (Q.PropertyProblem("BAD_VALUE", name, low, high),)


# -- levels (Table 2-5) --------------------------------------------------------------------------------------
UNSUPPORTED = [
    (N.EventReliability, short(BE), (CADMIN, SADMIN, PSUP, PCON, SEQ_PSUP, SEQ_PCON)),
    (N.StartTime, utct(1), ALL_TARGETS),
    (N.StopTime, utct(1), ALL_TARGETS),
    (N.MaximumBatchSize, long_(5), (PSUP, PCON)),
    (N.PacingInterval, timet(5), (PSUP, PCON)),
    (N.MaxEventsPerConsumer, long_(5), (SADMIN, PCON, SEQ_PCON)),
    (N.DiscardPolicy, short(N.FifoOrder), (SADMIN, PCON, SEQ_PCON)),
]


@pytest.mark.parametrize("name,value,targets", UNSUPPORTED)
def test_property_not_settable_at_a_level_is_unsupported(name: str, value: Any,
                                                         targets: tuple[Q.Target, ...]) -> None:
    for target in ALL_TARGETS:
        current = Q.inherit(Q.channel_defaults(), target)
        if target in targets:
            with pytest.raises(Q.QoSError) as exc:
                Q.apply_qos(current, [(name, value)], target, Q.Context(parent=Q.channel_defaults()))
            assert exc.value.problems == (Q.PropertyProblem("UNSUPPORTED_PROPERTY", name),), target
        else:
            new = Q.apply_qos(current, [(name, value)], target, Q.Context(parent=Q.channel_defaults()))
            assert new[name] == value.value(), target


def test_level_is_checked_before_type() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.inherit(Q.channel_defaults(), PSUP), [(N.StopTime, short(1))], PSUP, NO_CTX)
    assert exc.value.problems[0].code == "UNSUPPORTED_PROPERTY"


# -- reliability rules (NS 2.5.5.1) ---------------------------------------------------------------------------
def test_persistent_events_need_persistent_connections() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(N.EventReliability, short(P))], CHANNEL, NO_CTX)
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", N.EventReliability, BE, BE),)
    both = Q.apply_qos(Q.channel_defaults(), [(N.EventReliability, short(P)), (N.ConnectionReliability, short(P))],
                       CHANNEL, NO_CTX)
    assert both[N.EventReliability] == both[N.ConnectionReliability] == P


def test_connection_cannot_drop_to_best_effort_under_persistent_events() -> None:
    current = chan(**{N.EventReliability: P, N.ConnectionReliability: P})
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(current, [(N.ConnectionReliability, short(BE))], CHANNEL, NO_CTX)
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", N.ConnectionReliability, P, P),)
    new = Q.apply_qos(current, [(N.ConnectionReliability, short(BE)), (N.EventReliability, short(BE))],
                      CHANNEL, NO_CTX)
    assert new[N.ConnectionReliability] == BE


def test_admin_below_persistent_event_channel_keeps_persistent_connections() -> None:
    parent = chan(**{N.EventReliability: P, N.ConnectionReliability: P})
    admin = Q.inherit(parent, CADMIN)
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(admin, [(N.ConnectionReliability, short(BE))], CADMIN, Q.Context(parent=parent))
    assert exc.value.problems[0].code == "UNAVAILABLE_VALUE"


@pytest.mark.parametrize("target", [CADMIN, SADMIN, PSUP, SEQ_PCON])
def test_persistent_child_under_best_effort_parent_is_unavailable(target: Q.Target) -> None:
    parent = Q.channel_defaults()
    child = Q.inherit(parent, target)
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(child, [(N.ConnectionReliability, short(P))], target, Q.Context(parent=parent))
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", N.ConnectionReliability, BE, BE),)
    persistent_parent = chan(**{N.ConnectionReliability: P})
    ok = Q.apply_qos(child, [(N.ConnectionReliability, short(P))], target, Q.Context(parent=persistent_parent))
    assert ok[N.ConnectionReliability] == P


def test_best_effort_child_under_persistent_parent_is_allowed() -> None:
    parent = chan(**{N.ConnectionReliability: P})
    child = Q.inherit(parent, PSUP)
    assert Q.apply_qos(child, [(N.ConnectionReliability, short(BE))], PSUP,
                       Q.Context(parent=parent))[N.ConnectionReliability] == BE


@pytest.mark.parametrize("target", [CHANNEL, CADMIN, SADMIN])
def test_connection_reliability_is_frozen_once_children_exist(target: Q.Target) -> None:
    parent = chan(**{N.ConnectionReliability: P})
    current = Q.inherit(parent, target) if target != CHANNEL else Q.channel_defaults()
    ctx_parent = parent if target != CHANNEL else None
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(current, [(N.ConnectionReliability, short(1 - int(current[N.ConnectionReliability])))],  # type: ignore[call-overload]
                    target, Q.Context(has_children=True, parent=ctx_parent))
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_PROPERTY", N.ConnectionReliability),)
    same = Q.apply_qos(current, [(N.ConnectionReliability, short(int(current[N.ConnectionReliability])))],  # type: ignore[call-overload]
                       target, Q.Context(has_children=True, parent=ctx_parent))
    assert same == current
    changed = Q.apply_qos(current, [(N.ConnectionReliability, short(1 - int(current[N.ConnectionReliability])))],  # type: ignore[call-overload]
                          target, Q.Context(has_children=False, parent=ctx_parent))
    assert changed[N.ConnectionReliability] != current[N.ConnectionReliability]


def test_event_reliability_may_change_on_a_channel_with_children() -> None:
    current = chan(**{N.ConnectionReliability: P})
    new = Q.apply_qos(current, [(N.EventReliability, short(P))], CHANNEL, Q.Context(has_children=True))
    assert new[N.EventReliability] == P


# -- EnableTransaction (NS 2.1.5, NJI 4.3) ----------------------------------------------------------------------
def test_enable_transaction_forces_persistent_on_the_channel() -> None:
    new = Q.apply_qos(Q.channel_defaults(), [(Q.ENABLE_TRANSACTION, boolean(True))], CHANNEL, NO_CTX)
    assert (new[N.EventReliability], new[N.ConnectionReliability], new[Q.ENABLE_TRANSACTION]) == (P, P, True)
    off = Q.apply_qos(new, [(Q.ENABLE_TRANSACTION, boolean(False))], CHANNEL, NO_CTX)
    assert (off[N.EventReliability], off[N.ConnectionReliability], off[Q.ENABLE_TRANSACTION]) == (BE, BE, False)


def test_repeating_the_current_enable_transaction_forces_nothing() -> None:
    current = chan(**{N.ConnectionReliability: P, N.EventReliability: P})
    assert Q.apply_qos(current, [(Q.ENABLE_TRANSACTION, boolean(False))], CHANNEL, NO_CTX) == current


def test_explicit_reliability_in_the_same_request_wins_when_disabling() -> None:
    current = chan(**{N.ConnectionReliability: P, N.EventReliability: P, Q.ENABLE_TRANSACTION: True})
    new = Q.apply_qos(current, [(Q.ENABLE_TRANSACTION, boolean(False)), (N.ConnectionReliability, short(P)),
                                (N.EventReliability, short(P))], CHANNEL, NO_CTX)
    assert (new[N.EventReliability], new[N.ConnectionReliability], new[Q.ENABLE_TRANSACTION]) == (P, P, False)


def test_enabling_with_explicit_best_effort_is_unavailable() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(Q.ENABLE_TRANSACTION, boolean(True)),
                                           (N.ConnectionReliability, short(BE))], CHANNEL, NO_CTX)
    assert problems_of(exc)[N.ConnectionReliability] == Q.PropertyProblem(
        "UNAVAILABLE_VALUE", N.ConnectionReliability, P, P)


def test_while_transactional_reliability_stays_persistent() -> None:
    on = Q.apply_qos(Q.channel_defaults(), [(Q.ENABLE_TRANSACTION, boolean(True))], CHANNEL, NO_CTX)
    for name in (N.EventReliability, N.ConnectionReliability):
        with pytest.raises(Q.QoSError) as exc:
            Q.apply_qos(on, [(name, short(BE))], CHANNEL, NO_CTX)
        assert problems_of(exc)[name] == Q.PropertyProblem("UNAVAILABLE_VALUE", name, P, P)


def test_enable_transaction_on_a_proxy_sets_its_own_reliabilities() -> None:
    channel = chan(**{N.ConnectionReliability: P})
    admin = Q.inherit(channel, SADMIN)
    proxy = Q.inherit(admin, PCON)
    new = Q.apply_qos(proxy, [(Q.ENABLE_TRANSACTION, boolean(True))], PCON, Q.Context(parent={**channel, **admin}))
    assert (new[N.EventReliability], new[N.ConnectionReliability]) == (P, P)
    assert admin[N.EventReliability] == BE                  # the parent is untouched
    assert Q.event_qos(new, [])["persistent"] is True


def test_enable_transaction_under_best_effort_parent_is_unavailable() -> None:
    parent = Q.channel_defaults()
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.inherit(parent, PSUP), [(Q.ENABLE_TRANSACTION, boolean(True))], PSUP,
                    Q.Context(parent=parent))
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION, False, False),)


def test_enable_transaction_that_would_change_frozen_connections_is_unavailable() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(Q.ENABLE_TRANSACTION, boolean(True))], CHANNEL,
                    Q.Context(has_children=True))
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION, False, False),)
    already = chan(**{N.ConnectionReliability: P})
    new = Q.apply_qos(already, [(Q.ENABLE_TRANSACTION, boolean(True))], CHANNEL, Q.Context(has_children=True))
    assert new[N.EventReliability] == P


# -- validate_qos (NS 2.5.6.4, 2.5.6.8) -------------------------------------------------------------------------
def test_validate_raises_like_apply_and_changes_nothing() -> None:
    current = Q.channel_defaults()
    snapshot = dict(current)
    with pytest.raises(Q.QoSError) as exc:
        Q.validate_qos(current, [(N.MaximumBatchSize, long_(0)), (N.EventReliability, short(P))], CHANNEL, NO_CTX)
    assert {p.code for p in exc.value.problems} == {"BAD_VALUE", "UNAVAILABLE_VALUE"}
    Q.validate_qos(current, [(N.Priority, short(3))], CHANNEL, NO_CTX)
    assert current == snapshot


def _example2_state() -> dict[str, object]:
    return chan(**{N.ConnectionReliability: P, N.EventReliability: P, N.Timeout: sec(100)})


RELIABILITY = {N.EventReliability, N.ConnectionReliability, Q.ENABLE_TRANSACTION}


def test_example_2_validate_timeout_offers_only_event_reliability_change() -> None:
    available = Q.validate_qos(_example2_state(), [(N.Timeout, timet(sec(50)))], CHANNEL, NO_CTX)
    names = [name for name, _, _ in available]
    assert N.Timeout not in names
    assert [a for a in available if a[0] in RELIABILITY] == [(N.EventReliability, BE, BE)]


def test_example_2_validate_best_effort_events_offers_connection_and_timeout() -> None:
    available = Q.validate_qos(_example2_state(), [(N.EventReliability, short(BE))], CHANNEL, NO_CTX)
    by_name = {name: (low, high) for name, low, high in available}
    assert N.EventReliability not in by_name
    assert by_name[N.ConnectionReliability] == (BE, BE)
    assert by_name[N.Timeout] == (0, TIMET_MAX)
    assert Q.ENABLE_TRANSACTION not in by_name


def test_validate_offers_only_settable_properties_not_in_the_request() -> None:
    available = {n for n, _, _ in Q.validate_qos(Q.inherit(Q.channel_defaults(), PCON),
                                                 [(N.Priority, short(1))], PCON, Q.Context(parent=chan()))}
    assert N.Priority not in available
    assert not available & {N.EventReliability, N.StartTime, N.StopTime, N.MaximumBatchSize,
                            N.MaxEventsPerConsumer, N.DiscardPolicy}
    assert {N.Timeout, N.OrderPolicy, Q.RETRIES} <= available


def _states() -> list[tuple[Q.Target, dict[str, object], Q.Context]]:
    out = []
    for target in (CHANNEL, CADMIN, PSUP):
        for er, cr, et in itertools.product((BE, P), (BE, P), (False, True)):
            if (er == P and cr == BE) or (et and (er, cr) != (P, P)):
                continue
            for kids, parent_cr in itertools.product((False, True), (BE, P)):
                if target == CHANNEL and parent_cr == P:
                    continue
                parent = None if target == CHANNEL else chan(**{N.ConnectionReliability: parent_cr})
                if parent is not None and cr == P and parent_cr == BE:
                    continue
                qos = {**Q.inherit(chan(), target), N.EventReliability: er, N.ConnectionReliability: cr,
                       Q.ENABLE_TRANSACTION: et}
                out.append((target, qos, Q.Context(has_children=kids and target != PSUP, parent=parent)))
    return out


def _as_any(name: str, v: object) -> Any:
    return boolean(bool(v)) if name == Q.ENABLE_TRANSACTION else short(int(v))  # type: ignore[call-overload]


@pytest.mark.parametrize("target,current,ctx", _states())
def test_every_combination_of_offered_reliability_properties_is_accepted(
        target: Q.Target, current: dict[str, object], ctx: Q.Context) -> None:
    settable = [n for n in (N.EventReliability, N.ConnectionReliability, Q.ENABLE_TRANSACTION)
                if target == CHANNEL or n != N.EventReliability]
    for size in range(len(settable) + 1):
        for req_names in itertools.combinations(settable, size):
            for req_vals in itertools.product(*[(0, 1)] * size):
                request = [(n, _as_any(n, v)) for n, v in zip(req_names, req_vals, strict=True)]
                try:
                    available = Q.validate_qos(current, request, target, ctx)
                except Q.QoSError:
                    with pytest.raises(Q.QoSError):
                        Q.apply_qos(current, request, target, ctx)
                    continue
                offered = [(n, lo, hi) for n, lo, hi in available if n in RELIABILITY]
                _check_all_subsets(current, request, offered, target, ctx)


def _check_all_subsets(current: dict[str, object], request: list[tuple[str, Any]],
                       offered: list[tuple[str, object, object]], target: Q.Target, ctx: Q.Context) -> None:
    for size in range(len(offered) + 1):
        for subset in itertools.combinations(offered, size):
            ranges = [range(int(lo), int(hi) + 1) for _, lo, hi in subset]  # type: ignore[call-overload]
            for values in itertools.product(*ranges):
                extra = [(n, _as_any(n, v)) for (n, _, _), v in zip(subset, values, strict=True)]
                Q.apply_qos(current, request + extra, target, ctx)     # must not raise


# -- per-event QoS (NS 2.2, 2.5.6.2) ----------------------------------------------------------------------------
def _proxy(**overrides: object) -> dict[str, object]:
    return {**Q.inherit(chan(), PCON), **overrides}


def test_event_qos_defaults_come_from_the_proxy() -> None:
    proxy = _proxy(**{N.Priority: 4, N.Timeout: sec(2)})
    assert Q.event_qos(proxy, []) == {"priority": 4, "persistent": False, "start_time": None,
                                      "stop_time": None, "timeout": sec(2)}


def test_header_overrides_apply_to_one_event_only() -> None:
    proxy = _proxy(**{N.ConnectionReliability: P})
    snapshot = dict(proxy)
    header = [prop(N.Priority, short(-9)), prop(N.Timeout, timet(77)), prop(N.EventReliability, short(P)),
              prop(N.StartTime, utct(1000)), prop(N.StopTime, utct(2000))]
    assert Q.event_qos(proxy, header) == {"priority": -9, "persistent": True, "start_time": 1000,
                                          "stop_time": 2000, "timeout": 77}
    assert proxy == snapshot
    assert Q.event_qos(proxy, [])["priority"] == 0


def test_event_qos_accepts_plain_ulonglong_timeout_and_tuples() -> None:
    assert Q.event_qos(_proxy(), [(N.Timeout, ulonglong(5))])["timeout"] == 5


def test_user_and_non_message_header_fields_are_ignored() -> None:
    header = [prop("Severity", CORBA.Any(CORBA.TC_string, "major")), prop(N.OrderPolicy, long_(99)),
              prop(Q.SEQUENCE_NUMBER, long_(4)), prop(N.ConnectionReliability, CORBA.Any(CORBA.TC_string, "x"))]
    assert Q.event_qos(_proxy(), header)["priority"] == 0


@pytest.mark.parametrize("header,code", [
    ([(N.Priority, long_(1))], "BAD_TYPE"),
    ([(N.Priority, short(-32768))], "BAD_VALUE"),
    ([(N.Timeout, long_(1))], "BAD_TYPE"),
    ([(N.StopTime, timet(1))], "BAD_TYPE"),
    ([(N.StartTime, CORBA.Any(CORBA.TC_string, "tomorrow"))], "BAD_TYPE"),
    ([(N.EventReliability, short(3))], "BAD_VALUE"),
    ([(N.EventReliability, short(P))], "UNAVAILABLE_VALUE"),          # BestEffort connections
])
def test_bad_header_qos_raises_event_qos_error(header: list[tuple[str, Any]], code: str) -> None:
    with pytest.raises(Q.EventQoSError) as exc:
        Q.event_qos(_proxy(), header)
    assert exc.value.problems[0].code == code
    assert not isinstance(exc.value, Q.QoSError)


@pytest.mark.parametrize("field,flag", [(N.StartTime, N.StartTimeSupported), (N.StopTime, N.StopTimeSupported)])
def test_unsupported_start_or_stop_time_in_header_is_rejected(field: str, flag: str) -> None:
    with pytest.raises(Q.EventQoSError) as exc:
        Q.event_qos(_proxy(**{flag: False}), [(field, utct(Q.unix_to_utc(0)))])
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_PROPERTY", field),)
    got = Q.event_qos(_proxy(), [(field, utct(5))])
    assert (got["start_time"] if field == N.StartTime else got["stop_time"]) == 5


def test_persistent_default_comes_from_an_inherited_channel_setting() -> None:
    channel = chan(**{N.ConnectionReliability: P, N.EventReliability: P})
    proxy = Q.inherit(Q.inherit(channel, SADMIN), PCON)
    assert Q.event_qos(proxy, [])["persistent"] is True
    assert Q.event_qos(proxy, [(N.EventReliability, short(BE))])["persistent"] is False


# -- validate_event_qos (NS 2.5.6.5, Example 1) ------------------------------------------------------------------
def test_example_1_timeout_request_offers_stop_time() -> None:
    proxy = _proxy(**{N.StartTimeSupported: False})
    available = {n: (lo, hi) for n, lo, hi in Q.validate_event_qos(proxy, [(N.Timeout, timet(50))])}
    assert available[N.StopTime] == (0, TIMET_MAX)
    assert N.Timeout not in available and N.StartTime not in available
    assert available[N.EventReliability] == (BE, BE)


def test_example_1_stop_time_request_offers_timeout() -> None:
    proxy = _proxy(**{N.StartTimeSupported: False})
    available = {n: (lo, hi) for n, lo, hi in Q.validate_event_qos(
        proxy, [(N.StopTime, utct(Q.unix_to_utc(datetime(1999, 1, 31, tzinfo=UTC).timestamp())))])}
    assert available[N.Timeout] == (0, TIMET_MAX)
    assert N.StopTime not in available


def test_example_1_persistent_event_is_refused() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.validate_event_qos(_proxy(), [(N.EventReliability, short(P))])
    assert exc.value.problems == (Q.PropertyProblem("UNAVAILABLE_VALUE", N.EventReliability, BE, BE),)
    persistent = _proxy(**{N.ConnectionReliability: P})
    assert N.EventReliability not in {n for n, _, _ in Q.validate_event_qos(
        persistent, [(N.EventReliability, short(P))])}
    assert (N.EventReliability, BE, P) in Q.validate_event_qos(persistent, [])


def test_validate_event_qos_is_strict_about_names() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.validate_event_qos(_proxy(), [("Severity", short(1)), (N.OrderPolicy, short(1)),
                                        (N.Priority, long_(1))])
    assert {n: p.code for n, p in problems_of(exc).items()} == {
        "Severity": "BAD_PROPERTY", N.OrderPolicy: "UNSUPPORTED_PROPERTY", N.Priority: "BAD_TYPE"}


# -- admin properties (NS 2.5.7, NJI 4.3) -----------------------------------------------------------------------
def test_admin_defaults() -> None:
    assert Q.admin_defaults() == {
        N.MaxQueueLength: 0, N.MaxConsumers: 0, N.MaxSuppliers: 0, N.RejectNewEvents: False,
        Q.TRANSACTION_EVENTS: 1, Q.TRANSACTION_EVENT_SEQUENCES: 1, Q.TRANSACTION_TIMEOUT: 0}


def test_apply_admin_is_incremental() -> None:
    current = Q.admin_defaults()
    new = Q.apply_admin(current, [prop(N.MaxQueueLength, long_(10)), (N.RejectNewEvents, boolean(True)),
                                  (Q.TRANSACTION_TIMEOUT, ulong(2**32 - 1)), (Q.TRANSACTION_EVENTS, long_(50))])
    assert new == {**current, N.MaxQueueLength: 10, N.RejectNewEvents: True,
                   Q.TRANSACTION_TIMEOUT: 2**32 - 1, Q.TRANSACTION_EVENTS: 50}
    assert current == Q.admin_defaults()


def test_apply_admin_is_atomic_and_lists_every_problem() -> None:
    request = [(N.MaxConsumers, long_(5)), ("Bogus", long_(1)), (N.Priority, short(1)),
               (Q.TRANSACTION_TIMEOUT, long_(5)), (N.RejectNewEvents, short(1)), (N.MaxSuppliers, long_(-1)),
               (Q.TRANSACTION_EVENTS, long_(0)), (Q.TRANSACTION_EVENT_SEQUENCES, long_(0))]
    with pytest.raises(Q.AdminError) as exc:
        Q.apply_admin(Q.admin_defaults(), request)
    assert problems_of(exc) == {
        "Bogus": Q.PropertyProblem("BAD_PROPERTY", "Bogus"),
        N.Priority: Q.PropertyProblem("BAD_PROPERTY", N.Priority),
        Q.TRANSACTION_TIMEOUT: Q.PropertyProblem("BAD_TYPE", Q.TRANSACTION_TIMEOUT),
        N.RejectNewEvents: Q.PropertyProblem("BAD_TYPE", N.RejectNewEvents),
        N.MaxSuppliers: Q.PropertyProblem("BAD_VALUE", N.MaxSuppliers, 0, LONG_MAX),
        Q.TRANSACTION_EVENTS: Q.PropertyProblem("BAD_VALUE", Q.TRANSACTION_EVENTS, 1, LONG_MAX),
        Q.TRANSACTION_EVENT_SEQUENCES: Q.PropertyProblem("BAD_VALUE", Q.TRANSACTION_EVENT_SEQUENCES, 1, LONG_MAX),
    }


def test_admin_names_are_not_qos_names() -> None:
    with pytest.raises(Q.QoSError) as exc:
        Q.apply_qos(Q.channel_defaults(), [(N.MaxQueueLength, long_(1))], CHANNEL, NO_CTX)
    assert exc.value.problems[0].code == "BAD_PROPERTY"


# -- conversions --------------------------------------------------------------------------------------------
def _unalias_kind(tc: Any) -> Any:
    while tc.kind() == CORBA.tk_alias:
        tc = tc.content_type()
    return tc.kind()


def test_to_properties_uses_the_right_typecodes() -> None:
    props = {p.name: p.value for p in Q.to_properties({**Q.channel_defaults(), **Q.admin_defaults()})}
    assert props[N.EventReliability].typecode().kind() == CORBA.tk_short
    assert props[N.Timeout].typecode().equivalent(TimeBase._tc_TimeT)
    assert props[N.Timeout].typecode().id() == "IDL:omg.org/TimeBase/TimeT:1.0"
    assert _unalias_kind(props[Q.RETRY_INTERVAL].typecode()) == CORBA.tk_ulonglong
    assert props[N.MaximumBatchSize].typecode().kind() == CORBA.tk_long
    assert props[N.StopTimeSupported].typecode().kind() == CORBA.tk_boolean
    assert props[N.StopTimeSupported].value() is True
    assert props[Q.TRANSACTION_TIMEOUT].typecode().kind() == CORBA.tk_ulong
    assert props[N.RejectNewEvents].value() is False
    assert props[Q.RETRY_INTERVAL].value() == 10_000_000


def test_to_properties_orders_known_names_first_and_skips_none() -> None:
    props = Q.to_properties({"zzVendor": 5, N.StopTime: None, N.Priority: 1, Q.RETRIES: 2})
    assert [p.name for p in props] == [N.Priority, Q.RETRIES, "zzVendor"]
    assert props[2].value.value() == 5


def test_to_properties_round_trips_admin_properties() -> None:
    admin = {**Q.admin_defaults(), N.MaxQueueLength: 3, Q.TRANSACTION_TIMEOUT: 9}
    assert Q.apply_admin({}, Q.to_properties(admin)) == admin


def test_to_property_errors_carry_code_name_and_typed_range() -> None:
    errors = Q.to_property_errors([Q.PropertyProblem("BAD_VALUE", N.MaximumBatchSize, 1, LONG_MAX),
                                   Q.PropertyProblem("BAD_PROPERTY", "Nope"),
                                   Q.PropertyProblem("UNAVAILABLE_VALUE", Q.ENABLE_TRANSACTION, False, False)])
    assert [e.code for e in errors] == [N.BAD_VALUE, N.BAD_PROPERTY, N.UNAVAILABLE_VALUE]
    assert [e.name for e in errors] == [N.MaximumBatchSize, "Nope", Q.ENABLE_TRANSACTION]
    rng = errors[0].available_range
    assert rng.low_val.typecode().kind() == CORBA.tk_long and (rng.low_val.value(), rng.high_val.value()) == (
        1, LONG_MAX)
    assert errors[1].available_range.low_val.typecode().kind() == CORBA.tk_null
    assert errors[2].available_range.high_val.typecode().kind() == CORBA.tk_boolean


def test_to_named_ranges_types_utc_values() -> None:
    ranges = Q.to_named_ranges([(N.StopTime, 0, TIMET_MAX), (N.Priority, -32767, 32767)])
    assert ranges[0].name == N.StopTime
    assert ranges[0].range.high_val.typecode().equivalent(TimeBase._tc_UtcT)
    assert ranges[0].range.high_val.value().time == TIMET_MAX
    assert ranges[1].range.low_val.value() == -32767
    assert ranges[1].range.low_val.typecode().kind() == CORBA.tk_short


def test_conversions_marshal_with_a_real_orb() -> None:
    """CDR-marshal every conversion in a child process (an ORB is process-global; keep it out of this one)."""
    code = textwrap.dedent("""
        import omniORB
        from omniORB import CORBA
        import CosNotification as N
        from router.channel import qos as Q
        orb = CORBA.ORB_init(["-ORBendPoint", "giop:tcp:127.0.0.1:"], CORBA.ORB_ID)
        values = [
            (N._tc_PropertySeq, Q.to_properties({**Q.channel_defaults(), **Q.admin_defaults()})),
            (N._tc_PropertyErrorSeq, Q.to_property_errors([Q.PropertyProblem("BAD_VALUE", N.StopTime, 0, 2**64-1),
                                                           Q.PropertyProblem("BAD_PROPERTY", "x")])),
            (N._tc_NamedPropertyRangeSeq, Q.to_named_ranges(Q.validate_qos(
                Q.channel_defaults(), [], Q.Target(Q.Level.CHANNEL), Q.Context()))),
        ]
        for tc, value in values:
            back = omniORB.cdrUnmarshal(tc, omniORB.cdrMarshal(tc, value))
            assert len(back) == len(value) > 0
        print("ok", len(values))
        orb.destroy()
    """)
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok 3"


def test_utc_conversion() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC) - datetime(1582, 10, 15, tzinfo=UTC)
    assert int(epoch.total_seconds()) * Q.TIMET_PER_SECOND == Q.UTC_EPOCH_OFFSET
    assert Q.unix_to_utc(0) == Q.UTC_EPOCH_OFFSET
    assert Q.utc_to_unix(Q.UTC_EPOCH_OFFSET + 15_000_000) == 1.5
    now = 1_700_000_000.25
    assert Q.utc_to_unix(Q.unix_to_utc(now)) == pytest.approx(now, abs=1e-6)


def test_errors_are_picklable_and_keep_their_problems() -> None:
    err = Q.AdminError([Q.PropertyProblem("BAD_TYPE", N.MaxConsumers)])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is Q.AdminError and back.problems == err.problems
    assert "BAD_TYPE MaxConsumers" in str(back)
