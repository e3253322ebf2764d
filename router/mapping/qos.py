"""QoS mapping NS <-> JMS (NJI 2.5 with the digest's corrections, §13.1-§13.3): reliability, priority, times.

Times: ``TimeBase::TimeT`` counts 100 ns; ``UtcT.time`` counts 100 ns since 1582-10-15 00:00 UTC; JMS counts ms
since 1970-01-01 00:00 UTC. Conversions to ms round *down* (an expiry never moves later than the NS deadline).
"""

from __future__ import annotations

from router.jms.model import DeliveryMode

__all__ = [
    "BEST_EFFORT",
    "PERSISTENT",
    "TICKS_PER_MS",
    "UTC_EPOCH_OFFSET",
    "expiration_ms",
    "jms_to_ns_priority",
    "mode_to_reliability",
    "ms_to_timet",
    "ms_to_utc",
    "ns_to_jms_priority",
    "reliability_to_mode",
    "timet_to_ms",
    "utc_to_ms",
]

#: 100 ns intervals from 1582-10-15T00:00Z (TimeBase epoch) to 1970-01-01T00:00Z.
UTC_EPOCH_OFFSET = 122_192_928_000_000_000
TICKS_PER_MS = 10_000
#: CosNotification::EventReliability values.
BEST_EFFORT, PERSISTENT = 0, 1


def ns_to_jms_priority(priority: int) -> int:
    """NJI Table 2-6: ``<= 0`` -> 0, 1..8 unchanged, ``>= 9`` -> 9."""
    return min(9, max(0, priority))


def jms_to_ns_priority(priority: int) -> int:
    """NJI Table 2-5: identity (0..9)."""
    return priority


def reliability_to_mode(reliability: int | None, default_persistent: bool = True) -> DeliveryMode:
    """NJI Table 2-2; absent -> PERSISTENT (NJI 2.4.2) unless the bridge is configured otherwise."""
    if reliability is None:
        return DeliveryMode.PERSISTENT if default_persistent else DeliveryMode.NON_PERSISTENT
    return DeliveryMode.PERSISTENT if reliability == PERSISTENT else DeliveryMode.NON_PERSISTENT


def mode_to_reliability(mode: DeliveryMode) -> int:
    return PERSISTENT if mode == DeliveryMode.PERSISTENT else BEST_EFFORT


def utc_to_ms(utc_time: int) -> int:
    """``UtcT.time`` -> ms since the Unix epoch (may be negative before 1970)."""
    return (utc_time - UTC_EPOCH_OFFSET) // TICKS_PER_MS


def ms_to_utc(ms: int) -> int:
    """ms since the Unix epoch -> ``UtcT.time``."""
    return ms * TICKS_PER_MS + UTC_EPOCH_OFFSET


def timet_to_ms(ticks: int) -> int:
    """A relative ``TimeT`` (100 ns) -> ms."""
    return ticks // TICKS_PER_MS


def ms_to_timet(ms: int) -> int:
    return ms * TICKS_PER_MS


def expiration_ms(now_ms: int, timeout: int | None, stop_time: int | None) -> int:
    """JMSExpiration for an event: the earlier of now + Timeout and StopTime; 0 (never) when neither applies.

    ``timeout`` is a TimeT (0 = no timeout), ``stop_time`` a ``UtcT.time``. A deadline at or before the Unix epoch
    becomes 1 ms (already expired), never 0, which JMS reads as "never expires".
    """
    candidates = []
    if timeout:
        candidates.append(now_ms + timet_to_ms(timeout))
    if stop_time is not None:
        candidates.append(utc_to_ms(stop_time))
    return max(1, min(candidates)) if candidates else 0
