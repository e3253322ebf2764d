"""The metric exporter a user turns on in configuration: a real ``nsjms serve`` with ``telemetry.exporter =
prometheus`` serves the node's metrics as Prometheus text on a loopback port, scraped over HTTP."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin

from bridgekit import bridge_factory, channel_ep, jms_ep
from conftest import NsjmsServer, free_port
from stdclients import (
    Form,
    PushSupplierClient,
    Style,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def metrics_server(tmp_path: Path, fresh_db: str, broker_url: str,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[NsjmsServer, int]]:
    scrape_port = free_port()
    monkeypatch.setenv("NSJMS_TELEMETRY_EXPORTER", "prometheus")
    monkeypatch.setenv("NSJMS_TELEMETRY_ADDRESS", f"127.0.0.1:{scrape_port}")
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
    server.start()
    try:
        yield server, scrape_port
    finally:
        server.stop()


def scrape_until(port: int, wanted: str, timeout: float = 30.0) -> str:
    """GET /metrics until ``wanted`` appears in it (the exporter starts right after endpoints.json)."""
    deadline = time.monotonic() + timeout
    text, error = "", ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text, error = str(resp.read().decode()), ""
            if wanted in text:
                return text
        except (urllib.error.URLError, ConnectionError) as exc:
            error = str(exc)
        time.sleep(0.2)
    raise AssertionError(f"{wanted!r} not scraped within {timeout:.0f} s (last error {error!r}); got:\n{text[-3000:]}")


def test_node_metrics_are_scraped_over_loopback(metrics_server: tuple[NsjmsServer, int], client_orb: Any) -> None:
    server, port = metrics_server
    scrape_until(port, "")  # serving (an empty page until some instrument has a value)
    factory = client_orb.factory(server.ior())
    channel, _ = factory.create_channel([], [])
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PUSH)
    text = scrape_until(port, "nsjms_queue_depth")  # a gauge registered at start, read at each scrape
    [line] = [x for x in text.splitlines() if x.startswith("nsjms_queue_depth{")]
    assert line.endswith(" 0.0") and 'nsjms_channel="' in line
    assert 'service_name="node1"' in text  # target_info: the resource names the node
    text = scrape_until(port, "nsjms_t2_in_doubt")  # the status loop feeds the T2 gauges every 2 s
    text = scrape_until(port, "nsjms_t2_recovery_passes_total")  # a periodic recovery pass (every 5 s)
    values = {x.split("{")[0]: float(x.split(" ")[-1]) for x in text.splitlines() if x.startswith("nsjms_t2_")}
    assert values["nsjms_t2_in_doubt"] == 0 and values["nsjms_t2_in_doubt_oldest_age_seconds"] == 0
    assert values["nsjms_t2_outbox_depth"] == 0 and values["nsjms_t2_inbox_depth"] == 0
    assert values["nsjms_t2_recovery_passes_total"] >= 1
    assert 'nsjms_t2_recovery_passes_total{nsjms_t2_recovery_result="clean"' in text
    text = scrape_until(port, "nsjms_cluster_lease_renew_seconds_count")   # the lease, renewed every 2 s
    [count] = [x for x in text.splitlines() if x.startswith("nsjms_cluster_lease_renew_seconds_count")]
    assert float(count.split(" ")[-1]) >= 1


def test_routing_transactions_are_counted_and_timed(metrics_server: tuple[NsjmsServer, int], client_orb: Any) -> None:
    """Channel -> JMS in T2 (a bridge with enable_transaction): committed T2s appear in the outcome counter and the
    duration histogram, with seconds-sized buckets."""
    server, port = metrics_server
    persistent = short(CosNotification.Persistent)
    factory = client_orb.factory(server.ior())
    channel, cid = factory.create_channel([prop("EventReliability", persistent),
                                           prop("ConnectionReliability", persistent)], [])
    bridge, _ = bridge_factory(client_orb, server).create_bridge(channel_ep(BA.SOURCE, cid),
                                                                 jms_ep(BA.SINK, f"metrics.{free_port()}"))
    bridge._narrow(NsjmsAdmin.ManagedBridge).enable_transaction(5, 30)
    bridge.start_bridge()
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    for i in range(10):
        supplier.push_one(make_event(i, reliability=CosNotification.Persistent))
    text = scrape_until(port, 'nsjms_t2_transactions_total{nsjms_t2_outcome="committed"')
    [line] = [x for x in text.splitlines() if x.startswith("nsjms_t2_transactions_total{") and "committed" in x]
    assert float(line.split(" ")[-1]) >= 1
    assert 'nsjms_t2_duration_seconds_bucket{le="0.02",nsjms_t2_outcome="committed"' in text
