"""Filter objects of the Notification Service (NS 3.2): FilterFactory, Filter and MappingFilter servants.

Constraints are compiled once by :mod:`router.etcl` (no ``eval``); a match is "any constraint whose event-type
list admits the event and whose expression is TRUE" (NS 2.3, 3.2.1.8-10). Every filter is persistent: its row in
``nsjms_filter`` holds the grammar, the constraints (with ids), the mapping values and the callback references,
and the servant is activated in the node's persistent POA under the object id ``flt/<id>``. References stored
by admins and proxies therefore keep working after a crash and restart.

Each channel has its own filter factory (``default_filter_factory``, object id ``ch/<channel>/ff``): a filter it
makes belongs to that channel (its id says which, :func:`router.cluster.forward.filter_id`) and is served by the
node that runs the channel: loaded with it at start, at a takeover and at a hand-off (:meth:`FilterFactoryImpl.
restore`), retired from the node that gives the channel away (:meth:`FilterFactoryImpl.retire`), and forwarded to
its owner by every other node (docs/cluster.md, "CORBA addressing"). One node serves a filter at a time, so its
constraints change in one place. Filters of the node-level factory ``flt/factory`` (references handed out before
channels had their own) have no channel: every node loads them at its start and when it adopts a channel.

Changes are atomic (NS 3.2.1.2): a whole ``add``/``modify``/``remove`` call is validated first, written to the
database in one statement, and only then swapped into the servant as a new immutable tuple, so a concurrent
``match`` sees either the old or the new constraint set, never a mix.

``InvalidConstraint`` carries the offending ``ConstraintExp`` exactly as the client sent it; the syntax error's
0-based character position is logged (logger ``nsjms.filter``) because the IDL exception has no field for it.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

import omniORB
from omniORB import CORBA

import CosNotification
import CosNotifyComm
import CosNotifyFilter
import CosNotifyFilter__POA

from router.channel.boundary import store_boundary
from router.channel.events import Form
from router.channel.gate import Gate
from router.channel.queue import Record
from router.cluster.forward import FILTER_SPAN, filter_channel, filter_id
from router.corbacall import FILTER, NOTIFY, CallFailed, call
from router.etcl import Constraint, EtclSyntaxError, compile_constraint, event_type_matches

__all__ = ["GRAMMAR", "ChannelFilterFactory", "FilterFactoryImpl", "FilterImpl", "MappingFilterImpl",
           "filter_factory_oid", "filter_oid"]

log = logging.getLogger("nsjms.filter")

GRAMMAR = "EXTENDED_TCL"
_ANY_TYPE = ("", "%ANY")
_TYPED_TYPE = ("", "%TYPED")


def filter_oid(fid: int) -> str:
    return f"flt/{fid}"


def filter_factory_oid(cid: int) -> str:
    """The object id of channel ``cid``'s filter factory (under the channel's: it moves and forwards with it)."""
    return f"ch/{cid}/ff"


# -- value (de)serialisation -------------------------------------------------------------------------------
def _any_to_text(value: Any) -> str:
    return base64.b64encode(omniORB.cdrMarshal(CORBA.TC_any, value)).decode("ascii")


def _any_from_text(text: str) -> Any:
    return omniORB.cdrUnmarshal(CORBA.TC_any, base64.b64decode(text))


def _event_type(domain: str, type_name: str) -> Any:
    return CosNotification.EventType(domain, type_name)


@dataclass(frozen=True)
class Compiled:
    """One constraint of a filter: id, event types, compiled expression, and the mapped value (mapping filters)."""

    id: int
    types: tuple[tuple[str, str], ...]
    constraint: Constraint
    value: Any = None
    patterns: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "patterns", tuple(_Pattern(d, t) for d, t in self.types))

    @property
    def all_types(self) -> bool:
        return not self.types

    def exp(self) -> Any:
        return CosNotifyFilter.ConstraintExp([_event_type(d, t) for d, t in self.types], self.constraint.expression)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "types": [list(t) for t in self.types],
                               "expr": self.constraint.expression}
        if self.value is not None:
            out["value"] = _any_to_text(self.value)
        return out


def compile_exp(exp: Any, cid: int, value: Any = None) -> Compiled:
    """Compile a ``ConstraintExp``; raise ``InvalidConstraint(exp)`` (unchanged) on a syntax error."""
    try:
        constraint = compile_constraint(str(exp.constraint_expr))
    except (EtclSyntaxError, TypeError) as exc:
        position, message = getattr(exc, "position", -1), getattr(exc, "message", str(exc))
        log.info("invalid constraint %r: %s at position %d", exp.constraint_expr, message, position)
        raise CosNotifyFilter.InvalidConstraint(exp) from None
    types = tuple((str(t.domain_name), str(t.type_name)) for t in exp.event_types)
    return Compiled(cid, types, constraint, value)


def _from_json(item: dict[str, Any]) -> Compiled:
    value = _any_from_text(item["value"]) if "value" in item else None
    types = tuple((str(d), str(t)) for d, t in item["types"])
    return Compiled(int(item["id"]), types, compile_constraint(item["expr"]), value)


def _matching(constraints: Sequence[Compiled], domain: str, type_name: str) -> Iterable[Compiled]:
    """Constraints whose event-type list admits the type (checked before the expression, NS 2.3)."""
    return (c for c in constraints if not c.types or event_type_matches(c.patterns, domain, type_name))


@dataclass(frozen=True)
class _Pattern:
    domain_name: str
    type_name: str


def _structured_type(event: Any) -> tuple[str, str]:
    et = event.header.fixed_header.event_type
    return str(et.domain_name), str(et.type_name)


def types_for(constraints: Iterable[Compiled]) -> list[Any]:
    """The event types a set of constraints subscribes to; an all-types constraint is ``%ALL`` (NS 2.6.6)."""
    seen: dict[tuple[str, str], None] = {}
    for c in constraints:
        for d, t in (c.types or (("", "%ALL"),)):
            if (d, t) in (("", ""), ("*", "*"), ("", "*")):
                d, t = "", "%ALL"
            seen[(d, t)] = None
    return [_event_type(d, t) for d, t in seen]


# -- persistence -------------------------------------------------------------------------------------------
class FilterRepo:
    """SQL for ``nsjms_filter`` (created by migration 0001); one row per filter, rewritten as a whole on each change
    (one statement). Each method is one unit of work of the node's :class:`router.db.Database`."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def next_id(self) -> int:
        with self.db.unit_of_work() as conn:
            row = conn.execute("SELECT nextval('nsjms_filter_id')").fetchone()
        return int(row[0])

    def insert(self, fid: int, kind: str, grammar: str, default_value: str | None) -> None:
        with self.db.unit_of_work() as conn:
            conn.execute("INSERT INTO nsjms_filter(id, kind, grammar, default_value) VALUES (%s, %s, %s, %s)",
                         (fid, kind, grammar, default_value))

    def save(self, fid: int, next_cid: int, constraints: list[dict[str, Any]], callbacks: dict[str, str],
             next_cb: int) -> None:
        with self.db.unit_of_work() as conn:
            conn.execute("UPDATE nsjms_filter SET next_cid = %s, constraints = %s, callbacks = %s, next_cb = %s "
                         "WHERE id = %s", (next_cid, Jsonb(constraints), Jsonb(callbacks), next_cb, fid))

    def delete(self, fid: int) -> None:
        with self.db.unit_of_work() as conn:
            conn.execute("DELETE FROM nsjms_filter WHERE id = %s", (fid,))

    def load(self, channels: Collection[int] | None = None) -> list[tuple[Any, ...]]:
        """Every filter (``channels`` None), or those of ``channels`` and those no running channel serves: made by
        the node-level factory, or by a channel destroyed since (a filter outlives its channel, as before)."""
        cols = "f.id, f.kind, f.grammar, f.default_value, f.next_cid, f.constraints, f.callbacks, f.next_cb"
        with self.db.unit_of_work() as conn:
            if channels is None:
                return list(conn.execute(f"SELECT {cols} FROM nsjms_filter f ORDER BY f.id").fetchall())
            return list(conn.execute(
                f"SELECT {cols} FROM nsjms_filter f WHERE f.id < %(span)s OR f.id / %(span)s - 1 = ANY(%(cids)s) "
                "OR NOT EXISTS (SELECT 1 FROM nsjms_channel c WHERE c.id = f.id / %(span)s - 1) ORDER BY f.id",
                {"span": FILTER_SPAN, "cids": sorted(channels)}).fetchall())


