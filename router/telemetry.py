"""OpenTelemetry in one place: instrument names, attribute keys, and the SDK setup the CLI performs.

Library code calls only the helpers below, which use the OpenTelemetry *API* with the fixed tracer/meter name
``nsjms``; without :func:`configure` they are the API's no-ops. Instruments:

=================================  =========  ================================================================
``nsjms.events.accepted``          counter    events accepted by a channel (``nsjms.channel``, ``nsjms.persistent``)
``nsjms.events.rejected``          counter    events refused to a supplier (``nsjms.channel``, ``nsjms.reason``)
``nsjms.bridge.messages``          counter    messages a bridge moved (``nsjms.bridge``, ``nsjms.direction``)
``nsjms.bridge.dead_letters``      counter    dead-lettered or refused items (``nsjms.bridge``, ``nsjms.reason``)
``nsjms.bridge.forward.duration``  histogram  seconds to forward one batch to the broker (``nsjms.bridge``)
``nsjms.queue.depth``              gauge      events queued per proxy supplier (``nsjms.channel``, ``nsjms.proxy``)
``nsjms.bridge.active``            gauge      1 when a bridge is active (``nsjms.bridge``)
``nsjms.t2.transactions``          counter    routing transactions ended, by ``nsjms.t2.outcome``: committed,
                                              rolled_back, timed_out, commit_pending, in_doubt, heuristic
``nsjms.t2.duration``              histogram  seconds from begin to end of a T2 (``nsjms.t2.outcome``)
``nsjms.t2.in_doubt``              gauge      transactions of this node waiting for recovery or an operator (listed
                                              by ``nsjms txn list`` with a safe action other than ``wait``)
``nsjms.t2.in_doubt.oldest_age``   gauge      age in seconds of the oldest of them (0: none)
``nsjms.t2.outbox.depth``          gauge      rows in ``nsjms_outbox``
``nsjms.t2.inbox.depth``           gauge      rows in ``nsjms_inbox`` (PostgreSQL's live-row estimate)
``nsjms.t2.recovery.passes``       counter    recovery passes by ``nsjms.t2.recovery.result``: clean, errors, failed
``nsjms.t2.recovery.actions``      counter    branches recovery finished, by ``nsjms.t2.recovery.action``:
                                              committed, rolled_back, resent, ended, heuristic
``nsjms.cluster.takeovers``        counter    dead members this node fenced and took over (``nsjms.cluster.node``:
                                              the dead one)
``nsjms.cluster.lease.renew``      histogram  seconds one lease renewal took (PostgreSQL round trip and commit)
``nsjms.cluster.fenced_writes``    counter    writes of this node refused by the fence check (its epoch was no
                                              longer live: it was taken over), by ``nsjms.cluster.write``: unit_of_work,
                                              decision
``nsjms.cluster.handoffs``         counter    channels handed over (drain, rebalance, placement), by
                                              ``nsjms.cluster.role``: released (this node gave it), started (this
                                              node took it), failed; and ``nsjms.cluster.reason``
``nsjms.cluster.handoff.stop``     histogram  seconds the old owner took to stop a channel and its bridges
=================================  =========  ================================================================

Spans: ``nsjms.bridge.forward`` (one per batch sent to the broker, with ``nsjms.bridge``, ``nsjms.batch_size``);
``nsjms.t2`` (one per routing transaction, ``nsjms.t2.gtrid``, ``nsjms.t2.outcome``, an event ``decided``) with one
child per participant and phase, ``nsjms.t2.begin|prepare|commit|rollback`` (``nsjms.t2.branch``,
``nsjms.t2.branch_kind``, ``nsjms.t2.result``); ``nsjms.t2.recovery`` (one per recovery pass).

Export (:func:`configure`, chosen by ``[telemetry] exporter``): ``none`` (default), ``console``, ``prometheus``
(text format over HTTP on ``address``, loopback by default, path ``/metrics``) or ``otlp`` (OTLP/HTTP protobuf to
``otlp_endpoint``, metrics and spans).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from opentelemetry import metrics, trace

from xa.observer import Phase
from xa.states import State

if TYPE_CHECKING:
    from xa.recovery import RecoveryReport

__all__ = [
    "NAME",
    "A",
    "T2Gauges",
    "T2Telemetry",
    "accepted",
    "bridge_dead_letter",
    "bridge_moved",
    "cluster_fenced_write",
    "cluster_handoff",
    "cluster_lease_renewed",
    "cluster_takeover",
    "configure",
    "forward_span",
    "register_gauges",
    "register_t2_gauges",
    "rejected",
    "t2_outcome",
]

NAME = "nsjms"


class A:
    """Attribute keys (one place, so dashboards and code agree)."""

    CHANNEL = "nsjms.channel"
    PERSISTENT = "nsjms.persistent"
    REASON = "nsjms.reason"
    BRIDGE = "nsjms.bridge"
    DIRECTION = "nsjms.direction"
    PROXY = "nsjms.proxy"
    BATCH = "nsjms.batch_size"
    GTRID = "nsjms.t2.gtrid"
    OUTCOME = "nsjms.t2.outcome"
    TIMEOUT = "nsjms.t2.timeout_s"
    BRANCH = "nsjms.t2.branch"
    BRANCH_KIND = "nsjms.t2.branch_kind"
    RESULT = "nsjms.t2.result"
    DECISION = "nsjms.t2.decision"
    RECOVERY_RESULT = "nsjms.t2.recovery.result"
    RECOVERY_ACTION = "nsjms.t2.recovery.action"
    CLUSTER_NODE = "nsjms.cluster.node"
    CLUSTER_WRITE = "nsjms.cluster.write"
    CLUSTER_ROLE = "nsjms.cluster.role"
    CLUSTER_REASON = "nsjms.cluster.reason"


#: Histogram buckets in seconds (``nsjms.t2.duration``, ``nsjms.bridge.forward.duration``): a T2 or a forward takes
#: milliseconds (T2 target p99 <= 20 ms) up to its timeout. The SDK's default buckets (0, 5, 10, 25 ... 10000) are
#: meant for milliseconds and would put every sample in the first one.
SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


def _meter() -> metrics.Meter:
    return metrics.get_meter(NAME)


class _Instruments:
    """Created lazily so that a provider configured after import is used."""

    _cache: ClassVar[dict[str, Any]] = {}

    @classmethod
    def get(cls, name: str, factory: Callable[[metrics.Meter], Any]) -> Any:
        inst = cls._cache.get(name)
        if inst is None:
            inst = cls._cache[name] = factory(_meter())
        return inst

    @classmethod
    def reset(cls) -> None:
        cls._cache.clear()


def accepted(channel: int, n: int, persistent: bool) -> None:
    _Instruments.get("accepted", lambda m: m.create_counter(
        "nsjms.events.accepted", unit="{event}", description="events accepted by a channel")).add(
        n, {A.CHANNEL: channel, A.PERSISTENT: persistent})


def rejected(channel: int, n: int, reason: str) -> None:
    _Instruments.get("rejected", lambda m: m.create_counter(
        "nsjms.events.rejected", unit="{event}", description="events refused to a supplier")).add(
        n, {A.CHANNEL: channel, A.REASON: reason})


def bridge_moved(bridge: int, n: int, direction: str) -> None:
    _Instruments.get("moved", lambda m: m.create_counter(
        "nsjms.bridge.messages", unit="{message}", description="messages a bridge moved")).add(
        n, {A.BRIDGE: bridge, A.DIRECTION: direction})


def bridge_dead_letter(bridge: int, reason: str) -> None:
    _Instruments.get("dead", lambda m: m.create_counter(
        "nsjms.bridge.dead_letters", unit="{message}", description="dead-lettered or refused items")).add(
        1, {A.BRIDGE: bridge, A.REASON: reason})


@contextmanager
def forward_span(bridge: int, batch: int) -> Iterator[None]:
    """A span and a duration sample for one batch sent to the broker."""
    import time

    hist = _Instruments.get("fwd", lambda m: m.create_histogram(
        "nsjms.bridge.forward.duration", unit="s", description="time to forward one batch to the broker",
        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS))
    start = time.perf_counter()
    with trace.get_tracer(NAME).start_as_current_span("nsjms.bridge.forward",
                                                      attributes={A.BRIDGE: bridge, A.BATCH: batch}):
        yield
    hist.record(time.perf_counter() - start, {A.BRIDGE: bridge})


def register_gauges(queue_depths: Callable[[], Iterable[tuple[int, str, int]]],
                    bridges_active: Callable[[], Iterable[tuple[int, bool]]]) -> None:
    """Observable gauges read at export time from the node's live objects."""

    def depth(_options: Any) -> Iterator[metrics.Observation]:
        for channel, proxy, n in queue_depths():
            yield metrics.Observation(n, {A.CHANNEL: channel, A.PROXY: proxy})

    def active(_options: Any) -> Iterator[metrics.Observation]:
        for bridge, up in bridges_active():
            yield metrics.Observation(1 if up else 0, {A.BRIDGE: bridge})

    m = _meter()
    m.create_observable_gauge("nsjms.queue.depth", [depth], unit="{event}", description="events queued per proxy")
    m.create_observable_gauge("nsjms.bridge.active", [active], description="1 when a bridge is active")


