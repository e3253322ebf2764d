"""Hostile input to the mapping (issue 7): nothing but the mapping's own errors, never RecursionError or a crash,
never a STOMP header that splits a frame, never an event the channel cannot encode."""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import base64
import json
import struct
import subprocess
import sys
from typing import Any

import omniORB
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omniORB import CORBA

import CosNotification as N

from router.jms.model import BodyType, Destination, JmsMessage, JmsType, Typed
from router.mapping import MappingError, event_to_jms, jms_to_event
from router.mapping import limits
from router.mapping.stomp_body import message_from_stomp, message_to_stomp
from router.mapping.times import ChannelTimeSupport
from router.mapping.to_event import CODESET_MINORS

NOW = 1_700_000_000_000
DEST = Destination("queue", "q")
P = N.Property


@pytest.fixture(autouse=True, scope="module")
def orb() -> Any:
    return CORBA.ORB_init([], CORBA.ORB_ID)


def nsjms_message(manifest: object, body_type: BodyType = BodyType.MESSAGE, body: object = None,
                  props: dict[str, Typed] | None = None) -> JmsMessage:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    base = {"$domain_name": Typed(JmsType.STRING, "d"), "$type_name": Typed(JmsType.STRING, "t"),
            "$event_name": Typed(JmsType.STRING, "e"), "$nsjms_idl": Typed(JmsType.STRING, text)}
    return JmsMessage(body_type, body, DEST, jms_type="Structured Event", properties={**base, **(props or {})})


def manifest(fd: list[Any], body: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"v": 1, "ohf": [], "fd": fd, "body": body or {"k": "none", "tc": "null"}}


def nested_any_seq_cdr(depth: int) -> bytes:
    """CDR encapsulation of an Any holding ``depth`` nested ``sequence<any>`` of one element each (16 bytes a
    level), built by hand: building it with omniORB would itself recurse that deep."""
    def u32(x: int) -> bytes:
        return struct.pack(">I", x)
    encaps = b"\x00\x00\x00\x00" + u32(CORBA.tk_any._v) + u32(0)
    seq_tc = u32(CORBA.tk_sequence._v) + u32(len(encaps)) + encaps
    return b"\x00\x00\x00\x00" + (seq_tc + u32(1)) * depth + u32(CORBA.tk_long._v) + u32(1)


# ------------------------------------------------------------------------------------------------ nesting
def test_a_deeply_nested_manifest_is_a_mapping_error_not_recursion_error() -> None:
    """Before: RecursionError out of json.loads / desc_to_tc, and the message stayed unacknowledged."""
    with pytest.raises(MappingError):
        jms_to_event(nsjms_message("[" * 100_000 + "]" * 100_000), now_ms=NOW)
    deep_json = manifest([["x", json.loads("[" * 500 + "]" * 500), ["$fd_x"]]])
    with pytest.raises(MappingError):
        jms_to_event(nsjms_message(deep_json, props={"$fd_x": Typed(JmsType.INT, 1)}), now_ms=NOW)


def test_a_deeply_nested_type_descriptor_is_a_mapping_error() -> None:
    desc: Any = "long"
    for i in range(limits.MAX_TYPE_DEPTH + 5):             # well within the JSON bound, beyond the type bound
        desc = ["alias", f"IDL:a{i}:1.0", f"a{i}", desc]
    msg = nsjms_message(manifest([["x", desc, ["$fd_x"]]]), props={"$fd_x": Typed(JmsType.INT, 1)})
    with pytest.raises(MappingError) as info:
        jms_to_event(msg, now_ms=NOW)
    assert "nested deeper" in info.value.reason


def test_types_nested_within_the_bound_still_round_trip() -> None:
    desc: Any = "long"
    for i in range(20):
        desc = ["alias", f"IDL:a{i}:1.0", f"a{i}", desc]
    msg = nsjms_message(manifest([["x", desc, ["$fd_x"]]]), props={"$fd_x": Typed(JmsType.INT, 7)})
    assert jms_to_event(msg, now_ms=NOW).filterable_data[0].value.value() == 7


_DEEP_CDR_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from omniORB import CORBA
CORBA.ORB_init([], CORBA.ORB_ID)
from tests.unit.test_mapping_hostile import nested_any_seq_cdr, nsjms_message, manifest, NOW
from router.jms.model import BodyType, JmsType, Typed
from router.mapping import MappingError, jms_to_event
import base64
blob = nested_any_seq_cdr({depth})
cases = [nsjms_message(manifest([], {{"k": "cdr"}}), BodyType.BYTES, blob),
         nsjms_message(manifest([["x", "cdr", ["$fd_x"]]]), props={{"$fd_x": Typed(JmsType.STRING,
                       base64.b64encode(blob).decode())}})]