# -- servants ----------------------------------------------------------------------------------------------
class _FilterBase:
    """State shared by Filter and MappingFilter: constraints, ids, callbacks, persistence, destroy."""

    kind = "F"

    def __init__(self, factory: FilterFactoryImpl, fid: int, grammar: str) -> None:
        self.factory = factory
        self.rt = factory.rt
        self.id = fid
        self.grammar = grammar
        self.oid = filter_oid(fid)
        self._lock = threading.RLock()
        self.constraints: tuple[Compiled, ...] = ()      # replaced as a whole (atomic for readers)
        self._next_cid = 1
        self._callbacks: dict[int, str] = {}             # CallbackID -> IOR
        self._callback_refs: dict[int, Any] = {}
        self._next_cb = 1
        self.destroyed = False
        self._notify_lock = threading.Lock()
        self.ref: Any = None
        #: deactivated here because its channel went to another node: who held this servant asks the reference
        self.retired = False

    def activate(self) -> Any:
        self.ref = self.rt.activate(self.oid, self)
        return self.ref

    def restore_state(self, next_cid: int, items: list[dict[str, Any]], callbacks: dict[str, str],
                      next_cb: int) -> None:
        self.constraints = tuple(_from_json(i) for i in items)
        self._next_cid, self._next_cb = next_cid, next_cb
        self._callbacks = {int(k): v for k, v in callbacks.items()}

    def _check_alive(self) -> None:
        if self.destroyed:
            raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)

    def _get_constraint_grammar(self) -> str:
        return self.grammar

    # -- atomic change -------------------------------------------------------------------------------------
    def _commit(self, new: tuple[Compiled, ...], next_cid: int) -> None:
        """Persist then publish a new constraint set (caller holds the lock)."""
        self.factory.repo.save(self.id, next_cid, [c.to_json() for c in new],
                               {str(k): v for k, v in self._callbacks.items()}, self._next_cb)
        self.constraints, self._next_cid = new, next_cid

    def _change(self, new: tuple[Compiled, ...], next_cid: int, old: tuple[Compiled, ...]) -> None:
        self._commit(new, next_cid)
        self.factory.constraints_changed()
        old_ids, new_ids = {c.id: c for c in old}, {c.id: c for c in new}
        added = [c for i, c in new_ids.items() if i not in old_ids or old_ids[i].types != c.types]
        removed = [c for i, c in old_ids.items() if i not in new_ids or new_ids[i].types != c.types]
        self._notify(added, removed)

    def _find(self, cid: int) -> Compiled:
        for c in self.constraints:
            if c.id == cid:
                return c
        raise CosNotifyFilter.ConstraintNotFound(cid)

    def _remove_ids(self, ids: Sequence[int]) -> dict[int, Compiled]:
        current = {c.id: c for c in self.constraints}
        for cid in ids:
            if cid not in current:
                raise CosNotifyFilter.ConstraintNotFound(cid)
        return current

    def _remove_all(self) -> None:
        with self._lock:
            self._check_alive()
            old = self.constraints
            self._change((), self._next_cid, old)

    # -- callbacks (NS 3.2.1.11-13, 2.6.5) -------------------------------------------------------------
    def attach_callback(self, callback: Any) -> int:
        with self._lock:
            self._check_alive()
            if callback is None or (isinstance(callback, CORBA.Object) and CORBA.is_nil(callback)):
                raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
            cb = self._next_cb
            self._next_cb += 1
            self._callbacks[cb] = self.rt.ior(callback)
            self._callback_refs[cb] = callback
            self._commit(self.constraints, self._next_cid)
            return cb

    def detach_callback(self, callback: int) -> None:
        with self._lock:
            self._check_alive()
            if callback not in self._callbacks:
                raise CosNotifyFilter.CallbackNotFound()
            del self._callbacks[callback]
            self._callback_refs.pop(callback, None)
            self._commit(self.constraints, self._next_cid)

    def get_callbacks(self) -> list[int]:
        with self._lock:
            return sorted(self._callbacks)

    def _callback_targets(self) -> list[Any]:
        out = []
        for cb, ior in sorted(self._callbacks.items()):
            ref = self._callback_refs.get(cb)
            if ref is None:
                ref = self.rt.resolve(ior)._unchecked_narrow(CosNotifyComm.NotifySubscribe)
                self._callback_refs[cb] = ref
            out.append(ref)
        return out

    def _notify(self, added: list[Compiled], removed: list[Compiled]) -> None:
        """Tell every callback which event types came and went (asynchronously, in order)."""
        if not self._callbacks or not (added or removed):
            return
        add_t, rem_t = types_for(added), types_for(removed)
        targets = self._callback_targets()

        def run() -> None:
            with self._notify_lock:
                for ref in targets:
                    _call_subscription_change(self.rt, ref, add_t, rem_t)

        self.rt.spawn(f"notify-{self.oid}", run)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def destroy(self) -> None:
        with self._lock:
            if self.destroyed:
                return
            self.destroyed = True
        self.factory.forget(self)
        self.factory.repo.delete(self.id)
        self.rt.deactivate(self.oid)
        self.factory.constraints_changed()


