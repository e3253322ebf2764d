"""Structural equality of Anys and StructuredEvents (omniORBpy structs and Anys define no ``==``).

Comparing CDR encapsulations does not work either: omniORB leaves alignment padding uninitialised, so equal values
can marshal to different bytes. Two Anys are equal when their TypeCodes are ``equal()`` (names and repository ids
included) and their values are, member by member; floats compare bit-exactly except that NaN equals NaN.
"""

from __future__ import annotations  # noqa: I001  (omniORB must be imported before the COS stubs)

import math
from typing import Any

import omniORB  # noqa: F401  (first: it puts the COS stubs on sys.path)
import CosNotification
from omniORB import CORBA

from router.mapping.idltypes import unalias

__all__ = ["any_equal", "event_equal", "value_equal"]


def event_equal(a: Any, b: Any) -> bool:
    """True when two StructuredEvents are equal field by field (order of header and filterable entries counts)."""
    return value_equal(CosNotification._tc_StructuredEvent, a, b)


def any_equal(a: Any, b: Any) -> bool:
    return bool(a.typecode().equal(b.typecode())) and value_equal(a.typecode(), a.value(), b.value())


def value_equal(tc: Any, a: Any, b: Any) -> bool:
    """Equality of two values of IDL type ``tc``."""
    base = unalias(tc)
    kind = base.kind()
    if kind == CORBA.tk_any:
        return any_equal(a, b)
    if kind in (CORBA.tk_struct, CORBA.tk_except):
        return all(value_equal(base.member_type(i), getattr(a, str(base.member_name(i))),
                               getattr(b, str(base.member_name(i)))) for i in range(int(base.member_count())))
    if kind in (CORBA.tk_sequence, CORBA.tk_array):
        if isinstance(a, (str, bytes)) or isinstance(b, (str, bytes)):
            return type(a) is type(b) and a == b
        content = base.content_type()
        return len(a) == len(b) and all(value_equal(content, x, y) for x, y in zip(a, b, strict=True))
    if kind in (CORBA.tk_float, CORBA.tk_double):
        return _float_equal(float(a), float(b))
    if kind == CORBA.tk_enum:
        return bool(a._v == b._v and a._n == b._n)
    if kind == CORBA.tk_TypeCode:
        return bool(a.equal(b))
    return bool(a == b)


def _float_equal(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
