"""``size_bound`` never under-estimates an event's CDR encoding, so the channel's size limit stays exact.

The channel no longer encodes every BestEffort event to check ``max_event_bytes``: it accepts an event whose bound
is within the limit and encodes the others. That is only as strong as the bound, so generated events (strings with
any Unicode, every primitive kind, sequences, structs, nested anys) are compared with the real encoder.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA, tcInternal

import CosNotification as N

from router.channel import channel as C
from router.channel.boundary import MINOR_EVENT_TOO_LARGE
from router.channel.channel import EventChannelImpl
from router.channel.events import Event, Form, decode, encode
from router.channel.groupcommit import GroupCommit
from router.channel.queue import Record
from router.channel.sizing import size_bound
from router.channel.store import NewEvent
from router.db.testing import NullDatabase


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init(["test", "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)  # as the node


text = st.text(max_size=40)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", max_size=12)

_INT_KINDS = [(CORBA.TC_short, -2**15, 2**15 - 1), (CORBA.TC_ushort, 0, 2**16 - 1), (CORBA.TC_long, -2**31, 2**31 - 1),
              (CORBA.TC_ulong, 0, 2**32 - 1), (CORBA.TC_longlong, -2**63, 2**63 - 1),
              (CORBA.TC_ulonglong, 0, 2**64 - 1)]


def _primitive() -> st.SearchStrategy[Any]:
    ints = [st.integers(lo, hi).map(functools.partial(CORBA.Any, tc)) for tc, lo, hi in _INT_KINDS]
    return st.one_of(
        *ints,
        st.floats(allow_nan=False, width=32).map(lambda v: CORBA.Any(CORBA.TC_float, v)),
        st.floats(allow_nan=False).map(lambda v: CORBA.Any(CORBA.TC_double, v)),
        st.booleans().map(lambda v: CORBA.Any(CORBA.TC_boolean, v)),
        st.binary(min_size=1, max_size=1).map(lambda v: CORBA.Any(CORBA.TC_octet, v[0])),
        st.characters(max_codepoint=127).map(lambda v: CORBA.Any(CORBA.TC_char, v)),
        text.map(lambda v: CORBA.Any(CORBA.TC_string, v)),
        text.map(lambda v: CORBA.Any(CORBA.TC_wstring, v)),
        st.just(CORBA.Any(CORBA.TC_null, None)),
    )


def _composite(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    seq = tcInternal.createSequenceTC
    return st.one_of(
        inner.map(lambda v: CORBA.Any(CORBA.TC_any, v)),                                       # nested any
        st.lists(st.floats(allow_nan=False), max_size=20).map(
            lambda v: CORBA.Any(seq(0, CORBA.TC_double), v)),
        st.binary(max_size=50).map(lambda v: CORBA.Any(CORBA._tc_OctetSeq, v)),
        st.lists(text, max_size=5).map(lambda v: CORBA.Any(seq(0, CORBA.TC_string), v)),
        st.lists(st.tuples(names, inner), max_size=4).map(
            lambda v: CORBA.Any(N._tc_PropertySeq, [N.Property(n, a) for n, a in v])),         # struct, alias
        st.tuples(text, text).map(lambda v: CORBA.Any(N._tc_EventType, N.EventType(*v))),
    )


anys = st.recursive(_primitive(), _composite, max_leaves=8)
props = st.lists(st.tuples(names, anys).map(lambda t: N.Property(*t)), max_size=4)


@st.composite
def structured(draw: st.DrawFn) -> Event:
    header = N.EventHeader(N.FixedEventHeader(N.EventType(draw(text), draw(text)), draw(text)), draw(props))
    return Event(Form.STRUCTURED, N.StructuredEvent(header, draw(props), draw(anys)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(structured(), anys.map(lambda a: Event(Form.ANY, a))))
def test_the_bound_is_never_below_the_encoding(event: Event) -> None:
    try:
        real = len(encode(event))
    except (CORBA.DATA_CONVERSION, CORBA.BAD_PARAM, CORBA.MARSHAL):
        return                          # not encodable with this ORB's code sets: the channel encodes it (refused)
    bound = size_bound(event)
    assert bound is not None, "these shapes are modelled"
    assert bound >= real


def test_shapes_it_does_not_model_answer_none() -> None:
    """An object reference (or any other unmodelled kind) makes the caller encode the event."""
    nil = CORBA.Any(CORBA.TypeCode("IDL:omg.org/CORBA/Object:1.0"), None)
    assert size_bound(Event(Form.ANY, nil)) is None


def test_a_typical_event_is_bounded_tightly_enough() -> None:
    """1 KB of ASCII text in the body: the bound is at most 4 x the text plus the header (a 64 KiB limit is far)."""
    header = N.EventHeader(N.FixedEventHeader(N.EventType("Bench", "Event"), "e1"), [])
    ev = Event(Form.STRUCTURED, N.StructuredEvent(header, [N.Property("n", CORBA.Any(CORBA.TC_long, 1))],
                                                  CORBA.Any(CORBA.TC_string, "x" * 1000)))
    real, bound = len(encode(ev)), size_bound(ev)
    assert bound is not None and real <= bound <= 4 * real + 200


# -- the channel's check (EventChannelImpl._sizes_checked via route) ----------------------------------------------
class _NoLedger:
    def records(self, *, persistent: bool) -> bool:
        return False


class _Store:
    ledger = _NoLedger()

    def __init__(self) -> None:
        self.rows: list[NewEvent] = []

    def insert_events(self, conn: object, cid: int, rows: list[NewEvent], **_: object) -> list[int]:
        self.rows.extend(rows)
        return list(range(len(self.rows) - len(rows), len(self.rows)))


class _Rt:
    def __init__(self, limit: int) -> None:
        self.store, self.db, self.max_event_bytes, self._seq = _Store(), NullDatabase(), limit, 0
        self.accept_commits = GroupCommit(self.db, self.store)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq


class _Proxy:
    def __init__(self) -> None:
        self.id, self.admin = 1, type("Admin", (), {"id": 0})()
        self.records: list[Record] = []

    def enqueue(self, rec: Record) -> None:
        self.records.append(rec)


class _Source:
    oid = "ch/0/S/0/1"

    @staticmethod
    def admits(event: Any) -> bool:
        return True


def _channel(limit: int, persistent: bool) -> tuple[Any, _Proxy]:
    proxy = _Proxy()
    ch: Any = object.__new__(EventChannelImpl)
    ch.id, ch.rt, ch.destroyed = 0, _Rt(limit), False
    ch.qos, ch.admin_props = {}, {}
    ch.records, ch._records_lock = {}, threading.Lock()
    ch.consumer_admins = {0: type("Admin", (), {"proxies": {1: proxy}, "targets_for": lambda self, ev: [proxy]})()}
    ch._make_record = lambda source, ev, now: Record(ch.rt.next_seq(), ev, 0, None, None, persistent,
                                                     on_released=lambda r: None)
    return ch, proxy


def _event(text_len: int) -> Event:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), "e"), [])
    return Event(Form.STRUCTURED, N.StructuredEvent(header, [], CORBA.Any(CORBA.TC_string, "x" * text_len)))


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, event: Event) -> bytes:
        self.calls += 1
        return encode(event)


def test_a_best_effort_event_within_its_bound_is_not_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting()
    monkeypatch.setattr(C, "encode", counting)
    ch, proxy = _channel(64 * 1024, persistent=False)
    ch.route(_Source(), [_event(1000)] * 10)
    assert counting.calls == 0                          # before: one encoding per event
    assert len(proxy.records) == 10
    assert all(len(encode(r.event)) <= r.size for r in proxy.records), "the size kept is an upper bound"


def test_the_limit_is_exact_where_the_bound_is_not_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting()
    monkeypatch.setattr(C, "encode", counting)
    small, big = _event(1900), _event(2100)
    limit = len(encode(small)) + 50                     # small fits (its bound does not), big does not
    assert size_bound(small) is not None and size_bound(small) > limit  # type: ignore[operator]
    ch, proxy = _channel(limit, persistent=False)
    ch.route(_Source(), [small])
    assert counting.calls == 1 and proxy.records[0].size == len(encode(small))
    with pytest.raises(CORBA.IMP_LIMIT) as refused:
        ch.route(_Source(), [small, big])               # a sequence push holding one event above the limit
    assert refused.value.minor == MINOR_EVENT_TOO_LARGE and refused.value.completed == CORBA.COMPLETED_NO
    assert len(proxy.records) == 1, "nothing of the refused push is queued"


def test_a_persistent_event_is_encoded_once_and_stored_with_its_exact_size(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting()
    monkeypatch.setattr(C, "encode", counting)
    ch, proxy = _channel(64 * 1024, persistent=True)
    ev = _event(1000)
    ch.route(_Source(), [ev])
    assert counting.calls == 1
    body = ch.rt.store.rows[0].body
    assert len(body) == len(encode(ev))         # (CDR padding bytes are not defined: compare sizes and content)
    stored: Any = decode(Form.STRUCTURED, body).value
    assert stored.remainder_of_body.value() == "x" * 1000
    assert proxy.records[0].size == len(encode(ev)) and proxy.records[0].db_id == 0