def _call_subscription_change(rt: Any, ref: Any, added: list[Any], removed: list[Any]) -> None:
    target = rt.endpoints.servant(ref) or ref
    try:
        call(target, "subscription_change", added, removed, policy=NOTIFY,
             expected=(CosNotifyComm.InvalidEventType,))
    except (CallFailed, CosNotifyComm.InvalidEventType) as exc:
        log.info("filter callback subscription_change failed: %s", exc)


class FilterImpl(_FilterBase, CosNotifyFilter__POA.Filter):
    """A forwarding filter: TRUE if any constraint matches (OR, NS 3.2.1.8)."""

    kind = "F"

    def add_constraints(self, constraint_list: list[Any]) -> list[Any]:
        with self._lock:
            self._check_alive()
            cid = self._next_cid
            compiled = []
            for exp in constraint_list:
                compiled.append(compile_exp(exp, cid))
                cid += 1
            old = self.constraints
            self._change(old + tuple(compiled), cid, old)
            return [CosNotifyFilter.ConstraintInfo(c.exp(), c.id) for c in compiled]

    def modify_constraints(self, del_list: list[int], modify_list: list[Any]) -> None:
        with self._lock:
            self._check_alive()
            current = self._remove_ids(del_list)
            replaced: dict[int, Compiled] = {}
            for info in modify_list:
                if info.constraint_id not in current:
                    raise CosNotifyFilter.ConstraintNotFound(info.constraint_id)
                replaced[info.constraint_id] = compile_exp(info.constraint_expression, info.constraint_id)
            old = self.constraints
            new = tuple(replaced.get(c.id, c) for c in old if c.id not in set(del_list))
            self._change(new, self._next_cid, old)

    def get_constraints(self, id_list: list[int]) -> list[Any]:
        self._check_alive()
        return [CosNotifyFilter.ConstraintInfo(c.exp(), c.id) for c in (self._find(i) for i in id_list)]

    def get_all_constraints(self) -> list[Any]:
        self._check_alive()
        return [CosNotifyFilter.ConstraintInfo(c.exp(), c.id) for c in self.constraints]

    def remove_all_constraints(self) -> None:
        self._remove_all()

    # -- matching ---------------------------------------------------------------------------------------
    def match_structured(self, filterable_data: Any) -> bool:
        self._check_alive()
        domain, type_name = _structured_type(filterable_data)
        return any(c.constraint.match_structured(filterable_data)
                   for c in _matching(self.constraints, domain, type_name))

    def match(self, filterable_data: Any) -> bool:
        self._check_alive()
        return any(c.constraint.match_any(filterable_data) for c in _matching(self.constraints, *_ANY_TYPE))

    def match_typed(self, filterable_data: list[Any]) -> bool:
        self._check_alive()
        return any(c.constraint.match_typed(filterable_data) for c in _matching(self.constraints, *_TYPED_TYPE))