for msg in cases:
    try:
        jms_to_event(msg, now_ms=NOW)
        print("mapped")
    except MappingError as exc:
        print("MappingError", exc.reason)
"""


def test_a_deeply_nested_cdr_value_is_refused_without_crashing_the_process() -> None:
    """Before: omniORB's unmarshalling recursed on the C stack and a 100,000-level nested Any (1.6 MB) killed the
    whole node with SIGSEGV. Run in a child process, so a crash fails this test instead of the test run."""
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    script = _DEEP_CDR_SCRIPT.format(root=root, depth=100_000)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root,
                          check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("MappingError") for line in lines), done.stdout
    assert "nested deeper" in lines[0]


def test_nesting_within_the_bound_is_decoded() -> None:
    msg = nsjms_message(manifest([], {"k": "cdr"}), BodyType.BYTES, nested_any_seq_cdr(50))
    body = jms_to_event(msg, now_ms=NOW).remainder_of_body
    for _ in range(50):
        body = body.value()[0]
    assert body.value() == 1


def test_cdr_above_the_size_bound_is_refused_both_ways() -> None:
    msg = nsjms_message(manifest([], {"k": "cdr"}), BodyType.BYTES, b"\x00" * (limits.MAX_CDR_BYTES + 1))
    with pytest.raises(MappingError) as info:
        jms_to_event(msg, now_ms=NOW)
    assert "exceeds" in info.value.reason
    big = CORBA.Any(CORBA._tc_AnySeq, [CORBA.Any(CORBA._tc_OctetSeq, b"x" * (limits.MAX_CDR_BYTES + 1))])
    ev = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("", ""), ""), []), [], big)
    with pytest.raises(MappingError):
        event_to_jms(ev, DEST, now_ms=NOW)


def test_a_deeply_nested_map_or_stream_body_is_a_mapping_error() -> None:
    """Before: RecursionError from json.loads (or from str() of a nested value) in the STOMP body decoder."""
    deep = "[" * 100_000 + "]" * 100_000
    for headers, body in (({"transformation": "jms-map-json"}, deep), ({"nsjms_body": "stream"}, deep),
                          ({"transformation": "jms-map-json"},
                           '{"map":{"entry":[{"string":"k","int":' + "[" * 900 + "]" * 900 + "}]}}")):
        with pytest.raises(MappingError):
            message_from_stomp(headers, body.encode())


def test_non_ascii_base64_in_a_map_body_is_a_mapping_error() -> None:
    """Before: ValueError from base64 (a str with non-ASCII characters is not binascii.Error)."""
    body = json.dumps({"map": {"entry": [{"string": "k", "byte-array": "é"}]}}).encode()
    with pytest.raises(MappingError):
        message_from_stomp({"transformation": "jms-map-json"}, body)


# ------------------------------------------------------------------------------------------------ NUL and IDL
@pytest.mark.parametrize("fd, destination", [
    ([P("note", CORBA.Any(CORBA.TC_string, "a\x00b"))], DEST),
    ([P("JMSCorrelationID", CORBA.Any(CORBA.TC_string, "c\x00"))], DEST),
    ([P("e", CORBA.Any(CORBA.TC_wstring, "\x00"))], DEST),
    ([], Destination("queue", "q\x00x"))])
def test_a_nul_in_a_header_value_is_refused_before_it_splits_a_frame(fd: list[Any], destination: Destination) -> None:
    """Before: the NUL went into a STOMP header, which ends the frame there."""
    ev = N.StructuredEvent(N.EventHeader(N.FixedEventHeader(N.EventType("d", "t"), "e"), []), fd,
                           CORBA.Any(CORBA.TC_null, None))
    with pytest.raises(MappingError):
        message_to_stomp(event_to_jms(ev, destination, now_ms=NOW))


@pytest.mark.parametrize("msg", [
    JmsMessage(BodyType.TEXT, "a\x00b", DEST),
    JmsMessage(BodyType.TEXT, "x", DEST, properties={"p": Typed(JmsType.STRING, "\x00")}),
    JmsMessage(BodyType.TEXT, "x", DEST, properties={"p\x00": Typed(JmsType.STRING, "v")}),
    JmsMessage(BodyType.TEXT, "x", DEST, correlation_id="c\x00"),
    JmsMessage(BodyType.MAP, {"k\x00": Typed(JmsType.INT, 1)}, DEST),
    JmsMessage(BodyType.STREAM, [Typed(JmsType.CHAR, "\x00")], DEST),
    JmsMessage(BodyType.TEXT, "x", Destination("queue", "q\x00"))])
def test_text_an_idl_string_cannot_hold_is_a_mapping_error(msg: JmsMessage) -> None:
    """Before: the event was made, and the channel then failed to CDR-encode it (BAD_PARAM, embedded NUL)."""
    with pytest.raises(MappingError):
        jms_to_event(msg, now_ms=NOW)


@pytest.mark.parametrize("desc, value", [
    (["string", 3], Typed(JmsType.STRING, "too long")),
    (["sequence", 1, "long"], None),
    ("long", None),                 # a stream body whose type is no sequence (found by the fuzz: BadKind)
    ("string", Typed(JmsType.STRING, "a\x00"))])
def test_a_manifest_describing_values_its_types_cannot_hold_is_a_mapping_error(desc: Any, value: Any) -> None:
    if value is None:       # in the body: a bounded sequence overrun, or no sequence type at all
        msg = nsjms_message(manifest([], {"k": "stream", "tc": desc}), BodyType.STREAM,
                            [Typed(JmsType.INT, 1), Typed(JmsType.INT, 2)])
    else:
        msg = nsjms_message(manifest([["x", desc, ["$fd_x"]]]), props={"$fd_x": value})
    with pytest.raises(MappingError):
        jms_to_event(msg, now_ms=NOW)


# ------------------------------------------------------------------------------------------------ fuzz
_HEADER_NAMES = ["destination", "message-id", "persistent", "priority", "expires", "timestamp", "type",
                 "correlation-id", "reply-to", "redelivered", "content-length", "amq-msg-type", "transformation",
                 "nsjms_types", "nsjms_body", "nsjms_delivery_time", "JMSXDeliveryCount", "JMSXGroupSeq",
                 "$domain_name", "$type_name", "$event_name", "$body_encoding", "$fd_x", "$ohf_Priority", "p"]
_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["true", "false", "-1", "0", "9", "10", "1700000000000", "99999999999999999999999", "NaN",
                     "/queue/x", "/topic/", "/temp-queue/a", "jms-map-json", "stream", "object", "none", "bytes",
                     "text", "Structured Event", "p=int", "p=char", "$fd_x=double", "z:eJwDAAAAAAE=", "-0", "1e400"]),
    st.integers(-(2**70), 2**70).map(str))
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4), max_leaves=20)
_DESCS = st.recursive(
    st.sampled_from(["long", "string", "wstring", "char", "wchar", "octet", "boolean", "double", "float",
                     "ulonglong", "any", "null", "void", "cdr", "tc:", "tc:AAAA"]) | _JSON,
    lambda inner: st.one_of(
        st.tuples(st.just("alias"), st.text(max_size=5), st.text(max_size=5), inner).map(list),
        st.tuples(st.just("struct"), st.text(max_size=5), st.text(max_size=5),
                  st.lists(st.tuples(st.text(max_size=3), inner).map(list), max_size=3)).map(list),
        st.tuples(st.just("enum"), st.text(max_size=5), st.text(max_size=5),
                  st.lists(st.text(max_size=3), max_size=3)).map(list),
        st.tuples(st.sampled_from(["sequence", "array", "string", "wstring"]), st.integers(-2, 2**33),
                  inner).map(list)), max_leaves=6)
_RECORDS = st.lists(st.tuples(st.text(max_size=4), _DESCS,
                              st.lists(st.sampled_from(["$fd_x", "p", "$ohf_Priority", "q"]), max_size=3)).map(list),
                    max_size=3)
_MANIFESTS = st.one_of(
    _JSON.map(json.dumps),
    st.builds(lambda ohf, fd, body: json.dumps({"v": 1, "ohf": ohf, "fd": fd, "body": body}), _RECORDS, _RECORDS,
              st.one_of(st.fixed_dictionaries({"k": st.sampled_from(["none", "text", "bytes", "value", "stream",
                                                                     "map", "cdr", "x"]),
                                               "tc": _DESCS, "e": _JSON}), _JSON)))
_BODIES = st.one_of(st.binary(max_size=40), _JSON.map(lambda j: json.dumps(j).encode()),
                    st.sampled_from([b'{"map":{"entry":[{"string":"k","int":"5"},{"string":["s","v"]}]}}',
                                     b'[{"int":1},{"char":"\\u0000"},{"byte-array":"AA=="}]', b"",
                                     b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x01"]))


def assert_encodable(event: Any) -> None:
    """Whatever is mapped, the channel can store (CDR-encode); only the codeset limits of this test ORB (started
    without -ORBnativeCharCodeSet UTF-8; docs/mapping.md deviation 10) are tolerated."""
    try:
        omniORB.cdrMarshal(N._tc_StructuredEvent, event)
    except CORBA.DATA_CONVERSION:
        pass
    except CORBA.MARSHAL as exc:
        assert exc.minor in CODESET_MINORS, exc


_TYPED = st.builds(Typed, st.sampled_from(list(JmsType)),
                   st.one_of(st.integers(-(2**1100), 2**1100), st.text(max_size=4), st.floats(), st.booleans(),
                             st.binary(max_size=4)))


def _frame_headers(base: dict[str, str], manifest_text: str | None) -> dict[str, str]:
    headers = dict(base)
    if manifest_text is not None:
        headers.update({"type": "Structured Event", "$nsjms_idl": manifest_text, "$domain_name": "d",
                        "$type_name": "t", "$event_name": "e"})
    return headers


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.one_of(st.sampled_from(_HEADER_NAMES), st.text(max_size=8)), _VALUES, max_size=12),
       st.one_of(st.none(), _MANIFESTS), _BODIES, st.booleans(), st.booleans())
def test_arbitrary_frames_raise_only_mapping_errors(base: dict[str, str], manifest_text: str | None, body: bytes,
                                                    stop: bool, start: bool) -> None:
    headers = _frame_headers(base, manifest_text)
    try:
        msg = message_from_stomp(headers, body)
        event = jms_to_event(msg, now_ms=NOW, times=ChannelTimeSupport(stop, start))
    except MappingError:
        return
    assert_encodable(event)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_MANIFESTS, st.dictionaries(st.sampled_from(["$fd_x", "p", "$ohf_Priority", "q"]),
                                   st.builds(Typed, st.sampled_from(list(JmsType)),
                                             st.one_of(st.text(max_size=6), st.integers(-(2**70), 2**70),
                                                       st.floats(), st.booleans(), st.binary(max_size=6))),
                                   max_size=4),
       st.sampled_from(list(BodyType)), st.one_of(st.none(), st.text(max_size=5), st.binary(max_size=8),
                                                  st.lists(_TYPED, max_size=3),
                                                  st.dictionaries(st.sampled_from(["", "k", "x"]), _TYPED,
                                                                  max_size=3)))
def test_arbitrary_manifests_and_properties_raise_only_mapping_errors(manifest_text: str, props: dict[str, Typed],
                                                                      body_type: BodyType, body: object) -> None:
    msg = nsjms_message(manifest_text, body_type, body, props)
    try:
        event = jms_to_event(msg, now_ms=NOW)
    except MappingError:
        return
    assert_encodable(event)


def test_the_fuzz_oracle_can_fail() -> None:
    """The fuzz tests only count MappingError as an expected outcome: anything else propagates."""
    with pytest.raises(RecursionError):
        json.loads("[" * 100_000)
    assert base64.b64encode(b"x")


@pytest.mark.parametrize("entries", [[1], [["k"]], [[["k"], "long"]], "k"])
def test_malformed_map_entry_descriptors_are_mapping_errors(entries: Any) -> None:
    """Before: TypeError/ValueError unpacking the manifest's map entries."""
    msg = nsjms_message(manifest([], {"k": "map", "tc": "null", "e": entries}), BodyType.MAP,
                        {"k": Typed(JmsType.INT, 1)})
    with pytest.raises(MappingError):
        jms_to_event(msg, now_ms=NOW)


def test_an_int_too_big_for_a_double_property_is_a_mapping_error() -> None:
    """Before: the event was made and the channel then failed to encode the double."""
    msg = JmsMessage(BodyType.TEXT, "x", DEST, properties={"d": Typed(JmsType.DOUBLE, 2**1100)})
    with pytest.raises(MappingError):
        jms_to_event(msg, now_ms=NOW)


def test_a_plain_manifest_above_the_bound_is_refused_before_parsing() -> None:
    text = json.dumps(manifest([["x", "long", ["$fd_x"]]] * 300_000))
    assert len(text) > 4 * 1024 * 1024
    with pytest.raises(MappingError) as info:
        jms_to_event(nsjms_message(text), now_ms=NOW)
    assert "4 MiB" in info.value.reason
