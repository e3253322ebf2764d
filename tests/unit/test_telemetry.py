"""router.telemetry against the OpenTelemetry SDK's in-memory reader and exporter."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router import telemetry


@pytest.fixture(scope="module")
def sdk() -> Any:
    """Global providers can be set once per process; this module owns them."""
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    trace.set_tracer_provider(tp)
    telemetry._Instruments.reset()
    return reader, spans


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    out: list[Any] = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out.extend(m.data.data_points)
    return out


def test_counters_carry_their_attributes(sdk: Any) -> None:
    reader, _ = sdk
    telemetry.accepted(3, 5, True)
    telemetry.accepted(3, 2, False)
    telemetry.rejected(3, 1, "BAD_QOS")
    telemetry.bridge_moved(7, 4, "to_jms")
    telemetry.bridge_dead_letter(7, "event")
    acc = {(p.attributes[telemetry.A.PERSISTENT]): p.value for p in points(reader, "nsjms.events.accepted")}
    assert acc == {True: 5, False: 2}
    [rej] = points(reader, "nsjms.events.rejected")
    assert rej.value == 1 and rej.attributes[telemetry.A.REASON] == "BAD_QOS"
    [moved] = points(reader, "nsjms.bridge.messages")
    assert moved.value == 4 and moved.attributes[telemetry.A.DIRECTION] == "to_jms"
    [dead] = points(reader, "nsjms.bridge.dead_letters")
    assert dead.attributes == {telemetry.A.BRIDGE: 7, telemetry.A.REASON: "event"}


def test_forward_span_and_duration(sdk: Any) -> None:
    reader, spans = sdk
    with telemetry.forward_span(9, 100):
        pass
    [span] = [s for s in spans.get_finished_spans() if s.name == "nsjms.bridge.forward"]
    assert span.attributes[telemetry.A.BATCH] == 100 and span.attributes[telemetry.A.BRIDGE] == 9
    [hist] = points(reader, "nsjms.bridge.forward.duration")
    assert hist.count == 1 and hist.sum >= 0
    assert tuple(hist.explicit_bounds) == telemetry.SECONDS_BUCKETS  # seconds, not the SDK's ms-style default


def test_span_records_a_failed_forward(sdk: Any) -> None:
    _, spans = sdk
    with pytest.raises(RuntimeError), telemetry.forward_span(10, 1):
        raise RuntimeError("broker gone")
    [span] = [s for s in spans.get_finished_spans() if s.attributes.get(telemetry.A.BRIDGE) == 10]
    assert not span.status.is_ok


def test_gauges_read_live_values(sdk: Any) -> None:
    reader, _ = sdk
    depth = {"n": 3}
    telemetry.register_gauges(lambda: [(1, "ch/1/C/0/0", depth["n"])], lambda: [(2, True)])
    assert [p.value for p in points(reader, "nsjms.queue.depth")] == [3]
    depth["n"] = 8
    assert [p.value for p in points(reader, "nsjms.queue.depth")] == [8]
    assert [p.value for p in points(reader, "nsjms.bridge.active")] == [1]


def test_configure_none_installs_nothing() -> None:
    assert telemetry.configure("none", 30)() is None


def test_cluster_instruments(sdk: Any) -> None:
    reader, _ = sdk
    telemetry.cluster_takeover("n1")
    telemetry.cluster_lease_renewed(0.004)
    telemetry.cluster_fenced_write("unit_of_work")
    telemetry.cluster_fenced_write("decision")
    telemetry.cluster_handoff("released", "drain", 0.02)
    telemetry.cluster_handoff("started", "drain")
    [took] = points(reader, "nsjms.cluster.takeovers")
    assert took.value == 1 and took.attributes == {telemetry.A.CLUSTER_NODE: "n1"}
    [renew] = points(reader, "nsjms.cluster.lease.renew")
    assert renew.count == 1 and renew.sum == pytest.approx(0.004)
    fenced = {p.attributes[telemetry.A.CLUSTER_WRITE]: p.value for p in points(reader, "nsjms.cluster.fenced_writes")}
    assert fenced == {"unit_of_work": 1, "decision": 1}
    moves = {p.attributes[telemetry.A.CLUSTER_ROLE]: p.value for p in points(reader, "nsjms.cluster.handoffs")}
    assert moves == {"released": 1, "started": 1}
    [stop] = points(reader, "nsjms.cluster.handoff.stop")
    assert stop.count == 1