class MappingFilterImpl(_FilterBase, CosNotifyFilter__POA.MappingFilter):
    """A mapping filter: the value of the best-valued matching constraint, else ``default_value`` (3.2.2)."""

    kind = "M"

    def __init__(self, factory: FilterFactoryImpl, fid: int, grammar: str, default_value: Any) -> None:
        super().__init__(factory, fid, grammar)
        self.default_value = default_value
        self.value_type = default_value.typecode()

    def _get_value_type(self) -> Any:
        return self.value_type

    def _get_default_value(self) -> Any:
        return self.default_value

    def _compile_pair(self, exp: Any, value: Any, cid: int) -> Compiled:
        compiled = compile_exp(exp, cid, value)
        if value is None or not value.typecode().equivalent(self.value_type):
            raise CosNotifyFilter.InvalidValue(exp, value)
        return compiled

    def _ordered(self, items: Iterable[Compiled]) -> tuple[Compiled, ...]:
        """Best value first: numbers descending (highest priority / longest lifetime), else insertion order."""
        items = tuple(items)
        try:
            return tuple(sorted(items, key=lambda c: -_numeric(c.value)))
        except (TypeError, ValueError):
            return items

    def add_mapping_constraints(self, pair_list: list[Any]) -> list[Any]:
        with self._lock:
            self._check_alive()
            cid = self._next_cid
            compiled = []
            for pair in pair_list:
                compiled.append(self._compile_pair(pair.constraint_expression, pair.result_to_set, cid))
                cid += 1
            old = self.constraints
            self._change(self._ordered(old + tuple(compiled)), cid, old)
            return [_mapping_info(c) for c in compiled]

    def modify_mapping_constraints(self, del_list: list[int], modify_list: list[Any]) -> None:
        with self._lock:
            self._check_alive()
            current = self._remove_ids(del_list)
            replaced: dict[int, Compiled] = {}
            for info in modify_list:
                if info.constraint_id not in current:
                    raise CosNotifyFilter.ConstraintNotFound(info.constraint_id)
                replaced[info.constraint_id] = self._compile_pair(info.constraint_expression, info.value,
                                                                  info.constraint_id)
            old = self.constraints
            kept = (replaced.get(c.id, c) for c in old if c.id not in set(del_list))
            self._change(self._ordered(kept), self._next_cid, old)

    def get_mapping_constraints(self, id_list: list[int]) -> list[Any]:
        self._check_alive()
        return [_mapping_info(self._find(i)) for i in id_list]

    def get_all_mapping_constraints(self) -> list[Any]:
        self._check_alive()
        return [_mapping_info(c) for c in sorted(self.constraints, key=lambda c: c.id)]

    def remove_all_mapping_constraints(self) -> None:
        self._remove_all()

    def restore_state(self, next_cid: int, items: list[dict[str, Any]], callbacks: dict[str, str],
                      next_cb: int) -> None:
        super().restore_state(next_cid, items, callbacks, next_cb)
        self.constraints = self._ordered(self.constraints)

    # -- matching ---------------------------------------------------------------------------------------
    def _first(self, hits: Iterable[Compiled]) -> tuple[bool, Any]:
        for c in hits:
            return True, c.value
        return False, self.default_value

    def match_structured(self, filterable_data: Any) -> tuple[bool, Any]:
        self._check_alive()
        domain, type_name = _structured_type(filterable_data)
        return self._first(c for c in _matching(self.constraints, domain, type_name)
                           if c.constraint.match_structured(filterable_data))

    def match(self, filterable_data: Any) -> tuple[bool, Any]:
        self._check_alive()
        return self._first(c for c in _matching(self.constraints, *_ANY_TYPE)
                           if c.constraint.match_any(filterable_data))

    def match_typed(self, filterable_data: list[Any]) -> tuple[bool, Any]:
        self._check_alive()
        return self._first(c for c in _matching(self.constraints, *_TYPED_TYPE)
                           if c.constraint.match_typed(filterable_data))


