"""Event type lists of a constraint (NS 2.3, 2.6.6): '*' wildcards, '%ALL', empty list."""

from __future__ import annotations

import pytest

import omniORB  # noqa: F401

import CosNotification as N

from router.etcl import event_type_matches
from router.etcl.eventtype import wildcard_match


def types(*pairs: tuple[str, str]) -> list[object]:
    return [N.EventType(d, t) for d, t in pairs]


@pytest.mark.parametrize("patterns, domain, type_name, expected", [
    ([], "Telecom", "CommunicationsAlarm", True),
    ([("", "")], "Any", "Thing", True),
    ([("*", "*")], "Any", "Thing", True),
    ([("", "%ALL")], "Any", "Thing", True),
    ([("*", "%ALL")], "Any", "Thing", True),
    ([("Telecom", "%ALL")], "Telecom", "X", True),
    ([("Telecom", "%ALL")], "Transport", "X", False),
    ([("Telecom", "CommunicationsAlarm")], "Telecom", "CommunicationsAlarm", True),
    ([("Telecom", "CommunicationsAlarm")], "Telecom", "QoSAlarm", False),
    ([("Telecom", "CommunicationsAlarm")], "telecom", "CommunicationsAlarm", False),
    ([("Tele*", "*Alarm")], "Telecom", "QoSAlarm", True),
    ([("*com", "Comm*Alarm")], "Telecom", "CommunicationsAlarm", True),
    ([("T*l*m", "*")], "Telecom", "x", True),
    ([("T*l*m", "*")], "Tm", "x", False),
    ([("*a*a*", "*")], "aa", "x", True),
    ([("*a*a*", "*")], "a", "x", False),
    ([("Telecom", "Comm?")], "Telecom", "CommX", False),       # only '*' is special
    ([("Telecom", "Comm?")], "Telecom", "Comm?", True),
    ([("", "%ANY")], "", "%ANY", True),
    ([("", "%ANY")], "Telecom", "%ANY", False),
    ([("A", "x"), ("Transport", "RoadImpassable")], "Transport", "RoadImpassable", True),
    ([("A", "x"), ("Transport", "RoadImpassable")], "Transport", "RoadOpen", False),
])
def test_event_type_matches(patterns: list[tuple[str, str]], domain: str, type_name: str,
                            expected: bool) -> None:
    assert event_type_matches(types(*patterns), domain, type_name) is expected


@pytest.mark.parametrize("pattern, text, expected", [
    ("ab*ab", "abab", True), ("ab*ab", "aba", False), ("*", "", True), ("a*", "", False),
    ("**", "x", True), ("a*b*c", "abc", True), ("a*b*c", "acb", False), (".*", "x", False),
])
def test_wildcard_match(pattern: str, text: str, expected: bool) -> None:
    assert wildcard_match(pattern, text) is expected
