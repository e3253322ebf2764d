"""Per-event times on the way JMS -> channel: expiry, and what the receiving channel accepts (NS 2.5.5.3-4).

A channel honours a per-event ``StopTime`` / ``StartTime`` only when its ``StopTimeSupported`` /
``StartTimeSupported`` QoS is TRUE, and refuses an event carrying one otherwise (``BAD_QOS``, NS 2.5.6.2). The
bridge says what its proxy consumer accepts with :class:`ChannelTimeSupport`; the default is the form every
channel accepts:

* ``StopTime`` not supported: the remaining lifetime becomes a relative ``Timeout`` (TimeT; the earlier of it and
  a ``Timeout`` already present), which NS 2.5.5.3 counts from the channel's receipt, i.e. just after mapping;
* ``StartTime`` not supported: the event cannot be held back, so it is delivered at once (a note says so when the
  start lay in the future);
* either way the original entry moves, unchanged, to the end of ``filterable_data``: nothing is lost and
  consumers can still filter on it.

Expiry (JMS 3.4.9): JMSExpiration 0 never expires; a negative one (a time before 1970) or one at or before the
mapping time has expired, and mapping it raises :class:`~router.mapping.errors.MessageExpired`.
"""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import omniORB  # noqa: F401  (first: it puts the COS stubs on sys.path)
import CosNotification
import TimeBase
from omniORB import CORBA

from router.mapping import idltypes as it
from router.mapping import qos
from router.mapping.errors import MappingError, MessageExpired

__all__ = ["ANY_CHANNEL", "ChannelTimeSupport", "check_expiry", "fit_times"]

_STOP, _START, _TIMEOUT = "StopTime", "StartTime", "Timeout"
_INTEGRAL = frozenset({CORBA.tk_short, CORBA.tk_ushort, CORBA.tk_long, CORBA.tk_ulong, CORBA.tk_longlong,
                       CORBA.tk_ulonglong, CORBA.tk_octet})


@dataclass(frozen=True)
class ChannelTimeSupport:
    """Whether the channel proxy consumer that receives the events honours per-event StopTime / StartTime.

    The default (both FALSE) gives events every channel accepts. A bridge passes its proxy consumer's
    ``StopTimeSupported`` / ``StartTimeSupported`` QoS, e.g. ``ChannelTimeSupport.from_qos(proxy.get_qos())``.
    """

    stop_time: bool = False
    start_time: bool = False

    @classmethod
    def from_qos(cls, qos_values: Mapping[str, object] | Iterable[Any]) -> ChannelTimeSupport:
        """From a QoS ``PropertySeq`` (``get_qos()``) or a ``{name: value}`` mapping (values bool or Any).
        A flag that is absent or not a boolean counts as FALSE (the form every channel accepts)."""
        pairs: list[tuple[str, object]]
        if isinstance(qos_values, Mapping):
            pairs = [(str(name), value) for name, value in qos_values.items()]
        else:
            pairs = [(str(p.name), p.value) for p in cast("Iterable[Any]", qos_values)]
        flags = {name: _flag(value) for name, value in pairs}
        return cls(stop_time=flags.get(CosNotification.StopTimeSupported, False),
                   start_time=flags.get(CosNotification.StartTimeSupported, False))


#: The default: what every channel accepts (neither StopTime nor StartTime per event).
ANY_CHANNEL = ChannelTimeSupport()


def _flag(value: object) -> bool:
    if isinstance(value, CORBA.Any):
        value = value.value()
    return value is True


def check_expiry(expiration: int, now_ms: int, field: str = "JMSExpiration") -> None:
    """Raise :class:`MessageExpired` when a JMSExpiration (ms since 1970, 0 = never) has passed at ``now_ms``."""
    if expiration < 0 or (expiration > 0 and now_ms >= expiration):
        raise MessageExpired(expiration, now_ms, field)


def fit_times(header: list[Any], filterable: list[Any], support: ChannelTimeSupport,
              now_ms: int) -> tuple[list[Any], list[Any], tuple[str, ...]]:
    """(variable header, filterable data, notes) the channel accepts; see the module docstring."""
    kept: list[Any] = []
    moved: list[Any] = []
    stop_at: int | None = None
    for prop in header:
        name = str(prop.name)
        if name == _STOP and not support.stop_time:
            if stop_at is None:
                stop_at = len(kept)
                kept.append(prop)               # replaced by the Timeout below
            moved.append(prop)
        elif name == _START and not support.start_time:
            moved.append(prop)
        else:
            kept.append(prop)
    notes: list[str] = []
    if stop_at is not None:
        kept = _stop_to_timeout(kept, stop_at, now_ms)
    for prop in moved:
        if str(prop.name) == _START:
            notes.extend(_start_note(prop, now_ms))
    return kept, [*filterable, *moved], tuple(notes)


def _stop_to_timeout(kept: list[Any], stop_at: int, now_ms: int) -> list[Any]:
    stop = _utc_time(kept[stop_at].value, _STOP)
    remaining = stop - qos.ms_to_utc(now_ms)
    if remaining <= 0:
        raise MessageExpired(qos.utc_to_ms(stop), now_ms, _STOP)
    current = next((i for i, p in enumerate(kept) if str(p.name) == _TIMEOUT), None)
    if current is None:
        kept[stop_at] = CosNotification.Property(_TIMEOUT, _timet(remaining))
        return kept
    existing = _ticks(kept[current].value)
    timeout = remaining if existing == 0 else min(existing, remaining)
    kept[current] = CosNotification.Property(_TIMEOUT, _timet(timeout))
    del kept[stop_at]
    return kept


def _start_note(prop: Any, now_ms: int) -> list[str]:
    start_ms = qos.utc_to_ms(_utc_time(prop.value, _START))
    if start_ms <= now_ms:
        return []
    return [(f"StartTime {start_ms} lies {start_ms - now_ms} ms in the future, but the channel does not support "
             "StartTime: the event is delivered at once (StartTime kept in filterable_data)")]


def _utc_time(value: Any, field: str) -> int:
    if not value.typecode().equivalent(TimeBase._tc_UtcT):
        raise MappingError(f"expected TimeBase::UtcT, got {value.typecode()}", field)
    return int(value.value().time)


def _ticks(value: Any) -> int:
    if it.unalias(value.typecode()).kind() not in _INTEGRAL:
        raise MappingError(f"expected an integer type, got {value.typecode()}", _TIMEOUT)
    ticks = int(value.value())
    if ticks < 0:
        raise MappingError("Timeout must not be negative", _TIMEOUT)
    return ticks


def _timet(ticks: int) -> Any:
    return CORBA.Any(TimeBase._tc_TimeT, min(ticks, 2**64 - 1))
