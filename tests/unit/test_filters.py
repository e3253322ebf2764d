"""Filter and MappingFilter servants without services (fake runtime and repository), and the ack bookkeeping."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest

import omniORB
from omniORB import CORBA

import CosNotification
import CosNotifyFilter

from router.channel.ack import SN_LIMIT, AckState, next_sn, sequence_number_of, with_sequence_number
from router.channel.common import FilterSet
from router.channel.events import Event, Form
from router.channel.filters import ChannelFilterFactory, FilterFactoryImpl, FilterImpl, MappingFilterImpl, types_for
from router.channel.queue import Entry, Record
from router.cluster.forward import filter_channel, object_of
from router.routing.registry import LocalEndpoints


class FakeRepo:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.fail = False
        self._next = 0

    def migrate(self) -> None:
        pass

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def insert(self, fid: int, kind: str, grammar: str, default: str | None) -> None:
        self.rows[fid] = {"kind": kind, "grammar": grammar, "default": default}

    def save(self, fid: int, next_cid: int, constraints: list[Any], callbacks: dict[str, str], next_cb: int) -> None:
        if self.fail:
            raise RuntimeError("database down")
        self.rows[fid].update(next_cid=next_cid, constraints=constraints, callbacks=callbacks, next_cb=next_cb)

    def delete(self, fid: int) -> None:
        self.rows.pop(fid, None)

    def load(self, channels: Any = None) -> list[tuple[Any, ...]]:
        """As FilterRepo.load, with every channel still existing: those of ``channels`` and the node-level ones."""
        return [(fid, r["kind"], r["grammar"], r["default"], r.get("next_cid", 1), r.get("constraints", []),
                 r.get("callbacks", {}), r.get("next_cb", 1)) for fid, r in sorted(self.rows.items())
                if channels is None or filter_channel(fid) in {None, *channels}]


class FakeRt:
    """Activation is a no-op; spawned work runs at once; callbacks are local servants."""

    def __init__(self) -> None:
        self.db = None
        self.objects: dict[str, Any] = {}

    def activate(self, oid: str, servant: Any) -> Any:
        self.objects[oid] = servant
        return oid

    def deactivate(self, oid: str) -> None:
        self.objects.pop(oid, None)

    def ior(self, ref: Any) -> str:
        return f"IOR:{id(ref)}"

    def resolve(self, ior: str) -> Any:
        raise AssertionError("not used")

    endpoints = LocalEndpoints(lambda ref: ref)      # every callback reference is a local servant

    def spawn(self, name: str, fn: Any) -> None:
        fn()


@pytest.fixture(scope="module", autouse=True)
def orb() -> Any:
    return CORBA.ORB_init(["test"], CORBA.ORB_ID)      # CDR encapsulation of mapping values needs an ORB


@pytest.fixture
def factory(monkeypatch: pytest.MonkeyPatch) -> FilterFactoryImpl:
    monkeypatch.setattr("router.channel.filters.FilterRepo", lambda store: FakeRepo())
    f = FilterFactoryImpl(FakeRt())
    f.activate()
    return f


def exp(expr: str, *types: tuple[str, str]) -> Any:
    return CosNotifyFilter.ConstraintExp([CosNotification.EventType(d, t) for d, t in types], expr)


def event(domain: str = "Telecom", type_name: str = "CommunicationsAlarm", **fd: int) -> Any:
    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType(domain, type_name), "e"), [])
    return CosNotification.StructuredEvent(
        header, [CosNotification.Property(k, CORBA.Any(CORBA.TC_long, v)) for k, v in fd.items()],
        CORBA.Any(CORBA.TC_null, None))


def new_filter(factory: FilterFactoryImpl) -> FilterImpl:
    factory.create_filter("EXTENDED_TCL")
    return max(factory.filters.values(), key=lambda f: f.id)  # type: ignore[return-value]


def test_grammar_must_be_extended_tcl(factory: FilterFactoryImpl) -> None:
    with pytest.raises(CosNotifyFilter.InvalidGrammar):
        factory.create_filter("TCL")


def test_add_is_all_or_nothing_and_reports_the_unchanged_expression(factory: FilterFactoryImpl,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nsjms.filter")
    flt = new_filter(factory)
    flt.add_constraints([exp("$a == 1")])
    bad = exp("$a ==  == 2")
    with pytest.raises(CosNotifyFilter.InvalidConstraint) as info:
        flt.add_constraints([exp("$b == 1"), bad])
    assert info.value.constr is bad and info.value.constr.constraint_expr == "$a ==  == 2"
    assert "at position 7" in caplog.text                         # 0-based offset of the second '=='

    assert [c.constraint_expression.constraint_expr for c in flt.get_all_constraints()] == ["$a == 1"]


def test_a_failed_store_leaves_the_filter_unchanged(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    flt.add_constraints([exp("$a == 1")])
    factory.repo.fail = True  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError):
        flt.add_constraints([exp("$a == 2")])
    assert len(flt.get_all_constraints()) == 1
    assert flt.match_structured(event(a=2)) is False


def test_ids_are_unique_and_modify_is_atomic(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    a, b = flt.add_constraints([exp("$a == 1"), exp("$a == 2")])
    assert a.constraint_id != b.constraint_id
    with pytest.raises(CosNotifyFilter.ConstraintNotFound):
        flt.modify_constraints([a.constraint_id, 99], [])
    with pytest.raises(CosNotifyFilter.ConstraintNotFound):
        flt.get_constraints([99])
    flt.modify_constraints([a.constraint_id], [CosNotifyFilter.ConstraintInfo(exp("$a == 3"), b.constraint_id)])
    [only] = flt.get_all_constraints()
    assert (only.constraint_id, only.constraint_expression.constraint_expr) == (b.constraint_id, "$a == 3")
    [c] = flt.add_constraints([exp("TRUE")])
    assert c.constraint_id > b.constraint_id                      # never reused


def test_match_is_or_over_constraints_and_types_are_checked_first(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    assert flt.match_structured(event()) is False                # no constraints: nothing matches
    flt.add_constraints([exp("TRUE", ("Tele*", "*Alarm")), exp("$a == 1")])
    assert flt.match_structured(event()) is True
    assert flt.match_structured(event("Road", "Closed")) is False
    assert flt.match_structured(event("Road", "Closed", a=1)) is True
    assert flt.match(CORBA.Any(CORBA.TC_long, 5)) is False
    flt.add_constraints([exp("$ == 5", ("", "%ANY"))])
    assert flt.match(CORBA.Any(CORBA.TC_long, 5)) is True


def test_callbacks_get_added_and_removed_types(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    calls: list[tuple[list[Any], list[Any]]] = []

    class Cb:
        def subscription_change(self, added: Any, removed: Any) -> None:
            calls.append(([(t.domain_name, t.type_name) for t in added],
                          [(t.domain_name, t.type_name) for t in removed]))

    cb = flt.attach_callback(Cb())
    [_info] = flt.add_constraints([exp("TRUE", ("D", "T"))])
    flt.remove_all_constraints()
    assert calls == [([("D", "T")], []), ([], [("D", "T")])]
    flt.detach_callback(cb)
    with pytest.raises(CosNotifyFilter.CallbackNotFound):
        flt.detach_callback(cb)
    assert flt.get_callbacks() == []


def test_types_for_reports_all_types_as_percent_all() -> None:
    from router.channel.filters import compile_exp

    cs = [compile_exp(exp("TRUE"), 1), compile_exp(exp("TRUE", ("*", "*")), 2), compile_exp(exp("TRUE", ("A", "B")), 3)]
    assert [(t.domain_name, t.type_name) for t in types_for(cs)] == [("", "%ALL"), ("A", "B")]


def short(v: int) -> Any:
    return CORBA.Any(CORBA.TC_short, v)


def test_mapping_filter_best_value_first_default_and_invalid_value(factory: FilterFactoryImpl) -> None:
    factory.create_mapping_filter("EXTENDED_TCL", short(-1))
    mf = max(factory.filters.values(), key=lambda f: f.id)
    assert isinstance(mf, MappingFilterImpl)
    mf.add_mapping_constraints([CosNotifyFilter.MappingConstraintPair(exp("$a >= 1"), short(3)),
                                CosNotifyFilter.MappingConstraintPair(exp("$a >= 5"), short(7))])
    ok, v = mf.match_structured(event(a=9))
    assert ok and v.value() == 7                                 # both match: the best value wins
    ok, v = mf.match_structured(event(a=2))
    assert ok and v.value() == 3
    ok, v = mf.match_structured(event(a=0))
    assert not ok and v.value() == -1
    with pytest.raises(CosNotifyFilter.InvalidValue):
        mf.add_mapping_constraints([CosNotifyFilter.MappingConstraintPair(exp("TRUE"), CORBA.Any(CORBA.TC_long, 1))])
    assert len(mf.get_all_mapping_constraints()) == 2


def test_restore_gives_the_same_constraints_ids_and_values(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    flt.add_constraints([exp("$a == 1", ("D", "T*"))])
    factory.create_mapping_filter("EXTENDED_TCL", short(0))
    mf = max(factory.filters.values(), key=lambda f: f.id)
    assert isinstance(mf, MappingFilterImpl)
    mf.add_mapping_constraints([CosNotifyFilter.MappingConstraintPair(exp("$a == 1"), short(4))])
    again = FilterFactoryImpl(factory.rt)
    again.repo = factory.repo
    again.restore()
    f2, m2 = again.filters[flt.id], again.filters[mf.id]
    assert isinstance(f2, FilterImpl) and isinstance(m2, MappingFilterImpl)
    assert [(c.constraint_id, c.constraint_expression.constraint_expr) for c in f2.get_all_constraints()] == \
        [(c.constraint_id, c.constraint_expression.constraint_expr) for c in flt.get_all_constraints()]
    assert f2.match_structured(event("D", "Tx", a=1)) is True
    ok, v = m2.match_structured(event(a=1))
    assert ok and v.value() == 4 and m2._get_value_type().equivalent(CORBA.TC_short)


def test_destroyed_filter_raises_object_not_exist(factory: FilterFactoryImpl) -> None:
    flt = new_filter(factory)
    flt.destroy()
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        flt.match_structured(event())
    assert flt.id not in factory.filters


# -- acknowledgement bookkeeping ----------------------------------------------------------------------------
def test_sequence_numbers_wrap_after_2_31_minus_1() -> None:
    assert next_sn(0) == 1 and next_sn(SN_LIMIT - 1) == SN_LIMIT and next_sn(SN_LIMIT) == 0


def entry(db_id: int | None, seq: int = 1) -> Entry:
    rec = Record(seq, Event(Form.STRUCTURED, event()), 0, None, None, True, db_id)
    rec.hold()
    return Entry(rec, (0, seq))


def test_ack_state_inflight_overdue_acknowledge_and_reload() -> None:
    state = AckState(next=SN_LIMIT)
    p1 = state.open([entry(10)], now=100.0)
    p2 = state.open([entry(11), entry(12)], now=101.0)
    assert (p1.sn, p2.sn) == (SN_LIMIT, 0)
    assert [p.sn for p in state.overdue(101.5, 1.0)] == [SN_LIMIT]
    saved = state.to_json()
    assert saved["inflight"] == {str(SN_LIMIT): [10], "0": [11, 12]} and saved["next"] == 1
    state.retry_count = 2
    done = state.acknowledge([SN_LIMIT, SN_LIMIT, 77])              # duplicates and unknown numbers are harmless
    assert [e.record.db_id for e in done] == [10] and state.retry_count == 0
    reloaded = AckState.load(state.to_json())
    assert reloaded.next == 1 and reloaded.restored == {11: 0, 12: 0}
    assert reloaded.adopt(entry(11)) and reloaded.adopt(entry(12)) and not reloaded.adopt(entry(13))
    [p] = reloaded.overdue(1.0, 1.0)                               # restored: due at once
    assert p.sn == 0 and [e.record.db_id for e in p.entries] == [11, 12]


def test_sequence_number_header_is_added_to_a_copy() -> None:
    ev = event()
    ev.header.variable_header.append(CosNotification.Property("SequenceNumber", CORBA.Any(CORBA.TC_long, 99)))
    out = with_sequence_number(ev, 5)
    assert sequence_number_of(out) == 5
    assert sequence_number_of(ev) == 99                           # the original is never modified
    assert [p.name for p in out.header.variable_header] == ["SequenceNumber"]


def test_exhausted_retries_stop_the_connection_report_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.channel import ack as ack_mod
    from router.channel.ack import ConnectionStatusImpl, _AckSupplierMixin

    added: list[tuple[int, dict[str, Any]]] = []

    class Counter:
        def add(self, n: int, attrs: dict[str, Any]) -> None:
            added.append((n, attrs))

    monkeypatch.setattr(ack_mod, "_stopped_counter", lambda: Counter())

    class Proxy(_AckSupplierMixin):
        oid = "ch/0/C/0/1"
        qos: ClassVar[dict[str, int]] = {"Retries": 2, "RetryInterval": 1}
        extra: ClassVar[dict[str, Any]] = {}
        suspended, connected = False, True

        def __init__(self) -> None:
            self.rt = type("Rt", (), {"connection_status": ConnectionStatusImpl()})()
            self.channel = type("Ch", (), {"id": 0})()
            self.saved: list[Any] = []
            self._init_ack()

        def save_extra(self, **kw: Any) -> None:
            self.saved.append(kw)

        def _wake(self) -> None: ...

        def _check_alive(self) -> None: ...

        def _check_open(self) -> None: ...

    p = Proxy()
    assert p._count_retry() and p._count_retry()
    assert not p._count_retry()                                    # the third retry is one too many
    assert p.ack.stopped and p.saved[-1]["ack"]["stopped"] == p.ack.stopped
    assert list(p.rt.connection_status.stopped) == [p.oid]
    assert added == [(1, {"nsjms.channel": 0, "nsjms.proxy": p.oid})]
    p._count_retry()
    assert len(added) == 1                                         # reported once
    assert "STOPPED" in p.status_extra()
    p.resume_connection()                                          # the operator's reset
    assert not p.ack.stopped and p.ack.retry_count == 0 and p.rt.connection_status.stopped == {}


def _etcl_support() -> Any:
    """The ETCL tests' IDL helper (real generated unions), loaded by path as the ETCL tests do."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "etcl_test_support"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("test_etcl_support.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_a_union_arm_is_selected_by_its_enum_label(factory: FilterFactoryImpl) -> None:
    """``$.(CAR)`` is a valid constraint (it was refused as InvalidConstraint) and selects the arm."""
    support = _etcl_support()
    etcl, _ = support.load_idl()
    flt = new_filter(factory)
    flt.add_constraints([exp("$.remainder_of_body.(CAR) == 4"), exp("$.remainder_of_body.(BOAT) == 'dock'")])

    def carrying(value: Any) -> Any:
        tc = omniORB.findTypeCode(value._NP_RepositoryId)
        return support.structured(remainder=CORBA.Any(tc, value))

    assert flt.match_structured(carrying(etcl.ByKindDef(etcl.CAR, 4))) is False   # CAR is the default arm
    assert flt.match_structured(carrying(etcl.ByKind(etcl.CAR, 4))) is True
    assert flt.match_structured(carrying(etcl.ByKind(etcl.CAR, 5))) is False
    assert flt.match_structured(carrying(etcl.ByKindDef(etcl.BOAT, "dock"))) is True
    assert flt.match_structured(carrying(etcl.ByKindDef(etcl.HOUSE, "dock"))) is True   # same arm
    assert flt.match_structured(carrying(etcl.ByKindDef(etcl.HOUSE, "shed"))) is False


