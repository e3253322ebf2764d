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
=================================  =========  ================================================================

Spans: ``nsjms.bridge.forward`` (one per batch sent to the broker, with ``nsjms.bridge``, ``nsjms.batch_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from opentelemetry import metrics, trace

__all__ = [
    "NAME",
    "A",
    "accepted",
    "bridge_dead_letter",
    "bridge_moved",
    "configure",
    "forward_span",
    "register_gauges",
    "rejected",
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
        "nsjms.bridge.forward.duration", unit="s", description="time to forward one batch to the broker"))
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


def configure(exporter: str, interval_s: int, *, service_name: str = "nsjms") -> Callable[[], None]:
    """Install the SDK providers (CLI only). Returns a shutdown function that flushes them."""
    if exporter == "none":
        return lambda: None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": service_name})
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=interval_s * 1000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    metrics.set_meter_provider(meter_provider)
    trace.set_tracer_provider(tracer_provider)
    _Instruments.reset()

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown
