"""Behaviour shared by channel, admin and proxy servants: QoSAdmin and FilterAdmin (NS 3.1.4, 3.2.4).

Filters are CORBA objects (local or remote, NS 2.3 footnote 2); the channel stores their references and asks them
``match_structured``/``match``. A filter that cannot answer (it raises, or is unreachable) does not match, and the
failure is logged: an event is never forwarded on an unknown verdict.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyFilter

from router.channel import qos as Q
from router.channel.events import Event, Form
from router.channel.sharing import sharing_of
from router.corbacall import FILTER, CallFailed, call

__all__ = ["FilterMixin", "FilterSet", "QoSMixin", "group_passes", "raise_unsupported_qos"]

log = logging.getLogger("nsjms.channel")


def raise_unsupported_qos(err: Exception) -> None:
    problems = getattr(err, "problems", ())
    raise CosNotification.UnsupportedQoS(Q.to_property_errors(problems))


class QoSMixin:
    """``get_qos``/``set_qos``/``validate_qos`` over ``self.qos`` (a dict), persisted by ``_persist_qos``."""

    qos: dict[str, Any]
    qos_target: Q.Target
    _lock: threading.RLock

    def _qos_context(self) -> Q.Context:
        raise NotImplementedError

    def _persist_qos(self, qos: dict[str, Any]) -> None:
        raise NotImplementedError

    def get_qos(self) -> list[CosNotification.Property]:
        return Q.to_properties(self.qos)

    def set_qos(self, qos: list[CosNotification.Property]) -> None:
        with self._lock:
            try:
                new = Q.apply_qos(self.qos, [(p.name, p.value) for p in qos], self.qos_target, self._qos_context())
                self._check_honoured(new, frozenset(p.name for p in qos))
            except Q.QoSError as exc:
                raise_unsupported_qos(exc)
            self._persist_qos(new)
            self.qos = new
            self._qos_changed()

    def _qos_changed(self) -> None:
        """Hook: the effective QoS changed (queues re-read their policies)."""

    def _check_honoured(self, qos: dict[str, Any], requested: frozenset[str] | None = None) -> None:
        """Hook: raise :class:`~router.channel.qos.QoSError` if this object cannot honour ``qos`` (a valid
        combination it has no means to deliver, e.g. EnableTransaction where no routing transaction can run).
        ``requested``: the names the request sets on this object (None: all of ``qos``)."""

    def validate_qos(self, required_qos: list[CosNotification.Property]) -> list[Any]:
        try:
            available = Q.validate_qos(self.qos, [(p.name, p.value) for p in required_qos], self.qos_target,
                                       self._qos_context())
            self._check_honoured({**self.qos, **Q.apply_qos(self.qos, [(p.name, p.value) for p in required_qos],
                                                            self.qos_target, self._qos_context())},
                                 frozenset(p.name for p in required_qos))
        except Q.QoSError as exc:
            raise_unsupported_qos(exc)
        return Q.to_named_ranges(available)


class FilterSet:
    """The forwarding filters attached to one admin or proxy, by FilterID (NS 3.2.4)."""

    def __init__(self, resolve: Callable[[str], Any], saved: dict[str, str] | None = None,
                 local: Callable[[Any], Any] | None = None) -> None:
        self._resolve = resolve
        self._local = local                         # ref -> in-process servant or None (evaluated without IIOP)
        self._servants: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._filters: dict[int, Any] = {}
        self._iors: dict[int, str] = {}
        self._next = 1
        for fid, ior in (saved or {}).items():
            self._filters[int(fid)] = None          # resolved lazily (the filter may live elsewhere)
            self._iors[int(fid)] = ior
            self._next = max(self._next, int(fid) + 1)

    def add(self, flt: Any, ior: str) -> int:
        with self._lock:
            fid = self._next
            self._next += 1
            self._filters[fid], self._iors[fid] = flt, ior
            return fid

    def remove(self, fid: int) -> None:
        with self._lock:
            if fid not in self._filters:
                raise CosNotifyFilter.FilterNotFound()
            del self._filters[fid], self._iors[fid]
            self._servants.pop(fid, None)

    def get(self, fid: int) -> Any:
        with self._lock:
            if fid not in self._filters:
                raise CosNotifyFilter.FilterNotFound()
            return self._ref(fid)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._filters)

    def clear(self) -> None:
        with self._lock:
            self._filters.clear()
            self._iors.clear()
            self._servants.clear()

    def saved(self) -> dict[str, str]:
        with self._lock:
            return {str(k): v for k, v in self._iors.items()}

    def __bool__(self) -> bool:
        return bool(self._filters)

    def _ref(self, fid: int) -> Any:
        ref = self._filters[fid]
        if ref is None:
            ref = self._resolve(self._iors[fid])._narrow(CosNotifyFilter.Filter)
            self._filters[fid] = ref
        return ref

    def _target(self, fid: int) -> Any:
        """The filter to ask: its servant when it lives in this process (no IIOP), else its reference. A servant
        retired since (its channel went to another node, ``FilterFactoryImpl.retire``) is asked no more: its
        reference reaches the node that serves the filter now."""
        if fid not in self._servants or getattr(self._servants[fid], "retired", False):
            ref = self._ref(fid)
            self._servants[fid] = self._local(ref) if self._local is not None else None
        return self._servants[fid] or self._ref(fid)

    def any_match(self, event: Event) -> bool:
        """OR over the filters (NS 3.2.1.8-9); an unanswerable filter does not match."""
        with self._lock:
            refs = [self._target(fid) for fid in sorted(self._filters)]
        return any(_ask(f, event) for f in refs)

    def targets(self) -> list[Any]:
        """The filters to ask, in id order (servants for local filters)."""
        with self._lock:
            return [self._target(fid) for fid in sorted(self._filters)]


def _ask(flt: Any, event: Event) -> bool:
    op = "match_structured" if event.form is Form.STRUCTURED else "match"
    try:
        return bool(call(flt, op, event.value, policy=FILTER, expected=(CosNotifyFilter.UnsupportedFilterableData,)))
    except CallFailed as exc:
        log.warning("filter %s could not evaluate an event: %s", flt, exc)
        return False
    except CosNotifyFilter.UnsupportedFilterableData:
        return False


def group_passes(own: FilterSet, group: FilterSet, operator: Any, event: Event) -> bool:
    """The forwarding decision of NS 2.3 (digest §8.2): proxy filters combined with its admin's."""
    if not own and not group:
        return True
    if not own:
        return group.any_match(event)
    if not group:
        return own.any_match(event)
    if operator == CosNotifyChannelAdmin.AND_OP:
        return own.any_match(event) and group.any_match(event)
    return own.any_match(event) or group.any_match(event)


class FilterMixin:
    """FilterAdmin operations over ``self.filters``; ``_persist_filters`` saves the IOR list."""

    filters: FilterSet
    rt: Any

    def _persist_filters(self) -> None:
        raise NotImplementedError

    def add_filter(self, new_filter: Any) -> int:
        if new_filter is None or CORBA.is_nil(new_filter):
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        fid = self.filters.add(new_filter, self.rt.ior(new_filter))
        self._persist_filters()
        self._filters_changed()
        return fid

    def remove_filter(self, filter: int) -> None:  # noqa: A002 — IDL parameter name
        self.filters.remove(filter)
        self._persist_filters()
        self._filters_changed()

    def get_filter(self, filter: int) -> Any:  # noqa: A002
        return self.filters.get(filter)

    def get_all_filters(self) -> list[int]:
        return self.filters.ids()

    def remove_all_filters(self) -> None:
        self.filters.clear()
        self._persist_filters()
        self._filters_changed()

    def _filters_changed(self) -> None:
        """Hook: consumer-side holders re-derive the channel's subscription aggregate (router.channel.sharing)."""
        if getattr(self, "side", "") == "C" and getattr(self, "channel", None) is not None:

            sharing_of(self.channel).changed()  # type: ignore[attr-defined]


def ids_of(items: Iterable[Any]) -> list[int]:
    return sorted(x.id for x in items if not getattr(x, "es_style", False))


def ior_or_none(rt: Any, ref: Any) -> str | None:
    """The stringified reference, or None for no/nil reference (how mapping-filter references are stored)."""
    if ref is None or CORBA.is_nil(ref):
        return None
    return str(rt.ior(ref))


def mapping_filter_from_ior(rt: Any, ior: str | None) -> Any:
    """A stored mapping-filter reference (resolved without a remote call), or None."""
    if not ior:
        return None
    try:
        return rt.resolve(ior)._unchecked_narrow(CosNotifyFilter.MappingFilter)
    except CORBA.Exception:
        log.warning("could not restore a mapping filter reference")
        return None
