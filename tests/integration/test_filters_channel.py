"""Filter objects on a real node over IIOP: the NS 2.4.7 worked examples, AND/OR groups, persistence, callbacks.

Clients use the standard OMG stubs only (``CosNotifyFilter`` from omniORB). The examples' user-defined types
come from the ETCL test IDL (compiled on the client side only: the server meets them as unknown types).
"""

from __future__ import annotations

import importlib.util
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyComm__POA
import CosNotifyFilter
import TimeBase

from stdclients import StructuredPushConsumer, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
MARKER_TYPE = ("nsjms-test", "QuietMarker")    # the event type of marker events (see quiet)
_markers = itertools.count()


def _support() -> Any:
    name = "etcl_test_support"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "unit" / "test_etcl_support.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


S = _support()
E, TN = S.load_idl()


def any_of(v: Any) -> Any:
    from omniORB.any import to_any

    return to_any(v)


def structured(name: str, domain: str = "Telecom", type_name: str = "CommunicationsAlarm",
               variable: dict[str, Any] | None = None, filterable: dict[str, Any] | None = None) -> Any:
    return S.structured(domain=domain, type_name=type_name, event_name=name, variable=variable,
                        filterable=filterable)


def key_of(ev: Any) -> str:
    """Event name of a structured event, or a content key of an Any event (wrapped as %ANY on delivery)."""
    if isinstance(ev, CORBA.Any):
        return _any_key(ev)
    if ev.header.fixed_header.event_type.type_name == "%ANY":
        return _any_key(ev.remainder_of_body)
    return str(ev.header.fixed_header.event_name)


def _any_key(a: Any) -> str:
    v = a.value()
    return "any:" + repr(sorted((k, repr(x)) for k, x in vars(v).items()))


def tc_time(seconds_ago: float) -> Any:
    t = int((time.time() - seconds_ago) * 10_000_000) + 122_192_928_000_000_000
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(t, 0, 0, 0))