# ------------------------------------------------------------------------------------------------ cluster
def cluster_takeover(dead: str) -> None:
    _Instruments.get("takeovers", lambda m: m.create_counter(
        "nsjms.cluster.takeovers", unit="{takeover}", description="dead members this node fenced and took over")).add(
        1, {A.CLUSTER_NODE: dead})


def cluster_lease_renewed(seconds: float) -> None:
    _Instruments.get("renew", lambda m: m.create_histogram(
        "nsjms.cluster.lease.renew", unit="s", description="time one lease renewal took",
        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)).record(seconds)


def cluster_fenced_write(write: str) -> None:
    _Instruments.get("fenced", lambda m: m.create_counter(
        "nsjms.cluster.fenced_writes", unit="{write}",
        description="writes of this node refused by the fence check")).add(1, {A.CLUSTER_WRITE: write})


def cluster_handoff(role: str, reason: str, stop_s: float | None = None) -> None:
    _Instruments.get("handoffs", lambda m: m.create_counter(
        "nsjms.cluster.handoffs", unit="{channel}", description="channels handed over between nodes")).add(
        1, {A.CLUSTER_ROLE: role, A.CLUSTER_REASON: reason})
    if stop_s is not None:
        _Instruments.get("handoff_stop", lambda m: m.create_histogram(
            "nsjms.cluster.handoff.stop", unit="s", description="time to stop a channel and its bridges for a hand-off",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)).record(stop_s, {A.CLUSTER_REASON: reason})