def test_a_channel_factory_makes_filters_of_its_channel_which_move_with_it(factory: FilterFactoryImpl) -> None:
    """docs/cluster.md, "CORBA addressing": a filter made by channel 7's default_filter_factory carries the
    channel in its id (its requests are forwarded to the channel's owner); a node adopting channel 7 loads it as
    it is now; the node that gave channel 7 away retires it (deactivated; who held the servant asks the
    reference)."""
    seven, eight = ChannelFilterFactory(factory, 7), ChannelFilterFactory(factory, 8)
    seven.create_filter("EXTENDED_TCL")
    f7 = max(factory.filters.values(), key=lambda f: f.id)
    assert filter_channel(f7.id) == 7 and object_of(f7.oid) == ("channel", 7)
    f7.add_constraints([exp("$a == 1")])
    eight.create_mapping_filter("EXTENDED_TCL", short(0))
    m8 = max(factory.filters.values(), key=lambda f: f.id)
    assert filter_channel(m8.id) == 8 and isinstance(m8, MappingFilterImpl)
    factory.create_filter("EXTENDED_TCL")                # the node-level factory's: no channel, no owner
    legacy = next(f for f in factory.filters.values() if f not in (f7, m8))
    assert filter_channel(legacy.id) is None and object_of(legacy.oid) is None

    other = FilterFactoryImpl(FakeRt())                  # another node, started before these were made
    other.repo = factory.repo
    assert sorted(other.restore([7])) == sorted([f7.id, legacy.id]), "channel 7's and the channel-less ones"
    assert other.filters[f7.id].match_structured(event(a=1)) is True
    assert other.restore([7, 8]) == [m8.id], "what is active already is kept"

    assert factory.retire(7) == [f7.id]
    assert f7.retired and f7.id not in factory.filters and f7.oid not in factory.rt.objects
    assert legacy.oid in factory.rt.objects and m8.oid in factory.rt.objects


def test_a_filter_set_asks_the_reference_once_the_servant_retired() -> None:
    """An admin or proxy that evaluated a filter in process stops asking that servant once it is retired (its
    channel moved): it asks the reference, which reaches the node serving the filter now."""
    class Servant:
        retired = False

    servant, ref = Servant(), object()
    fs = FilterSet(lambda ior: type("R", (), {"_narrow": lambda self, t: ref})(), {"1": "IOR:x"},
                   local=lambda r: servant)
    assert fs.targets() == [servant]
    servant.retired = True
    fs._local = lambda r: None
    assert fs.targets() == [ref]
