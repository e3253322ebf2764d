"""Bounds on hostile input for the JMS -> event decoders: JSON nesting, CDR size and nesting, value depth.

A JMS message is untrusted input. Three things in it could otherwise escape as something other than
:class:`~router.mapping.errors.MappingError`, or take the process down:

* ``json.loads`` and ``repr`` recurse: a deeply nested manifest or map/stream body raises ``RecursionError``.
  :func:`load_json` catches that and then checks the nesting with an iterative walk (:data:`MAX_JSON_DEPTH`).
* ``omniORB.cdrUnmarshal`` recurses on the C stack: a nested Any 70,000 levels deep (about 1 MB of CDR) overflows
  an 8 MiB thread stack and kills the process with SIGSEGV. :func:`unmarshal` refuses CDR above
  :data:`MAX_CDR_BYTES`, unmarshals anything above :data:`INLINE_CDR_BYTES` on a helper thread whose stack holds
  the deepest value that size allows (measured: under 270 bytes of stack per level, at least 12 bytes of CDR per
  level), and then refuses values nested deeper than :data:`MAX_VALUE_DEPTH`, so nothing downstream (the
  channel's own CDR encoding, filters) ever recurses that deep.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import omniORB
from omniORB import CORBA

from router.mapping.errors import MappingError

__all__ = ["INLINE_CDR_BYTES", "MAX_CDR_BYTES", "MAX_JSON_DEPTH", "MAX_TYPE_DEPTH", "MAX_VALUE_DEPTH",
           "json_depth", "load_json", "unmarshal", "value_depth"]

#: JSON nesting accepted in a manifest or a map/stream body (a struct descriptor takes 3 levels per IDL level).
MAX_JSON_DEPTH = 200
#: IDL type nesting accepted in a manifest type descriptor (structs in structs, aliases of aliases, ...).
MAX_TYPE_DEPTH = 64
#: Nesting of the Python objects an unmarshalled CDR value consists of (an Any in a sequence counts 3 levels).
MAX_VALUE_DEPTH = 400
#: Largest CDR encapsulation (a ``cdr`` body or property, a ``tc:`` descriptor) decoded from a JMS message.
MAX_CDR_BYTES = 8 * 1024 * 1024
#: CDR up to this size is decoded on the calling thread (at most ~1,400 levels: safe on any thread stack).
INLINE_CDR_BYTES = 16 * 1024
_BIG_STACK = 256 * 1024 * 1024          # 8 MiB of CDR at 12 bytes and < 270 stack bytes a level: < 190 MiB
_STACK_LOCK = threading.Lock()          # threading.stack_size is process-wide

T = TypeVar("T")


def load_json(text: str | bytes, field: str, what: str) -> Any:
    """``json.loads`` that raises only :class:`MappingError` (also for nesting beyond :data:`MAX_JSON_DEPTH`)."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise MappingError(f"{what} is nested too deeply", field) from None
    except ValueError:
        raise MappingError(f"{what} is not JSON", field) from None
    if json_depth(doc, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise MappingError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels", field)
    return doc


def json_depth(doc: object, limit: int) -> int:
    """Nesting depth of lists and dicts in ``doc``; stops counting once above ``limit`` (level by level, so it
    cannot itself recurse)."""
    level: list[list[Any] | dict[Any, Any]] = [doc] if isinstance(doc, (list, dict)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return depth
        below: list[list[Any] | dict[Any, Any]] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below.extend([c for c in children if isinstance(c, (list, dict))])
        level = below
    return depth


def unmarshal(tc: Any, data: bytes, field: str) -> Any:
    """``omniORB.cdrUnmarshal(tc, data)`` for untrusted bytes: size- and depth-bounded, errors as MappingError."""
    if len(data) > MAX_CDR_BYTES:
        raise MappingError(f"CDR encapsulation of {len(data)} bytes exceeds the limit of {MAX_CDR_BYTES}", field)
    if len(data) <= INLINE_CDR_BYTES:
        value = _unmarshal_now(tc, data, field)
    else:
        value = _on_big_stack(lambda: _unmarshal_now(tc, data, field))
    if value_depth(value, MAX_VALUE_DEPTH) > MAX_VALUE_DEPTH:
        raise MappingError(f"CDR value nested deeper than {MAX_VALUE_DEPTH} levels", field)
    return value


def _unmarshal_now(tc: Any, data: bytes, field: str) -> Any:
    try:
        return omniORB.cdrUnmarshal(tc, data)
    except (CORBA.SystemException, TypeError, ValueError) as exc:
        raise MappingError(f"invalid CDR encapsulation: {exc}", field) from exc


def _on_big_stack(work: Callable[[], T]) -> T:
    """Run ``work`` on a helper thread with a :data:`_BIG_STACK` stack; re-raise what it raised."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # noqa: BLE001 — handed back to the caller below
            failure.append(exc)

    with _STACK_LOCK:
        previous = threading.stack_size(_BIG_STACK)
        try:
            thread = threading.Thread(target=run, name="nsjms-cdr-decode", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def value_depth(value: object, limit: int) -> int:
    """Nesting depth of an unmarshalled omniORBpy value (lists, tuples, Anys, structs, unions, and the TypeCode
    descriptors inside Anys); stops counting once above ``limit``. Iterative, so it cannot itself overflow. Within
    a TypeCode descriptor, an object already seen is not entered again (recursive types refer back to themselves).
    """
    deepest = 0
    stack: list[tuple[object, int, bool]] = [(value, 1, False)]
    seen: set[int] = set()
    while stack:
        item, depth, in_type = stack.pop()
        children = _children(item)
        if children is None:
            continue
        if in_type:
            if id(item) in seen:
                continue
            seen.add(id(item))
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        typed = in_type or isinstance(item, CORBA.TypeCode)
        stack.extend((child, depth + 1, typed) for child in children)
    return deepest


def _children(item: object) -> list[object] | None:
    if item is None or isinstance(item, (str, bytes, int, float, bool, type)):
        return None
    if isinstance(item, (list, tuple)):
        return list(item)
    if isinstance(item, CORBA.Any):
        return [item.typecode(), item.value()]
    if isinstance(item, CORBA.TypeCode):
        return [getattr(item, "_d", None)]
    attrs = getattr(item, "__dict__", None)
    return list(attrs.values()) if isinstance(attrs, dict) else None