# (constraint, [(event, must_match)]) for NS 2.4.7 examples 1-12 (errata of spec digest §7 applied).
def examples() -> list[tuple[str, str, list[tuple[Any, bool]]]]:
    def student(tag: str, *sc: int) -> Any:
        return CORBA.Any(E._tc_Student, E.Student(tag, [E.TestResult(f"t{i}", s) for i, s in enumerate(sc)]))

    return [
        ("ex1", "$type_name == 'CommunicationsAlarm' and not ($event_name == 'lost_packet')",
         [(structured("ex1-a"), True), (structured("lost_packet"), False),
          (structured("ex1-c", type_name="QoSAlarm"), False)]),
        ("ex2", "$type_name == 'CommunicationsAlarm' and $priority >= 1 and $priority <= 5",
         [(structured("ex2-a", variable={"Priority": CORBA.Any(CORBA.TC_short, 3)}), True),
          (structured("ex2-b", variable={"Priority": CORBA.Any(CORBA.TC_short, 0)}), False),
          (structured("ex2-c", variable={"Priority": CORBA.Any(CORBA.TC_short, 6)}), False)]),
        ("ex3", "$type_name == 'MOVIE' and (('groucho' in $starlist) + ('chico' in $starlist) + "
                "('harpo' in $starlist) + ('zeppo' in $starlist) + ('gummo' in $starlist)) > 2",
         [(structured("ex3-a", "Cinema", "MOVIE", filterable={"starlist": ["groucho", "chico", "harpo"]}), True),
          (structured("ex3-b", "Cinema", "MOVIE", filterable={"starlist": ["groucho", "margaret"]}), False),
          (structured("ex3-c", "Cinema", "PLAY", filterable={"starlist": ["groucho", "chico", "harpo"]}), False)]),
        ("ex4", "$origination_timestamp.high + 2 > $curtime.high",
         [(structured("ex4-a", variable={"origination_timestamp": tc_time(60)}), True),
          (structured("ex4-b", variable={"origination_timestamp": tc_time(3600)}), False)]),
        ("ex5", "$.test._length == 3 and ($.test[0].score + $.test[1].score + $.test[2].score) / 3 >= 80",
         [(student("s1", 80, 80, 80), True), (student("s2", 100, 100, 39), False), (student("s3", 80, 80), False)]),
        ("ex6", "$.memsize / 5.5 + $.cputime * 1275.0 + $.filesize * 1.25 > 500000.0",
         [(CORBA.Any(E._tc_Proc, E.Proc(0, 400.0, 0)), True),
          (CORBA.Any(E._tc_Proc, E.Proc(1_100_000, 0.0, 0)), False)]),
        ("ex7", "default $._d and $.defvalue == 2",
         [(CORBA.Any(E._tc_DefUnion, E.DefUnion(7, 2)), True), (CORBA.Any(E._tc_DefUnion, E.DefUnion(8, 3)), False),
          (CORBA.Any(E._tc_DefUnion, E.DefUnion(1, "two")), False)]),
        ("ex8", "exist $threshold._type_id and $threshold._type_id == 'short'",
         [(structured("ex8-a", filterable={"threshold": CORBA.Any(CORBA.TC_short, 5)}), True),
          (structured("ex8-b", filterable={"threshold": CORBA.Any(CORBA.TC_long, 5)}), False)]),
        ("ex9", "$._repos_id == 'IDL:omg.org/CosNotification/StructuredEvent:1.0'",
         [(structured("ex9-a"), True), (CORBA.Any(E._tc_Proc, E.Proc(9, 9.0, 9)), False)]),
        ("ex10", "$violation(serviceUser)._repos_id == 'IDL:TelecomNotification/ServiceUserType:1.0'",
         [(structured("ex10-a", filterable={"violation": CORBA.Any(CosNotification._tc_PropertySeq, [
             CosNotification.Property("serviceUser", CORBA.Any(TN._tc_ServiceUserType, TN.ServiceUserType("b")))])}),
           True),
          (structured("ex10-b", filterable={"violation": CORBA.Any(CosNotification._tc_PropertySeq, [
              CosNotification.Property("serviceUser", any_of("b"))])}), False)]),
        ("ex11", "exist $.header.variable_header(required_rights)",
         [(structured("ex11-a", variable={"required_rights": ["read"]}), True),
          (structured("ex11-b", filterable={"required_rights": ["read"]}), False)]),
        ("ex12", "$.\\in == HOUSE or $.\\in == CAR",
         [(CORBA.Any(E._tc_Asset, E.Asset(E.HOUSE, 12)), True), (CORBA.Any(E._tc_Asset, E.Asset(E.BOAT, 12)), False)]),
    ]


# -- helpers ------------------------------------------------------------------------------------------------
def make_channel(factory: Any, qos: list[Any] | None = None) -> Any:
    channel, _ = factory.create_channel(qos or [], [])
    return channel


def new_filter(channel: Any, *constraints: tuple[list[tuple[str, str]], str]) -> Any:
    flt = channel._get_default_filter_factory().create_filter("EXTENDED_TCL")
    flt.add_constraints([CosNotifyFilter.ConstraintExp([CosNotification.EventType(d, t) for d, t in types], expr)
                         for types, expr in constraints])
    return flt


