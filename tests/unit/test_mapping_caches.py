"""The per-type caches and fast paths of the NS -> JMS mapping (issue 12, round 4) decide exactly as the slow
paths: a cached decision is never reused for a type that differs, and the fast checks refuse what the slow ones
refused, with the same error."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

from typing import Any

import omniORB
import pytest
from omniORB import CORBA, tcInternal

import CosNotification as N

from router.mapping.stomp_limits import STOMP_MAX_HEADER_LINE, check_stomp_limits
from router.jms.model import Destination
from router.mapping import MappingError, event_to_jms
from router.mapping import idltypes as it
from router.mapping import to_jms
from router.mapping.stomp_body import message_to_stomp


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def _enum(members: list[str]) -> Any:
    items = []
    for value, member in enumerate(members):
        item = omniORB.EnumItem(member, value)
        item._parent_id = "IDL:test/Colour:1.0"
        items.append(item)
    return tcInternal.createTypeCode((tcInternal.tv_enum, "IDL:test/Colour:1.0", "Colour", tuple(items)))


def test_enum_types_differing_in_member_names_only_are_described_each_as_it_is() -> None:
    """omniORB's enum items compare by value, not by name (their hashes do include the name, so only a hash
    collision could mix them up; the cache does not store such descriptors at all): each type keeps its own."""
    first, second = _enum(["RED", "GREEN"]), _enum(["ROUGE", "VERT"])
    assert it.tc_to_desc(first) == ["enum", "IDL:test/Colour:1.0", "Colour", ["RED", "GREEN"]]
    assert it.tc_to_desc(second) == ["enum", "IDL:test/Colour:1.0", "Colour", ["ROUGE", "VERT"]]


def test_bounded_and_unbounded_strings_are_told_apart() -> None:
    assert it.tc_to_desc(CORBA.TC_string) == "string"
    assert it.tc_to_desc(tcInternal.createStringTC(8)) == ["string", 8]
    assert it.tc_to_desc(CORBA.TC_string) == "string"


@pytest.mark.parametrize("value", [0, 2**63, 2**64 - 1])
def test_the_cached_leaf_converter_is_leaf_to_typed(value: int) -> None:
    for tc in (CORBA.TC_ulonglong, CORBA.TC_longlong if value < 2**63 else CORBA.TC_ulonglong):
        assert it.leaf_converter(tc)(value) == it.leaf_to_typed(tc, value)


def _frame_headers(fd: list[Any]) -> dict[str, str]:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), "e"), [])
    event = N.StructuredEvent(header, fd, CORBA.Any(CORBA.TC_string, "x"))
    return message_to_stomp(event_to_jms(event, Destination("queue", "q"), now_ms=1)).headers


def test_a_lone_surrogate_is_still_refused() -> None:
    with pytest.raises(MappingError, match="unpaired surrogate"):
        _frame_headers([N.Property("s", CORBA.Any(CORBA.TC_wstring, "bad \udcff"))])


def test_a_nul_in_a_property_is_still_refused() -> None:
    with pytest.raises(MappingError, match="NUL"):
        _frame_headers([N.Property("s", CORBA.Any(CORBA.TC_string, "a\0b"))])


def test_the_limits_fast_path_refuses_what_the_line_by_line_check_refuses() -> None:
    ok = _frame_headers([N.Property("n", CORBA.Any(CORBA.TC_long, 1))])
    check_stomp_limits(ok)
    with pytest.raises(MappingError, match="non-integer JMSXGroupSeq"):
        check_stomp_limits({**ok, "JMSXGroupSeq": "2147483648"})
    with pytest.raises(MappingError, match="non-integer priority"):
        check_stomp_limits({**ok, "priority": "4x"})
    with pytest.raises(MappingError, match="header line"):
        check_stomp_limits({**ok, "big": "\n" * (STOMP_MAX_HEADER_LINE // 2)})
    check_stomp_limits({**ok, "big": "x" * (STOMP_MAX_HEADER_LINE // 2)})     # long, below the line limit
    check_stomp_limits({**ok, "expires": "-5", "JMSXGroupSeq": "+7"})      # Java parses them: not the fast case
    with pytest.raises(MappingError, match="non-integer expires"):
        check_stomp_limits({**ok, "expires": ""})
    with pytest.raises(MappingError, match="non-integer timestamp"):
        check_stomp_limits({**ok, "timestamp": "12a"})


def _event(fd: list[Any], body: Any, name: str = "e") -> Any:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("D", "T"), name), [])
    return N.StructuredEvent(header, fd, body)


def _cold(event: Any) -> dict[str, str]:
    to_jms._SHAPES.clear()
    return message_to_stomp(event_to_jms(event, Destination("queue", "q"), now_ms=1)).headers


def _warm(event: Any) -> dict[str, str]:
    return message_to_stomp(event_to_jms(event, Destination("queue", "q"), now_ms=1)).headers


def test_an_event_of_a_remembered_shape_still_has_its_values_checked() -> None:
    """Issue 12, round 5: the shape's names and manifest are remembered, never its values' checks."""
    good = _event([N.Property("s", CORBA.Any(CORBA.TC_wstring, "fine"))], CORBA.Any(CORBA.TC_string, "x"))
    _cold(good)
    assert len(to_jms._SHAPES) == 1
    with pytest.raises(MappingError, match="unpaired surrogate") as refused:
        _warm(_event([N.Property("s", CORBA.Any(CORBA.TC_wstring, "bad \udcff"))], CORBA.Any(CORBA.TC_string, "x")))
    assert refused.value.field == "fd:s"
    with pytest.raises(MappingError, match="NUL"):
        _warm(_event([N.Property("s", CORBA.Any(CORBA.TC_wstring, "a\0b"))], CORBA.Any(CORBA.TC_string, "x")))


def test_a_remembered_shape_is_only_reused_for_the_same_names_types_and_order() -> None:
    """Entries that differ only in name, type or order, or a body of another type, give each its own mapping:
    the frame of an event mapped after all the others equals its frame mapped alone (nothing remembered)."""
    long_n, short_n = CORBA.Any(CORBA.TC_long, 7), CORBA.Any(CORBA.TC_short, 7)
    text = CORBA.Any(CORBA.TC_string, "x")
    events = [
        _event([N.Property("n", long_n), N.Property("m", long_n)], text),
        _event([N.Property("m", long_n), N.Property("n", long_n)], text),
        _event([N.Property("n", short_n), N.Property("m", long_n)], text),
        _event([N.Property("n", long_n), N.Property("n", long_n)], text),       # a colliding name: $fd_n_2
        _event([N.Property("n", long_n), N.Property("m", long_n)], CORBA.Any(CORBA.TC_long, 3)),
        _event([N.Property("n", long_n), N.Property("m", long_n)], CORBA.Any(CORBA.TC_null, None)),
    ]
    alone = [_cold(ev) for ev in events]
    to_jms._SHAPES.clear()
    for _ in range(2):
        assert [_warm(ev) for ev in events] == alone
    assert len(to_jms._SHAPES) == len(events)


def test_a_map_body_carries_its_own_entries_in_the_manifest_of_a_remembered_shape() -> None:
    """A map body's manifest entry lists the map's entries (per value): an event of a remembered shape whose map
    differs gets its own manifest, the one it would get alone."""
    def with_map(entries: list[tuple[str, Any]]) -> Any:
        seq = [N.Property(k, v) for k, v in entries]
        return _event([], CORBA.Any(N._tc_PropertySeq, seq))

    first = with_map([("a", CORBA.Any(CORBA.TC_long, 1))])
    second = with_map([("b", CORBA.Any(CORBA.TC_string, "t")), ("c", CORBA.Any(CORBA.TC_double, 0.5))])
    expected = _cold(second)
    to_jms._SHAPES.clear()
    _warm(first)
    assert _warm(second) == expected
    assert '"b"' in expected["$nsjms_idl"]


def test_the_fast_constructors_make_the_dataclasses_objects() -> None:
    """``idltypes.new_typed`` and ``to_jms._message`` (issue 12, round 5) skip the frozen dataclasses' ``__init__``:
    the objects are equal, hash and print alike, hold the same attributes and stay frozen."""
    import dataclasses

    from router.jms.model import BodyType, DeliveryMode, JmsMessage, JmsType, Typed

    for jtype, value in ((JmsType.STRING, "x"), (JmsType.INT, 7), (JmsType.BOOLEAN, True), (JmsType.DOUBLE, 0.5)):
        fast, slow = it.new_typed(jtype, value), Typed(jtype, value)
        assert type(fast) is Typed and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        assert vars(fast) == vars(slow)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.value = "changed"  # type: ignore[misc]
    fields = {"body_type": BodyType.TEXT, "body": "b", "destination": Destination("queue", "q"),
              "delivery_mode": DeliveryMode.NON_PERSISTENT, "priority": 7, "expiration": 9, "timestamp": 3,
              "jms_type": "Structured Event", "properties": {"$a": Typed(JmsType.STRING, "v")}}
    fast_msg, slow_msg = to_jms._message(**fields), JmsMessage(**fields)      # type: ignore[arg-type]
    assert type(fast_msg) is JmsMessage and fast_msg == slow_msg and repr(fast_msg) == repr(slow_msg)
    assert vars(fast_msg) == vars(slow_msg)
    with pytest.raises(TypeError, match="properties"):
        to_jms._message(body_type=BodyType.TEXT)
