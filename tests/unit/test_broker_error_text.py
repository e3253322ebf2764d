"""Issue 29: `last error: broker: broker error: …:` ended with an empty reason when the broker refused."""

from __future__ import annotations

import pytest

from router.jms.transport import BrokerError


@pytest.mark.parametrize(("message", "body", "text"), [
    ("javax.jms.InvalidSelectorException: ", "Invalid selector 'region =': syntax error at end\n\tat org...",
     "broker error: javax.jms.InvalidSelectorException: Invalid selector 'region =': syntax error at end"),
    ("", "\n  the real reason\nmore", "broker error: the real reason"),
    ("Refused:", "", "broker error: Refused"),
    ("", "", "broker error: (no reason given)"),
    ("User name [x] or password is invalid.", "stack", "broker error: User name [x] or password is invalid."),
])
def test_a_broker_error_always_names_a_reason(message: str, body: str, text: str) -> None:
    assert str(BrokerError(message, body)) == text