def connect_consumer(admin: Any) -> tuple[Any, StructuredPushConsumer]:
    proxy, _ = admin.obtain_notification_push_supplier(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    consumer = StructuredPushConsumer()
    proxy.connect_structured_push_consumer(consumer._this())
    return proxy, consumer


def suppliers(channel: Any) -> tuple[Any, Any]:
    admin = channel._get_default_supplier_admin()
    sp, _ = admin.obtain_notification_push_consumer(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    sp = sp._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    sp.connect_structured_push_supplier(None)
    ap, _ = admin.obtain_notification_push_consumer(CosNotifyChannelAdmin.ANY_EVENT)
    ap = ap._narrow(CosNotifyChannelAdmin.ProxyPushConsumer)
    ap.connect_any_push_supplier(None)
    return sp, ap


def push(sp: Any, ap: Any, event: Any) -> None:
    if isinstance(event, CORBA.Any):
        ap.push(event)
    else:
        sp.push_structured_event(event)


def received_keys(consumer: StructuredPushConsumer) -> set[str]:
    """Keys of the events ``consumer`` received, the markers of :func:`quiet` left out."""
    return {k for k in (key_of(ev) for ev in consumer.snapshot()) if not k.startswith("quiet-")}


def marker_filter(channel: Any) -> Any:
    """A filter that passes the marker events of :func:`quiet` and nothing else (their own event type)."""
    return new_filter(channel, ([MARKER_TYPE], "TRUE"))


def quiet(sp: Any, *consumers: StructuredPushConsumer, filterable: dict[str, Any] | None = None,
          marker_type: tuple[str, str] = MARKER_TYPE) -> None:
    """Push a marker event after the test's events and wait until each of ``consumers`` received it. A push
    returns once the channel queued the event for every consumer whose filters pass it, and a proxy delivers its
    queue in order (FIFO among equal priorities): an event a consumer should not get would have arrived before the
    marker. The marker must pass the consumers' filters: its own type (:func:`marker_filter`), or
    ``marker_type``/``filterable`` chosen to match them."""
    name = f"quiet-{next(_markers)}"
    sp.push_structured_event(structured(name, *marker_type, filterable=filterable))
    def got(consumer: StructuredPushConsumer) -> Callable[[], bool]:
        return lambda: any(key_of(ev) == name for ev in consumer.snapshot())

    for consumer in consumers:
        assert wait_until(got(consumer), TIMEOUT_S), f"the marker event {name} never arrived"


# -- tests --------------------------------------------------------------------------------------------------
def test_ns_2_4_7_examples_through_filter_objects(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    cases = examples()
    consumers = []
    for _name, expr, _events in cases:
        proxy, consumer = connect_consumer(admin)
        proxy.add_filter(new_filter(channel, ([], expr)))
        proxy.add_filter(marker_filter(channel))                # ORed with the example's: passes only markers
        consumers.append(consumer)
    sp, ap = suppliers(channel)
    for _name, _expr, events in cases:
        for ev, _ in events:
            push(sp, ap, ev)
    for (name, _expr, events), consumer in zip(cases, consumers, strict=True):
        want = {key_of(ev) for ev, ok in events if ok}
        def received_all(c: StructuredPushConsumer = consumer, w: set[str] = want) -> bool:
            return w <= received_keys(c)

        assert wait_until(received_all, TIMEOUT_S), (name, received_keys(consumer))
    quiet(sp, *consumers)
    for (name, expr, events), consumer in zip(cases, consumers, strict=True):
        own = {key_of(ev) for ev, _ in events}                 # other examples' events may match too
        want = {key_of(ev) for ev, ok in events if ok}
        assert received_keys(consumer) & own == want, f"{name}: {expr}"
        assert len(consumer.snapshot()) == len(received_keys(consumer)) + 1, f"{name}: duplicates"   # + marker


def test_event_type_list_is_checked_before_the_expression_with_wildcards(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    proxy, consumer = connect_consumer(channel._get_default_consumer_admin())
    proxy.add_filter(new_filter(channel, ([("Tele*", "Comm*Alarm"), ("Transport", "RoadImpassable")],
                                          "$severity != 4")))
    sp, ap = suppliers(channel)
    def sev(n: int) -> dict[str, Any]:
        return {"severity": CORBA.Any(CORBA.TC_long, n)}

    for ev in (structured("a", "Telecom", "CommunicationsAlarm", filterable=sev(1)),
               structured("b", "Transport", "RoadImpassable", filterable=sev(2)),
               structured("c", "Telecom", "CommunicationsAlarm", filterable=sev(4)),
               structured("d", "Telecom", "QoSAlarm", filterable=sev(1)),
               structured("e", "Other", "CommunicationsAlarm", filterable=sev(1))):
        push(sp, ap, ev)
    assert wait_until(lambda: received_keys(consumer) >= {"a", "b"}, TIMEOUT_S)
    quiet(sp, consumer, marker_type=("Telecom", "CommunicationsAlarm"), filterable=sev(1))
    assert received_keys(consumer) == {"a", "b"}


@pytest.mark.parametrize("op, expected", [(CosNotifyChannelAdmin.AND_OP, {"both"}),
                                          (CosNotifyChannelAdmin.OR_OP, {"both", "admin-only", "proxy-only"})])
def test_admin_and_proxy_filters_combine_with_the_admin_operator(shared_factory: Any, op: Any,
                                                                 expected: set[str]) -> None:
    channel = make_channel(shared_factory)
    admin, _ = channel.new_for_consumers(op)
    admin.add_filter(new_filter(channel, ([], "$a == 1")))
    proxy, consumer = connect_consumer(admin)
    proxy.add_filter(new_filter(channel, ([], "$b == 1")))
    sp, ap = suppliers(channel)
    one, zero = CORBA.Any(CORBA.TC_long, 1), CORBA.Any(CORBA.TC_long, 0)
    for name, a, b in (("both", one, one), ("admin-only", one, zero), ("proxy-only", zero, one),
                       ("neither", zero, zero)):
        push(sp, ap, structured(name, filterable={"a": a, "b": b}))
    assert wait_until(lambda: received_keys(consumer) >= expected, TIMEOUT_S)
    quiet(sp, consumer, marker_type=("Telecom", "CommunicationsAlarm"), filterable={"a": one, "b": one})
    assert received_keys(consumer) == expected


def test_or_over_filters_and_over_constraints_and_supplier_side_filtering(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    proxy, consumer = connect_consumer(channel._get_default_consumer_admin())
    proxy.add_filter(new_filter(channel, ([], "$n == 1"), ([], "$n == 2")))
    proxy.add_filter(new_filter(channel, ([], "$n == 3")))
    sadmin = channel._get_default_supplier_admin()
    sadmin.add_filter(new_filter(channel, ([], "$n != 2")))      # never enters the channel
    sp, ap = suppliers(channel)
    for n in range(5):
        push(sp, ap, structured(f"n{n}", filterable={"n": CORBA.Any(CORBA.TC_long, n)}))
    assert wait_until(lambda: received_keys(consumer) >= {"n1", "n3"}, TIMEOUT_S)
    quiet(sp, consumer, marker_type=("Telecom", "CommunicationsAlarm"),
          filterable={"n": CORBA.Any(CORBA.TC_long, 1)})
    assert received_keys(consumer) == {"n1", "n3"}


def test_constraint_operations_are_atomic_and_report_the_bad_expression(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    flt = new_filter(channel, ([], "$a == 1"))
    bad = CosNotifyFilter.ConstraintExp([], "$a == == 2")
    with pytest.raises(CosNotifyFilter.InvalidConstraint) as info:
        flt.add_constraints([CosNotifyFilter.ConstraintExp([], "$b == 1"), bad])
    assert info.value.constr.constraint_expr == "$a == == 2"
    assert [c.constraint_expression.constraint_expr for c in flt.get_all_constraints()] == ["$a == 1"]
    [first] = flt.get_all_constraints()
    added = flt.add_constraints([CosNotifyFilter.ConstraintExp([], "$c == 3")])
    with pytest.raises(CosNotifyFilter.ConstraintNotFound):
        flt.modify_constraints([999], [])
    with pytest.raises(CosNotifyFilter.InvalidConstraint):
        flt.modify_constraints([first.constraint_id], [CosNotifyFilter.ConstraintInfo(bad, added[0].constraint_id)])
    assert len(flt.get_all_constraints()) == 2                  # nothing deleted by the failed call
    flt.modify_constraints([first.constraint_id], [CosNotifyFilter.ConstraintInfo(
        CosNotifyFilter.ConstraintExp([], "$c == 4"), added[0].constraint_id)])
    [only] = flt.get_all_constraints()
    assert (only.constraint_id, only.constraint_expression.constraint_expr) == (added[0].constraint_id, "$c == 4")
    assert flt._get_constraint_grammar() == "EXTENDED_TCL"
    with pytest.raises(CosNotifyFilter.InvalidGrammar):
        channel._get_default_filter_factory().create_filter("TCL")
    flt.remove_all_constraints()
    assert flt.get_all_constraints() == []


class SubscribeRecorder(CosNotifyComm__POA.NotifySubscribe):
    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, str]], list[tuple[str, str]]]] = []
        self.lock = threading.Lock()

    def subscription_change(self, added: Any, removed: Any) -> None:
        with self.lock:
            self.calls.append(([(t.domain_name, t.type_name) for t in added],
                               [(t.domain_name, t.type_name) for t in removed]))


def test_callbacks_hear_constraint_changes(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    flt = new_filter(channel)
    rec = SubscribeRecorder()
    cb = flt.attach_callback(rec._this())
    assert list(flt.get_callbacks()) == [cb]
    [info] = flt.add_constraints([CosNotifyFilter.ConstraintExp([CosNotification.EventType("D", "T")], "TRUE")])
    assert wait_until(lambda: len(rec.calls) == 1, TIMEOUT_S)
    assert rec.calls[0] == ([("D", "T")], [])
    flt.modify_constraints([info.constraint_id], [])
    assert wait_until(lambda: len(rec.calls) == 2, TIMEOUT_S)
    assert rec.calls[1] == ([], [("D", "T")])
    flt.detach_callback(cb)
    with pytest.raises(CosNotifyFilter.CallbackNotFound):
        flt.detach_callback(cb)
    later = SubscribeRecorder()          # attached after the detach: a filter calls its callbacks in order of their
    flt.attach_callback(later._this())   # ids, one after another, so a call to ``rec`` would come before this one's
    flt.add_constraints([CosNotifyFilter.ConstraintExp([], "TRUE")])
    assert wait_until(lambda: len(later.calls) == 1, TIMEOUT_S)
    assert len(rec.calls) == 2


def test_filters_survive_sigkill_and_restart(nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    channel = make_channel(factory)
    flt = new_filter(channel, ([("Telecom", "*")], "$n >= 5"))
    proxy, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    fid = proxy.add_filter(flt)
    ids = [c.constraint_id for c in flt.get_all_constraints()]
    mf = channel._get_default_filter_factory().create_mapping_filter("EXTENDED_TCL", CORBA.Any(CORBA.TC_short, 0))
    proxy._set_priority_filter(mf)
    nsjms_server.kill(signal.SIGKILL)
    nsjms_server.restart()
    consumer = StructuredPushConsumer()
    after_restart(lambda: proxy.connect_structured_push_consumer(consumer._this()))   # same references
    assert proxy._get_priority_filter()._get_default_value().value() == 0   # mapping reference kept too
    again = proxy.get_filter(fid)
    assert [c.constraint_id for c in again.get_all_constraints()] == ids
    assert [c.constraint_id for c in flt.get_all_constraints()] == ids
    added = flt.add_constraints([CosNotifyFilter.ConstraintExp([], "$n == 1")])
    assert added[0].constraint_id not in ids                    # ids are never reused
    sp, ap = suppliers(channel)
    for n in range(8):
        push(sp, ap, structured(f"n{n}", filterable={"n": CORBA.Any(CORBA.TC_long, n)}))
    want = {"n1", "n5", "n6", "n7"}
    assert wait_until(lambda: received_keys(consumer) >= want, TIMEOUT_S)
    quiet(sp, consumer, marker_type=("Telecom", "CommunicationsAlarm"),
          filterable={"n": CORBA.Any(CORBA.TC_long, 5)})
    assert received_keys(consumer) == want


def test_a_destroyed_filter_no_longer_exists(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    flt = new_filter(channel, ([], "TRUE"))
    flt.destroy()
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        flt.get_all_constraints()


def after_restart(call: Callable[[], Any], attempts: int = 20) -> Any:
    """The first call after a restart may meet the dead connection (COMM_FAILURE) or a not-yet-ready ORB."""
    for _ in range(attempts - 1):
        try:
            return call()
        except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
            time.sleep(0.2)
    return call()


def mapping_filter(channel: Any, default: Any, *pairs: tuple[str, Any]) -> Any:
    mf = channel._get_default_filter_factory().create_mapping_filter("EXTENDED_TCL", default)
    mf.add_mapping_constraints([CosNotifyFilter.MappingConstraintPair(CosNotifyFilter.ConstraintExp([], expr), v)
                                for expr, v in pairs])
    return mf


def names_in_order(consumer: StructuredPushConsumer) -> list[str]:
    return [key_of(ev) for ev in consumer.snapshot()]


def test_priority_mapping_proxy_filter_overrides_admin_filter_and_never_changes_the_event(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    def short(v: int) -> Any:
        return CORBA.Any(CORBA.TC_short, v)

    admin._set_priority_filter(mapping_filter(channel, short(0), ("$n == 1", short(9))))
    plain, by_admin = connect_consumer(admin)
    own, by_own = connect_consumer(admin)
    own._set_priority_filter(mapping_filter(channel, short(0), ("$n == 2", short(9)), ("$n == 1", short(1))))
    plain.suspend_connection()
    own.suspend_connection()
    sp, ap = suppliers(channel)
    for n in range(3):
        push(sp, ap, structured(f"n{n}", filterable={"n": CORBA.Any(CORBA.TC_long, n)}))
    time.sleep(0.5)
    plain.resume_connection()
    own.resume_connection()
    assert wait_until(lambda: len(by_admin.snapshot()) == 3 and len(by_own.snapshot()) == 3, TIMEOUT_S)
    assert names_in_order(by_admin) == ["n1", "n0", "n2"]
    assert names_in_order(by_own) == ["n2", "n1", "n0"]
    for ev in by_admin.snapshot() + by_own.snapshot():
        assert all(p.name != "Priority" for p in ev.header.variable_header), "the event itself is unchanged"
    mf = own._get_priority_filter()
    assert [c.value.value() for c in mf.get_all_mapping_constraints()] == [9, 1]
    with pytest.raises(CosNotifyFilter.InvalidValue):
        mf.add_mapping_constraints([CosNotifyFilter.MappingConstraintPair(
            CosNotifyFilter.ConstraintExp([], "TRUE"), CORBA.Any(CORBA.TC_long, 3))])
    assert mf._get_value_type().equivalent(CORBA.TC_short)
    assert mf._get_default_value().value() == 0


def test_lifetime_mapping_expires_only_that_proxys_copy(shared_factory: Any) -> None:
    channel = make_channel(shared_factory)
    admin = channel._get_default_consumer_admin()
    _, keeps = connect_consumer(admin)
    short_lived, loses = connect_consumer(admin)
    def tt(s: float) -> Any:
        return CORBA.Any(CORBA.TC_ulonglong, int(s * 10_000_000))

    short_lived._set_lifetime_filter(mapping_filter(channel, tt(0), ("$n == 1", tt(0.2))))
    short_lived.suspend_connection()
    sp, ap = suppliers(channel)
    for n in range(3):
        push(sp, ap, structured(f"n{n}", filterable={"n": CORBA.Any(CORBA.TC_long, n)}))
    time.sleep(0.8)
    short_lived.resume_connection()
    assert wait_until(lambda: received_keys(keeps) == {"n0", "n1", "n2"}, TIMEOUT_S)
    assert wait_until(lambda: received_keys(loses) == {"n0", "n2"}, TIMEOUT_S)
    quiet(sp, keeps, loses, marker_type=("Telecom", "CommunicationsAlarm"),
          filterable={"n": CORBA.Any(CORBA.TC_long, 0)})
    assert received_keys(keeps) == {"n0", "n1", "n2"}
    assert received_keys(loses) == {"n0", "n2"}