# ------------------------------------------------------------------------------------------------ T2
def t2_outcome(state: State, timed_out: bool) -> str:
    """The ``nsjms.t2.outcome`` value of a transaction the coordinator stopped driving in ``state``."""
    if state is State.COMMITTED:
        return "committed"
    if state is State.ROLLED_BACK:
        return "timed_out" if timed_out else "rolled_back"
    if state is State.COMMIT_PENDING:
        return "commit_pending"
    if state is State.IN_DOUBT:
        return "in_doubt"
    if state in (State.HEURISTIC_COMMIT, State.HEURISTIC_ROLLBACK, State.HEURISTIC_MIXED):
        return "heuristic"
    return state.value.lower()


_BAD_OUTCOMES = frozenset({"timed_out", "in_doubt", "heuristic"})
_RECOVERY_ACTIONS = ("committed", "rolled_back", "resent", "ended", "heuristic")


class T2Telemetry:
    """The router's :class:`xa.observer.Observer`: spans and metrics of T2 with the OpenTelemetry API.

    One ``nsjms.t2`` span per transaction (not made current: it crosses calls), its participant/phase spans as
    children by explicit context. Thread-safe; spans of a transaction still open at ``ended`` are closed there.
    """

    def __init__(self, *, meter_provider: metrics.MeterProvider | None = None,
                 tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(NAME, tracer_provider=tracer_provider)
        meter = metrics.get_meter(NAME, meter_provider=meter_provider)
        self._ended = meter.create_counter("nsjms.t2.transactions", unit="{transaction}",
                                           description="routing transactions ended, by outcome")
        self._duration = meter.create_histogram("nsjms.t2.duration", unit="s",
                                                description="seconds from begin to end of a routing transaction",
                                                explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self._passes = meter.create_counter("nsjms.t2.recovery.passes", unit="{pass}",
                                            description="recovery passes, by result")
        self._actions = meter.create_counter("nsjms.t2.recovery.actions", unit="{branch}",
                                             description="what recovery did, by action")
        self._lock = threading.Lock()
        self._roots: dict[str, trace.Span] = {}
        self._children: dict[tuple[str, Phase, str], trace.Span] = {}

    def begun(self, gtrid: str, timeout: float | None) -> None:
        attrs: dict[str, Any] = {A.GTRID: gtrid}
        if timeout is not None:
            attrs[A.TIMEOUT] = timeout
        span = self._tracer.start_span("nsjms.t2", attributes=attrs)
        with self._lock:
            self._roots[gtrid] = span

    def phase_started(self, gtrid: str, phase: Phase, branch: str, kind: str) -> None:
        with self._lock:
            root = self._roots.get(gtrid)
        context = trace.set_span_in_context(root) if root is not None else None
        span = self._tracer.start_span(f"nsjms.t2.{phase.value}", context=context,
                                       attributes={A.GTRID: gtrid, A.BRANCH: branch, A.BRANCH_KIND: kind})
        with self._lock:
            self._children[(gtrid, phase, branch)] = span

    def phase_ended(self, gtrid: str, phase: Phase, branch: str, result: str, error: str) -> None:
        with self._lock:
            span = self._children.pop((gtrid, phase, branch), None)
        if span is None:
            return
        span.set_attribute(A.RESULT, result)
        if error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end()

    def decided(self, gtrid: str, decision: str, reason: str) -> None:
        with self._lock:
            root = self._roots.get(gtrid)
        if root is not None:
            root.add_event("decided", {A.DECISION: decision, A.REASON: reason})

    def ended(self, gtrid: str, state: State, timed_out: bool, duration_s: float) -> None:
        outcome = t2_outcome(state, timed_out)
        with self._lock:
            root = self._roots.pop(gtrid, None)
            left = [k for k in self._children if k[0] == gtrid]
            spans = [self._children.pop(k) for k in left]
        for span in spans:
            span.end()
        if root is not None:
            root.set_attribute(A.OUTCOME, outcome)
            if outcome in _BAD_OUTCOMES:
                root.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
            root.end()
        self._ended.add(1, {A.OUTCOME: outcome})
        self._duration.record(duration_s, {A.OUTCOME: outcome})

    def recovery_pass(self, report: RecoveryReport, duration_s: float, failed: str) -> None:
        result = "failed" if failed else "errors" if report.errors else "clean"
        self._passes.add(1, {A.RECOVERY_RESULT: result})
        counts = {action: len(getattr(report, action)) for action in _RECOVERY_ACTIONS}
        for action, n in counts.items():
            if n:
                self._actions.add(n, {A.RECOVERY_ACTION: action})
        end = time.time_ns()
        span = self._tracer.start_span("nsjms.t2.recovery", start_time=end - int(duration_s * 1e9),
                                       attributes={A.RECOVERY_RESULT: result, "nsjms.t2.recovery.foreign":
                                                   report.foreign, **{f"nsjms.t2.recovery.{k}": v
                                                                      for k, v in counts.items()}})
        if failed or report.errors:
            span.set_status(trace.Status(trace.StatusCode.ERROR, failed or "; ".join(report.errors)[:500]))
        span.end(end_time=end)


@dataclass(frozen=True)
class T2Gauges:
    """What the T2 gauges show, read at export time (the node caches it; reading must not block on I/O)."""

    in_doubt: int = 0
    oldest_age_s: float = 0.0
    outbox: int = 0
    inbox: int = 0


def register_t2_gauges(read: Callable[[], T2Gauges | None], *,
                       meter_provider: metrics.MeterProvider | None = None) -> None:
    """Observable gauges over ``read()`` (None: nothing known yet, no sample)."""
    meter = metrics.get_meter(NAME, meter_provider=meter_provider)

    def gauge(field: str) -> Callable[[Any], Iterator[metrics.Observation]]:
        def observe(_options: Any) -> Iterator[metrics.Observation]:
            snap = read()
            if snap is not None:
                yield metrics.Observation(getattr(snap, field))
        return observe

    meter.create_observable_gauge("nsjms.t2.in_doubt", [gauge("in_doubt")], unit="{transaction}",
                                  description="transactions waiting for recovery or an operator")
    meter.create_observable_gauge("nsjms.t2.in_doubt.oldest_age", [gauge("oldest_age_s")], unit="s",
                                  description="age of the oldest in-doubt transaction (0: none)")
    meter.create_observable_gauge("nsjms.t2.outbox.depth", [gauge("outbox")], unit="{row}",
                                  description="rows in nsjms_outbox")
    meter.create_observable_gauge("nsjms.t2.inbox.depth", [gauge("inbox")], unit="{row}",
                                  description="rows in nsjms_inbox")


# -------------------------------------------------------------------------------------------- export
EXPORTERS = ("none", "console", "prometheus", "otlp")


@dataclass(frozen=True)
class ExportSettings:
    """``[telemetry]`` as :func:`configure` needs it."""

    exporter: str = "none"
    interval_s: int = 30
    address: str = "127.0.0.1:9464"
    otlp_endpoint: str = "http://127.0.0.1:4318"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class Installed:
    """The SDK providers :func:`build_providers` made, and what stops them."""

    meter_provider: Any
    tracer_provider: Any | None
    scrape_address: tuple[str, int] | None = None  # prometheus: where /metrics is served
    _stops: tuple[Callable[[], None], ...] = ()

    def shutdown(self) -> None:
        for stop in self._stops:
            stop()


def build_providers(settings: ExportSettings, *, service_name: str = "nsjms") -> Installed | None:
    """The SDK providers for ``settings`` (None for ``none``); raises OSError when the Prometheus address cannot be
    bound. Nothing global is changed here (see :func:`configure`)."""
    if settings.exporter == "none":
        return None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    resource = Resource.create({"service.name": service_name})
    interval = settings.interval_s * 1000
    stops: list[Callable[[], None]] = []
    scrape: tuple[str, int] | None = None
    spans: SpanExporter | None = None
    reader: MetricReader
    if settings.exporter == "prometheus":
        reader, server, scrape = _prometheus(settings.address)
        stops.append(server.shutdown)
        stops.append(server.server_close)
    elif settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = settings.otlp_endpoint.rstrip("/")
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
                                               export_interval_millis=interval)
        spans = OTLPSpanExporter(endpoint=f"{base}/v1/traces")
    else:
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=interval)
        spans = ConsoleSpanExporter()
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    tracer_provider = None
    if spans is not None:  # Prometheus is metrics only: spans stay the API's no-ops
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(spans))
        stops.insert(0, tracer_provider.shutdown)
    stops.insert(0, meter_provider.shutdown)
    return Installed(meter_provider, tracer_provider, scrape, tuple(stops))


def _prometheus(address: str) -> tuple[Any, Any, tuple[str, int]]:
    """A Prometheus reader on a registry of its own, served at ``http://address/metrics``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    host, port = split_address(address)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address
    return reader, server, (str(bound[0]), int(bound[1]))


def configure(exporter: str, interval_s: int, *, service_name: str = "nsjms", address: str = "127.0.0.1:9464",
              otlp_endpoint: str = "http://127.0.0.1:4318") -> Callable[[], None]:
    """Install the SDK providers globally (CLI only). Returns a shutdown function that flushes them."""
    installed = build_providers(ExportSettings(exporter, interval_s, address, otlp_endpoint),
                                service_name=service_name)
    if installed is None:
        return lambda: None
    metrics.set_meter_provider(installed.meter_provider)
    if installed.tracer_provider is not None:
        trace.set_tracer_provider(installed.tracer_provider)
    _Instruments.reset()
    return installed.shutdown
