"""Stopped logical connections of this node, for operators (NJI 4.2.7.3): the ``NsjmsStatus`` object.

:class:`ConnectionStatusImpl` is activated in the INS POA under ``NsjmsStatus``
(``corbaloc::HOST:PORT/NsjmsStatus``) as a ``CosNotification::QoSAdmin``; ``get_qos()`` lists one property per
stopped connection (name = proxy object id, value = the reason, a string). The Ack proxy suppliers
(:mod:`router.channel.ack`) report and clear their connection here and count stops on
``nsjms.ack.connections_stopped``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotification__POA

from router.telemetry import NAME

__all__ = ["STATUS_KEY", "ConnectionStatusImpl", "activate_status"]

STATUS_KEY = "NsjmsStatus"


class ConnectionStatusImpl(CosNotification__POA.QoSAdmin):
    """Stopped logical connections of this node, readable with ``get_qos`` (name = proxy oid, value = reason)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stopped: dict[str, str] = {}

    def report(self, oid: str, reason: str) -> None:
        with self._lock:
            self.stopped[oid] = reason

    def clear(self, oid: str) -> None:
        with self._lock:
            self.stopped.pop(oid, None)

    def get_qos(self) -> list[Any]:
        with self._lock:
            items = sorted(self.stopped.items())
        return [CosNotification.Property(k, CORBA.Any(CORBA.TC_string, v)) for k, v in items]

    def set_qos(self, qos: list[Any]) -> None:
        raise CORBA.NO_PERMISSION(0, CORBA.COMPLETED_NO)

    def validate_qos(self, required_qos: list[Any]) -> list[Any]:
        return []


def activate_status(rt: Any) -> ConnectionStatusImpl:
    servant = ConnectionStatusImpl()
    rt.ins_poa.activate_object_with_id(STATUS_KEY.encode(), servant)
    rt.connection_status = servant
    return servant


def _status(rt: Any) -> ConnectionStatusImpl | None:
    return getattr(rt, "connection_status", None)


@functools.lru_cache(maxsize=1)
def _stopped_counter() -> Any:
    """Created on first use, so a meter provider configured by the CLI after import is used."""
    from opentelemetry import metrics


    return metrics.get_meter(NAME).create_counter(
        "nsjms.ack.connections_stopped", unit="{connection}",
        description="Logical connections stopped because the acknowledgement retries ran out (NJI 4.2.7.3)")
