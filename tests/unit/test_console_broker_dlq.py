"""The console's pages of the broker's dead-letter queues without a node or broker (router/console/brokerpages.py):
listed beside the channel dead letters, paged, one message shown, retry/discard for the operator only (CSRF, reason),
a selection of message ids. The real broker is in tests/integration/test_broker_dead_letters.py and the browser test.
"""

from __future__ import annotations

from typing import Any

from test_console_app import _csrf, login
from test_console_app import env as env  # the console fixture


def test_the_dead_letters_page_shows_the_broker_queues_beside_the_channel_ones(env: Any) -> None:
    _, client, secrets = env
    login(client, "reader", secrets["reader"])
    page = client.get("/deadletters").get_data(as_text=True)
    assert "dead letter 7" in page                              # the channel's
    assert "nsjms.DLQ</a>:\n60 message(s)" in page and "ActiveMQ.DLQ</a>:\n0 message(s)" in page
    assert page.count("<code>ID:b-") == 5                            # the first rows; the rest on the queue's page
    data = client.get("/deadletters?format=json").get_json()
    assert [b["queue"] for b in data["broker"]] == ["nsjms.DLQ", "ActiveMQ.DLQ"]


def test_a_broker_queue_is_paged_sorted_and_filtered(env: Any) -> None:
    _, client, secrets = env
    login(client, "reader", secrets["reader"])
    data = client.get("/deadletters/broker/nsjms.DLQ?format=json&per_page=25&page=3").get_json()
    assert (data["page"]["total"], data["page"]["pages"], len(data["page"]["rows"])) == (60, 3, 10)
    data = client.get("/deadletters/broker/nsjms.DLQ?format=json&q=expired+59").get_json()
    assert [r["id"] for r in data["page"]["rows"]] == ["ID:b-59:1"]
    assert client.get("/deadletters/broker/other.queue").status_code == 404
    one = client.get("/deadletters/broker/nsjms.DLQ/message?id=ID:b-3:1")
    assert one.status_code == 200 and "expired 3" in one.get_data(as_text=True)
    assert client.get("/deadletters/broker/nsjms.DLQ/message?id=ID:none").status_code == 404


def test_a_reader_has_no_buttons_and_is_refused(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    page = client.get("/deadletters/broker/nsjms.DLQ/message?id=ID:b-3:1").get_data(as_text=True)
    assert 'id="bdl-retry"' not in page and 'id="bdl-discard"' not in page
    listing = client.get("/deadletters/broker/nsjms.DLQ").get_data(as_text=True)
    assert "bdl-selected" not in listing
    token = _csrf(page)
    assert client.post("/deadletters/broker/nsjms.DLQ/retry",
                       data={"csrf": token, "why": "x", "id": "ID:b-3:1"}).status_code == 403
    assert client.post("/deadletters/broker/nsjms.DLQ/selected",
                       data={"csrf": token, "why": "x", "action": "discard", "ids": "ID:b-3:1"}).status_code == 403
    assert not [c for c in backend.calls if c[0] == "broker deadletter"]


def test_an_operator_retries_and_discards_with_csrf_and_a_reason(env: Any) -> None:
    backend, client, secrets = env
    login(client, "operator", secrets["operator"])
    page = client.get("/deadletters/broker/nsjms.DLQ/message?id=ID:b-3:1").get_data(as_text=True)
    assert 'id="bdl-retry"' in page and 'id="bdl-discard"' in page
    token = _csrf(page)
    assert client.post("/deadletters/broker/nsjms.DLQ/retry", data={"why": "x", "id": "ID:b-3:1"}).status_code == 403
    assert client.post("/deadletters/broker/nsjms.DLQ/retry", data={"csrf": token, "id": "ID:b-3:1"}).status_code == 400
    assert client.post("/deadletters/broker/nsjms.DLQ/retry", data={"csrf": token, "why": "x"}).status_code == 400
    assert client.post("/deadletters/broker/nsjms.DLQ/move",
                       data={"csrf": token, "why": "x", "id": "ID:b-3:1"}).status_code == 404
    assert not [c for c in backend.calls if c[0] == "broker deadletter"]
    done = client.post("/deadletters/broker/nsjms.DLQ/retry?format=json",
                       data={"csrf": token, "why": "fixed", "id": "ID:b-3:1"})
    assert done.status_code == 200 and done.get_json()["to"] == "/queue/in"
    gone = client.post("/deadletters/broker/ActiveMQ.DLQ/discard",
                       data={"csrf": token, "why": "old", "id": "ID:gone"})
    assert gone.status_code == 409 and "no message ID:gone" in gone.get_data(as_text=True)
    sel = client.post("/deadletters/broker/nsjms.DLQ/selected?format=json",
                      data={"csrf": token, "why": "bulk", "action": "discard",
                            "ids": ["ID:b-1:1", "ID:gone", "ID:b-1:1"]})
    assert [(r["id"], r["ok"]) for r in sel.get_json()["results"]] == [("ID:b-1:1", True), ("ID:gone", False)]
    assert [c[2:] for c in backend.calls if c[0] == "broker deadletter"] == [
        ("nsjms.DLQ", "ID:b-3:1", "retry", "fixed"), ("ActiveMQ.DLQ", "ID:gone", "discard", "old"),
        ("nsjms.DLQ", "ID:b-1:1", "discard", "bulk"), ("nsjms.DLQ", "ID:gone", "discard", "bulk")]


def test_the_summary_reads_a_bounded_number_and_says_at_least(env: Any, monkeypatch: Any) -> None:
    from router.console import brokerpages

    _, client, secrets = env
    monkeypatch.setattr(brokerpages, "SUMMARY_SCAN", 10)     # a browse carries whole messages: bounded
    login(client, "reader", secrets["reader"])
    page = client.get("/deadletters").get_data(as_text=True)
    assert "nsjms.DLQ</a>:\nat least 10 message(s)" in page and "all of them" in page