def _numeric(value: Any) -> float:
    v = value.value()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("not numeric")
    return float(v)


def _mapping_info(c: Compiled) -> Any:
    return CosNotifyFilter.MappingConstraintInfo(c.exp(), c.id, c.value)


class FilterFactoryImpl(CosNotifyFilter__POA.FilterFactory):
    """The node's filter factory (object id ``flt/factory``); every channel's ``default_filter_factory``."""

    OID = "flt/factory"

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.repo = FilterRepo(rt.db)
        self._lock = threading.Lock()
        self.filters: dict[int, _FilterBase] = {}
        self.ref: Any = None
        self.on_change: Any = None            # called after any constraint change (subscription sharing)

    def activate(self) -> Any:
        self.ref = self.rt.activate(self.OID, self)
        return self.ref

    def restore(self, channels: Collection[int] | None = None) -> list[int]:
        """Activate stored filters under their object ids: every one (``channels`` None), or those of
        ``channels`` (the channels this node loads: at its start, a takeover, a hand-off) and those of no running
        channel (module docstring). One already active here is kept. Returns the ids activated."""
        done = []
        for fid, kind, grammar, default, next_cid, items, callbacks, next_cb in self.repo.load(channels):
            flt: _FilterBase
            with self._lock:
                if int(fid) in self.filters:
                    continue
            if kind == "M":
                flt = MappingFilterImpl(self, int(fid), grammar, _any_from_text(default))
            else:
                flt = FilterImpl(self, int(fid), grammar)
            flt.restore_state(int(next_cid), list(items), dict(callbacks), int(next_cb))
            with self._lock:
                if flt.id in self.filters:
                    continue
                self.filters[flt.id] = flt
            try:
                flt.activate()
            except BaseException:                # not kept half-made: the next restore activates it (all or nothing)
                self.forget(flt)
                raise
            done.append(flt.id)
        if done:
            log.info("restored %d filter(s)", len(done))
        return done

    def retire(self, channel: int) -> list[int]:
        """Deactivate the filters of ``channel`` here (it is handed to another node, which loads them from
        PostgreSQL and serves them; requests here are then forwarded). Their stored rows stay."""
        with self._lock:
            gone = [f for f in self.filters.values() if filter_channel(f.id) == channel]
            for f in gone:
                del self.filters[f.id]
        for f in gone:
            f.retired = True
            self.rt.deactivate(f.oid)
        return [f.id for f in gone]

    def _new_id(self, channel: int | None) -> int:
        n = self.repo.next_id()
        return n if channel is None else filter_id(channel, n)

    def create_filter(self, constraint_grammar: str, channel: int | None = None) -> Any:
        self._check_grammar(constraint_grammar)
        fid = self._new_id(channel)
        self.repo.insert(fid, "F", GRAMMAR, None)
        return self._register(FilterImpl(self, fid, GRAMMAR))

    def create_mapping_filter(self, constraint_grammar: str, default_value: Any, channel: int | None = None) -> Any:
        self._check_grammar(constraint_grammar)
        if default_value is None:
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        fid = self._new_id(channel)
        self.repo.insert(fid, "M", GRAMMAR, _any_to_text(default_value))
        return self._register(MappingFilterImpl(self, fid, GRAMMAR, default_value))

    @staticmethod
    def _check_grammar(grammar: str) -> None:
        if grammar != GRAMMAR:
            raise CosNotifyFilter.InvalidGrammar()

    def _register(self, flt: _FilterBase) -> Any:
        with self._lock:
            self.filters[flt.id] = flt
        return flt.activate()

    def constraints_changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("subscription sharing after a constraint change failed")

    def forget(self, flt: _FilterBase) -> None:
        with self._lock:
            self.filters.pop(flt.id, None)


