"""Bridge endpoint validation (NJI Table 2-1), factory profiles, IDL round trip, CLI endpoint parsing."""

from __future__ import annotations

import pytest

from router.bridge.endpoints import EndpointSpec, check_pair, from_idl, parse_factory, to_idl
from router.cli.bridge import UsageError, parse_endpoint

CHANNELS = {0, 7}


def exists(cid: int) -> bool:
    return cid in CHANNELS


def chan(role: str, cid: int = 0, style: str = "PUSH", kind: str = "STRUCTURED_EVENT") -> EndpointSpec:
    return EndpointSpec(role, kind, style, channel_id=cid)


def jms(role: str, name: str = "alarms", style: str = "PUSH", dtype: str = "QUEUE", factory: str = "") -> EndpointSpec:
    return EndpointSpec(role, "JMS_MESSAGE", style, destination_type=dtype, destination_name=name,
                        factory_name=factory)


def codes(problems) -> list[tuple[str, str]]:
    return [(p.role, p.code) for p in problems]


@pytest.mark.parametrize("source,sink", [
    (chan("SOURCE", style="PUSH"), jms("SINK")),
    (chan("SOURCE", style="PULL"), jms("SINK")),
    (chan("SOURCE", kind="SEQUENCE_EVENT"), jms("SINK", dtype="TOPIC")),
    (jms("SOURCE", style="PUSH"), chan("SINK", style="PUSH")),
    (jms("SOURCE", style="PULL"), chan("SINK", style="PUSH")),
    (jms("SOURCE", style="PUSH"), chan("SINK", style="PULL")),
    (jms("SOURCE", style="PULL"), chan("SINK", 7, style="PULL", kind="SEQUENCE_EVENT")),
])
def test_supported_combinations(source, sink):
    assert check_pair(source, sink, exists) == []


def test_jms_sink_cannot_be_pulled():
    assert codes(check_pair(chan("SOURCE"), jms("SINK", style="PULL"), exists)) == [
        ("SINK", "MISMATCH_ENDPOINTROLE_NOTIFSTYLE")]


def test_unknown_channel_and_bad_destination_are_both_reported():
    assert codes(check_pair(chan("SOURCE", 99), jms("SINK", name="bad name!"), exists)) == [
        ("SOURCE", "INVALID_CHANNELID"), ("SINK", "INVALID_JMSDESTINATION")]


def test_roles_in_the_wrong_positions():
    assert codes(check_pair(jms("SINK"), chan("SOURCE"), exists)) == [
        ("SINK", "MISMATCH_ENDPOINTROLE_NOTIFSTYLE"), ("SOURCE", "MISMATCH_ENDPOINTROLE_NOTIFSTYLE")]


def test_two_channels_or_two_destinations():
    assert codes(check_pair(chan("SOURCE"), chan("SINK", 7), exists)) == [
        ("SOURCE", "INVALID_CHANNELID"), ("SINK", "INVALID_CHANNELID")]
    assert codes(check_pair(jms("SOURCE"), jms("SINK", "b"), exists)) == [
        ("SOURCE", "INVALID_JMSDESTINATION"), ("SINK", "INVALID_JMSDESTINATION")]


@pytest.mark.parametrize("name", ["", " ", "a/b", "a\nb", "x" * 201, "-leading"])
def test_destination_names(name):
    assert codes(check_pair(chan("SOURCE"), jms("SINK", name=name), exists)) == [("SINK", "INVALID_JMSDESTINATION")]


def test_channel_endpoint_carrying_a_destination():
    odd = EndpointSpec("SINK", "STRUCTURED_EVENT", "PUSH", destination_type="QUEUE", destination_name="q")
    assert codes(check_pair(jms("SOURCE"), odd, exists)) == [("SINK", "INVALID_CHANNELID")]


def test_factory_profiles():
    assert parse_factory("").transformation is None
    assert parse_factory("default").transformation is None
    assert parse_factory("jms-json").transformation == "jms-json"
    p = parse_factory("default;selector=severity = 'major' AND n > 3")
    assert p.selector == "severity = 'major' AND n > 3" and p.transformation is None
    for bad in ("jms-xml", "default;filter=x", "default;selector=", "default;selector=a\nb"):
        with pytest.raises(ValueError):
            parse_factory(bad)
    assert codes(check_pair(jms("SOURCE", factory="nope"), chan("SINK"), exists)) == [
        ("SOURCE", "INVALID_JMSDESTINATION")]


def test_a_selector_the_broker_would_reject_is_refused_at_create():
    """Issue 29: `--factory "default;selector=region = "` gave a bridge shown [active] while the broker answered
    every subscription with an ERROR frame."""
    with pytest.raises(ValueError, match="invalid JMS selector 'region =': expected an identifier, a literal"):
        parse_factory("default;selector=region = ")
    problems = check_pair(jms("SOURCE", factory="default;selector=region = "), chan("SINK"), exists)
    assert codes(problems) == [("SOURCE", "INVALID_JMSDESTINATION")]
    assert parse_factory("default;selector=region = ", check_selector_syntax=False).selector == "region ="


@pytest.mark.parametrize("spec", [chan("SOURCE", 7, "PULL", "SEQUENCE_EVENT"),
                                  jms("SINK", "a.b-c", dtype="TOPIC", factory="jms-json")])
def test_idl_round_trip(spec):
    import omniORB  # noqa: F401

    assert from_idl(to_idl(spec)) == spec


def test_cli_endpoint_parsing():
    assert parse_endpoint("channel:3", "--from") == ("channel", "3")
    assert parse_endpoint("topic:a.b", "--to") == ("topic", "a.b")
    for bad in ("channel:x", "chan:1", "queue:", "alarms"):
        with pytest.raises(UsageError, match="--to"):
            parse_endpoint(bad, "--to")


def test_connection_reliability_table_2_3() -> None:
    """NJI Table 2-3: BestEffort has no point-to-point counterpart; a queue needs a Persistent channel."""
    persistent = {7}.__contains__
    assert codes(check_pair(chan("SOURCE", 0), jms("SINK"), exists, persistent)) == [
        ("SINK", "INVALID_JMSDESTINATION")]
    assert codes(check_pair(jms("SOURCE", style="PULL"), chan("SINK", 0), exists, persistent)) == [
        ("SOURCE", "INVALID_JMSDESTINATION")]
    assert check_pair(chan("SOURCE", 0), jms("SINK", dtype="TOPIC"), exists, persistent) == []
    assert check_pair(jms("SOURCE", dtype="TOPIC"), chan("SINK", 0), exists, persistent) == []
    assert check_pair(chan("SOURCE", 7), jms("SINK"), exists, persistent) == []
    assert check_pair(jms("SOURCE"), chan("SINK", 7), exists, persistent) == []
