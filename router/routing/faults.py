"""The minor codes of nsjms's CORBA system exceptions and the store-failure boundary of its servants.

Both the channel's servants and the bridge's wrap their IDL operations in :func:`store_boundary`, so a client sees
a CORBA system exception it can act on instead of ``UNKNOWN`` (the table is in ``router.channel.boundary``); the
bridge reads the channel's refusals by their minor codes (``MINOR_EVENT_TOO_LARGE``). Minor codes carry the
unofficial vendor id ``NSJMS_VMCID`` (``0x4E530000``, "NS"), which the OMG did not assign; they are documented in
``docs/channel.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from omniORB import CORBA

from router.db.errors import StoreError, StoreTimeout, StoreUnavailable

__all__ = ["MINOR_EVENT_TOO_DEEP", "MINOR_EVENT_TOO_LARGE", "MINOR_PULL_WAIT_OVER", "MINOR_STORE_FAILED",
           "MINOR_STORE_TIMEOUT", "MINOR_STORE_UNAVAILABLE", "NSJMS_VMCID", "store_boundary", "store_faults"]

NSJMS_VMCID = 0x4E530000
MINOR_EVENT_TOO_LARGE = NSJMS_VMCID | 1
MINOR_STORE_UNAVAILABLE = NSJMS_VMCID | 2
MINOR_STORE_FAILED = NSJMS_VMCID | 3
MINOR_PULL_WAIT_OVER = NSJMS_VMCID | 4
MINOR_STORE_TIMEOUT = NSJMS_VMCID | 5
MINOR_EVENT_TOO_DEEP = NSJMS_VMCID | 0x20


@contextmanager
def store_faults() -> Iterator[None]:
    """Translate the store's exceptions into the CORBA system exceptions a client can act on."""
    try:
        yield
    except StoreUnavailable as exc:
        completion = CORBA.COMPLETED_MAYBE if exc.in_doubt else CORBA.COMPLETED_NO
        raise CORBA.TRANSIENT(MINOR_STORE_UNAVAILABLE, completion) from exc
    except StoreTimeout as exc:
        raise CORBA.TRANSIENT(MINOR_STORE_TIMEOUT, CORBA.COMPLETED_NO) from exc
    except StoreError as exc:
        raise CORBA.PERSIST_STORE(MINOR_STORE_FAILED, CORBA.COMPLETED_NO) from exc


def store_boundary(*classes: type) -> None:
    """Wrap every IDL operation of these servant classes (the names in their skeleton's ``_omni_op_d``) in
    :func:`store_faults`, so no operation answers ``UNKNOWN`` for a database failure. Idempotent."""
    for cls in classes:
        for name in getattr(cls, "_omni_op_d", {}):
            impl = getattr(cls, name, None)
            if callable(impl) and not getattr(impl, "_store_boundary", False):
                setattr(cls, name, _guarded(impl))


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        with store_faults():
            return fn(*args, **kwargs)

    op._store_boundary = True  # type: ignore[attr-defined]
    return op