class ChannelFilterFactory(CosNotifyFilter__POA.FilterFactory):
    """One channel's ``default_filter_factory`` (object id ``ch/<channel>/ff``): the node's factory making filters
    that belong to this channel (module docstring)."""

    def __init__(self, node: FilterFactoryImpl, channel: int, gate: Gate | None = None) -> None:
        self.node, self.channel = node, channel
        self.gate = gate if gate is not None else Gate()

    # Through the channel's gate (router/channel/gate.py): not while the channel is handed to another node
    # (TRANSIENT, nothing made), and the hand-off waits for a filter being made, so its row is written and it is
    # registered here before the channel's filters are retired and the next owner loads them (review finding: one
    # made during the stop was served here beside the next owner's copy).
    def create_filter(self, constraint_grammar: str) -> Any:
        with self.gate.passing():
            return self.node.create_filter(constraint_grammar, self.channel)

    def create_mapping_filter(self, constraint_grammar: str, default_value: Any) -> Any:
        with self.gate.passing():
            return self.node.create_mapping_filter(constraint_grammar, default_value, self.channel)


# -- mapping filters applied by proxy suppliers (NS 2.3.1, spec digest §8.3) --------------------------------
def ask_mapping(rt: Any, mf: Any, event: Any) -> tuple[bool, Any]:
    """``match_*`` of a mapping filter (in process when local); an unanswerable filter counts as no match."""

    target = rt.endpoints.servant(mf) or mf
    try:
        op = "match_structured" if event.form is Form.STRUCTURED else "match"
        ok, value = call(target, op, event.value, policy=FILTER, expected=(CosNotifyFilter.UnsupportedFilterableData,))
        return bool(ok), value
    except (CallFailed, CosNotifyFilter.UnsupportedFilterableData) as exc:
        log.warning("mapping filter could not evaluate an event: %s", exc)
        return False, None


