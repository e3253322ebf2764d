"""A topic bridge's durable subscription moves with the bridge (docs/cluster.md, "JMS side across nodes").

JMS -> channel from a *topic* into a Persistent channel is a durable subscription (NJI Table 2-3): the pair (client
id, subscription name) on the broker. Node ``na`` owns the bridge; it is killed (SIGKILL) and 10 messages are
published to the topic while it is dead; the survivor ``nb`` takes the bridge over and must get them: before, it
subscribed under a client id named after itself, a new subscription that had not existed when they were published,
and the old one kept them on the broker forever. Then ``nb``, the owner now, is paused (SIGSTOP) past its lease with
the subscription's connection open; ``na`` (restarted, a new member) takes the bridge back, its connect under the
same client id refused until the broker drops the paused connection for its missed heart-beats, and gets what was
published during the pause and after; ``nb`` woken stops (fenced). Counted: every message exactly one event in
the channel (one inbox row each, 30 in all), every one at a standard-stub push consumer, none lost; the consumer may
get twice only an event the failed node had pushed to it (the delivered-events journals stay on the failed node's
disk: docs/cluster.md, "Duplicates").
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    inbox_count,
    jms_ep,
    node_status,
    persistent_channel,
    prepared_count,
    stomp_produce,
    structured_consumer,
    unique_name,
)
from clusterkit import EXPIRY_S, numbers, rows, start_nodes, stop_nodes
from conftest import ClientOrb, NsjmsServer
from stdclients import wait_until

pytestmark = pytest.mark.integration


def _all(consumer: Any, n: int) -> bool:
    """Every number below ``n`` reached ``consumer`` (a count would be reached early by duplicates)."""
    return set(numbers(consumer.snapshot())) >= set(range(n))


def _twice(numbers: list[int]) -> set[int]:
    return {n for n in numbers if numbers.count(n) > 1}


def _owner(dsn: str, bid: int) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT node_id FROM nsjms_owner WHERE kind = 'bridge' AND object_id = %s",
                           (bid,)).fetchone()
    return None if row is None else str(row[0])


def _took_over(server: NsjmsServer, dead: str) -> bool:
    return any(t["node_id"] == dead and t["started"]
               for t in node_status(server).get("cluster", {}).get("takeovers", []))


def test_a_topic_bridge_resumes_its_durable_subscription_on_the_node_that_takes_it_over(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb) -> None:
    a, b = start_nodes(tmp_path, ["na", "nb"], fresh_db, broker_url)
    try:
        [(token,)] = rows(fresh_db, "SELECT incarnation FROM nsjms_member WHERE node_id = 'na'")
        named = rows(fresh_db, "SELECT DISTINCT application_name FROM pg_stat_activity "
                               "WHERE application_name LIKE %s", "nsjms/na/%")
        assert named == [(f"nsjms/na/{token}",)], f"the node's sessions carry its incarnation: {named} {token}"
        channel, cid = persistent_channel(client_orb.factory(a.ior()))
        consumer = structured_consumer(channel)          # its reference is stored with the proxy: called back
        topic = unique_name("cluster.topic")
        bridge, bid = bridge_factory(client_orb, a).create_bridge(jms_ep(BA.SOURCE, topic, BA.TOPIC),
                                                                  channel_ep(BA.SINK, cid))
        bridge.start_bridge()                            # returns once subscribed (durable: a Persistent channel)
        stomp_produce(broker_url, topic, range(10), kind="topic")
        assert consumer.wait_for(10, 60), consumer.count()

        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)
        assert a.proc.wait(timeout=60) != 0
        died = time.monotonic()
        stomp_produce(broker_url, topic, range(10, 20), kind="topic")     # the owner is dead: kept for it
        assert wait_until(lambda: _took_over(b, "na"), 60), node_status(b).get("cluster")
        stomp_produce(broker_url, topic, range(20, 25), kind="topic")
        assert wait_until(lambda: _all(consumer, 25), 90), sorted(numbers(consumer.snapshot()))
        print(f"\nSIGKILL: nb routed the 15 messages of the takeover {time.monotonic() - died:.1f} s after na died")
        got = numbers(consumer.snapshot())
        assert set(got) == set(range(25)), "what was published to the topic while its owner was dead is routed"
        assert wait_until(lambda: inbox_count(fresh_db, bid) == 25, 30), inbox_count(fresh_db, bid)
        assert _twice(got) <= set(range(10)), \
            f"only events the dead node had pushed come twice (its delivered-events journal): {_twice(got)}"
        assert _owner(fresh_db, bid) == "nb"
        before_pause = set(got)

        a, = start_nodes(tmp_path, ["na"], fresh_db, broker_url)          # back, as a new member
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)               # nb holds the subscription's connection, silent
        paused = time.monotonic()
        try:
            stomp_produce(broker_url, topic, range(25, 28), kind="topic")
            assert wait_until(lambda: _took_over(a, "nb"), 60), node_status(a).get("cluster")
            stomp_produce(broker_url, topic, range(28, 30), kind="topic")
            assert wait_until(lambda: _all(consumer, 30), 120), sorted(numbers(consumer.snapshot()))
            print(f"SIGSTOP: na routed the 5 messages of the takeover {time.monotonic() - paused:.1f} s after nb "
                  f"was paused (lease expiry {EXPIRY_S} s; the broker drops a silent STOMP connection after its "
                  f"missed heart-beats)")
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert b.proc.wait(timeout=60) == 1, "the woken node learns it was fenced and stops (exit 1)"
        assert _owner(fresh_db, bid) == "na"
        got = numbers(consumer.snapshot())
        assert set(got) == set(range(30))
        assert inbox_count(fresh_db, bid) == 30, "each message published is exactly one event in the channel"
        assert _twice(got) <= before_pause, f"only events pushed before a failure come twice: {_twice(got)}"
        print(f"events at the consumer {len(got)}, distinct 30, twice {sorted(_twice(got))}")
        assert wait_until(lambda: prepared_count(fresh_db) == 0, 30)
    finally:
        stop_nodes([a, b])
