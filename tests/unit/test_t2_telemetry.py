"""T2 telemetry: the xa observer hook driven by the coordinator and recovery over twins, recorded by
router.telemetry.T2Telemetry into the OpenTelemetry SDK's in-memory reader and span exporter (local providers,
nothing global)."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from router import telemetry
from router.telemetry import A, T2Gauges, T2Telemetry
from xa.coordinator import Coordinator
from xa.errors import OutcomeUnknown, PrepareFailed, TransactionRolledBack, TransactionTimeout
from xa.observer import Phase
from xa.records import Commit, Participant
from xa.recovery import RecoveryManager, RecoveryReport
from xa.states import State
from xa.testing import FakeClock, MemoryLog, MemoryManager, MemoryResource
from xa.xid import NodeId, branch_xid, new_gtrid

NODE = NodeId("n1")


@dataclass
class Sdk:
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    obs: T2Telemetry

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                out += [p for m in sm.metrics if m.name == name for p in m.data.data_points]
        return out

    def counts(self, name: str, key: str) -> dict[Any, Any]:
        return {p.attributes[key]: p.value for p in self.points(name)}

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


@pytest.fixture
def sdk() -> Sdk:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    return Sdk(reader, spans, T2Telemetry(meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=tp))


class World:
    def __init__(self, observer: Any) -> None:
        self.clock = FakeClock()
        self.db = MemoryManager("pg", self.clock)
        self.broker = MemoryManager("broker", self.clock)
        self.log = MemoryLog(NODE)
        self.coord = Coordinator(NODE, self.log, self.clock, observer=observer)

    def branches(self, fail: dict[str, Any] | None = None) -> list[MemoryResource]:
        fail = fail or {}
        return [self.db.branch("channel-queue", fail=fail.get("channel-queue")),
                self.db.branch("outbox", fail=fail.get("outbox")),
                self.broker.branch("stomp", one_phase=True, fail=fail.get("stomp"))]


def run(w: World, timeout: float | None = None, fail: dict[str, Any] | None = None) -> str:
    t = w.coord.begin(timeout)
    for b in w.branches(fail):
        t.enlist(b)
        b.write("x")
    t.commit()
    return t.gtrid


def test_committed_t2_is_one_span_with_a_child_per_participant_and_phase(sdk: Sdk) -> None:
    w = World(sdk.obs)
    gtrid = run(w, timeout=30)
    spans = sdk.finished()
    [root] = [s for s in spans if s.name == "nsjms.t2"]
    assert root.attributes is not None
    assert root.attributes[A.GTRID] == gtrid and root.attributes[A.OUTCOME] == "committed"
    assert root.attributes[A.TIMEOUT] == 30
    assert [e.name for e in root.events] == ["decided"]
    children = [s for s in spans if s is not root]
    assert root.context is not None
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children)
    phases = sorted((s.name, str((s.attributes or {})[A.BRANCH])) for s in children)
    assert phases == sorted((f"nsjms.t2.{p}", b) for p in ("begin", "prepare", "commit")
                            for b in ("channel-queue", "outbox", "stomp"))
    assert {(s.attributes or {})[A.RESULT] for s in children if s.name == "nsjms.t2.commit"} == {"COMMITTED"}
    assert sdk.counts("nsjms.t2.transactions", A.OUTCOME) == {"committed": 1}
    [hist] = sdk.points("nsjms.t2.duration")
    assert hist.count == 1 and hist.attributes[A.OUTCOME] == "committed"
    assert tuple(hist.explicit_bounds) == telemetry.SECONDS_BUCKETS  # seconds, not the SDK's ms-style default


def test_rolled_back_t2_marks_the_failed_prepare(sdk: Sdk) -> None:
    w = World(sdk.obs)
    with pytest.raises(PrepareFailed):
        run(w, fail={"outbox": {"prepare": PrepareFailed("disk full")}})
    spans = sdk.finished()
    [failed] = [s for s in spans if s.name == "nsjms.t2.prepare" and (s.attributes or {})[A.BRANCH] == "outbox"]
    assert failed.status.status_code is StatusCode.ERROR and "disk full" in (failed.status.description or "")
    assert (failed.attributes or {})[A.RESULT] == "failed"
    rollbacks = [s for s in spans if s.name == "nsjms.t2.rollback"]
    assert len(rollbacks) == 3
    [root] = [s for s in spans if s.name == "nsjms.t2"]
    assert (root.attributes or {})[A.OUTCOME] == "rolled_back"
    [decided] = root.events
    assert (decided.attributes or {})[A.DECISION] == "rollback"
    assert "disk full" in str((decided.attributes or {})[A.REASON])
    assert sdk.counts("nsjms.t2.transactions", A.OUTCOME) == {"rolled_back": 1}


def test_timeout_and_commit_pending_are_counted_apart(sdk: Sdk) -> None:
    w = World(sdk.obs)
    with pytest.raises(TransactionTimeout):
        run(w, timeout=5, fail={"outbox": {"prepare": lambda: w.clock.advance(10)}})
    run(w, fail={"stomp": {"commit": OutcomeUnknown("no receipt")}})
    t = w.coord.begin()
    t.set_rollback_only("bridge said so")
    with pytest.raises(TransactionRolledBack):
        t.commit()
    assert sdk.counts("nsjms.t2.transactions", A.OUTCOME) == {"timed_out": 1, "commit_pending": 1,
                                                              "rolled_back": 1}
    roots = {(s.attributes or {})[A.OUTCOME]: s for s in sdk.finished() if s.name == "nsjms.t2"}
    assert roots["timed_out"].status.status_code is StatusCode.ERROR
    assert roots["rolled_back"].status.status_code is StatusCode.UNSET


def test_a_failing_observer_never_changes_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            def fail(*_args: Any) -> None:
                raise RuntimeError(f"{name} broke")
            return fail

    w = World(Broken())
    t = w.coord.begin()
    b = w.db.branch("outbox")
    t.enlist(b)
    b.write("x")
    assert t.commit().state is State.COMMITTED
    assert w.db.committed == ["x"]
    assert "telemetry observer failed in ended: RuntimeError: ended broke" in caplog.text


def test_recovery_passes_and_actions(sdk: Sdk) -> None:
    clock = FakeClock()
    db = MemoryManager("pg", clock)
    log = MemoryLog(NODE)
    resent: list[str] = []
    rm = RecoveryManager(NODE, log, [db], lambda g, p: resent.append(g), clock, observer=sdk.obs)
    gtrid = new_gtrid(NODE)
    parts = (Participant("outbox", "postgresql", "pg", False), Participant("stomp", "stomp-send", "broker", True))
    log.append(Commit(gtrid, parts, None, clock.wall()), durable=True)
    db.add_prepared(branch_xid(gtrid, "outbox"))
    report = rm.run()
    assert report.committed == [f"{gtrid}/outbox"] and resent == [gtrid]
    db.fail["recover"] = OSError("gone")  # not an XAError: the pass itself fails
    with pytest.raises(OSError):
        rm.run()
    assert sdk.counts("nsjms.t2.recovery.passes", A.RECOVERY_RESULT) == {"clean": 1, "failed": 1}
    assert sdk.counts("nsjms.t2.recovery.actions", A.RECOVERY_ACTION) == {"committed": 1, "resent": 1, "ended": 1}
    passes = [s for s in sdk.finished() if s.name == "nsjms.t2.recovery"]
    assert [s.status.status_code for s in passes] == [StatusCode.UNSET, StatusCode.ERROR]


def test_recovery_pass_with_errors(sdk: Sdk) -> None:
    sdk.obs.recovery_pass(RecoveryReport(errors=["pg: down"]), 0.01, "")
    assert sdk.counts("nsjms.t2.recovery.passes", A.RECOVERY_RESULT) == {"errors": 1}


def test_phase_end_without_start_and_end_with_open_children_are_harmless(sdk: Sdk) -> None:
    sdk.obs.phase_ended("g", Phase.COMMIT, "x", "ok", "")
    sdk.obs.begun("g2", None)
    sdk.obs.phase_started("g2", Phase.PREPARE, "outbox", "postgresql")
    sdk.obs.ended("g2", State.IN_DOUBT, False, 1.0)
    names = sorted(s.name for s in sdk.finished())
    assert names == ["nsjms.t2", "nsjms.t2.prepare"]
    assert sdk.counts("nsjms.t2.transactions", A.OUTCOME) == {"in_doubt": 1}


def test_t2_gauges_read_live_values() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    snap: dict[str, T2Gauges | None] = {"now": None}
    telemetry.register_t2_gauges(lambda: snap["now"], meter_provider=provider)
    data = reader.get_metrics_data()
    assert data is None or not any(p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                                   for p in m.data.data_points)
    snap["now"] = T2Gauges(in_doubt=2, oldest_age_s=75.5, outbox=7, inbox=3)
    sdk = Sdk(reader, InMemorySpanExporter(), T2Telemetry(meter_provider=provider))
    got = {n: [p.value for p in sdk.points(n)] for n in ("nsjms.t2.in_doubt", "nsjms.t2.in_doubt.oldest_age",
                                                          "nsjms.t2.outbox.depth", "nsjms.t2.inbox.depth")}
    assert got == {"nsjms.t2.in_doubt": [2], "nsjms.t2.in_doubt.oldest_age": [75.5],
                   "nsjms.t2.outbox.depth": [7], "nsjms.t2.inbox.depth": [3]}


@pytest.mark.parametrize(("state", "timed_out", "outcome"), [
    (State.COMMITTED, False, "committed"), (State.ROLLED_BACK, False, "rolled_back"),
    (State.ROLLED_BACK, True, "timed_out"), (State.COMMIT_PENDING, False, "commit_pending"),
    (State.IN_DOUBT, False, "in_doubt"), (State.HEURISTIC_MIXED, False, "heuristic"),
])
def test_outcome_names(state: State, timed_out: bool, outcome: str) -> None:
    assert telemetry.t2_outcome(state, timed_out) == outcome


def test_prometheus_text_on_loopback() -> None:
    installed = telemetry.build_providers(telemetry.ExportSettings("prometheus", address="127.0.0.1:0"))
    assert installed is not None and installed.scrape_address is not None
    try:
        host, port = installed.scrape_address
        assert host == "127.0.0.1"
        obs = T2Telemetry(meter_provider=installed.meter_provider)
        obs.ended("n1:000000000000000000000000", State.COMMITTED, False, 0.25)
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert 'nsjms_t2_transactions_total{nsjms_t2_outcome="committed"' in text
        assert "nsjms_t2_duration_seconds_count" in text
    finally:
        installed.shutdown()


def test_none_builds_nothing() -> None:
    assert telemetry.build_providers(telemetry.ExportSettings("none")) is None


def test_otlp_pushes_metrics_and_spans_over_http_on_loopback() -> None:
    """A stand-in OTLP/HTTP receiver on loopback gets protobuf POSTs on /v1/metrics and /v1/traces."""
    import http.server
    import threading

    got: list[tuple[str, str, int]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.append((self.path, self.headers.get("Content-Type", ""), len(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = telemetry.ExportSettings("otlp", interval_s=3600, otlp_endpoint=f"http://127.0.0.1:"
                                                                                   f"{server.server_address[1]}")
        installed = telemetry.build_providers(settings)
        assert installed is not None and installed.tracer_provider is not None
        obs = T2Telemetry(meter_provider=installed.meter_provider, tracer_provider=installed.tracer_provider)
        obs.begun("n1:000000000000000000000001", None)
        obs.ended("n1:000000000000000000000001", State.COMMITTED, False, 0.1)
        installed.shutdown()  # flushes both
    finally:
        server.shutdown()
        server.server_close()
    paths = {(p, ct) for p, ct, size in got if size > 0}
    assert ("/v1/metrics", "application/x-protobuf") in paths and ("/v1/traces", "application/x-protobuf") in paths