def _header_has(event: Any, name: str) -> bool:

    return event.form is Form.STRUCTURED and any(p.name == name for p in event.value.header.variable_header)


def mapped_priority(rt: Any, mf: Any, record: Any) -> int:
    """Priority for one proxy's copy: the filter's value on a match, else the record's (header or QoS)."""
    ok, value = ask_mapping(rt, mf, record.event)
    if ok:
        try:
            return int(value.value())
        except (TypeError, ValueError, AttributeError):
            return int(record.priority)
    return int(record.priority)


def mapped_deadline(rt: Any, mf: Any, record: Any, now: float) -> float | None:
    """Deadline for one proxy's copy: the filter's lifetime (TimeT) on a match; else the header/QoS deadline;
    else the filter's ``default_value`` (NS 2.3.1 three-step rule; a Timeout of 0 means "not set")."""
    deadline: float | None = record.deadline
    ok, value = ask_mapping(rt, mf, record.event)
    if not ok and (deadline is not None or _header_has(record.event, "Timeout")):
        return deadline
    try:
        lifetime = int(value.value()) if value is not None else 0
    except (TypeError, ValueError, AttributeError):
        return deadline
    return now + lifetime / 10_000_000 if lifetime > 0 else deadline


def proxy_view(record: Record, priority: int, deadline: float | None) -> Record:
    """A per-proxy copy of a record with its own priority/deadline; the event itself is shared, never changed.

    The copy holds the original record until it is released, so the stored event lives as long as any copy.
    """
    record.hold()
    return Record(record.seq, record.event, priority, deadline, record.start_at, record.persistent,
                  record.db_id, size=record.size, on_released=lambda _view: record.release())


store_boundary(FilterImpl, MappingFilterImpl, FilterFactoryImpl)   # (ChannelFilterFactory calls these)
