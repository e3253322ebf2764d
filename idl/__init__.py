"""The project's IDL and its generated omniORBpy stubs.

IDL sources live next to this file (see ``docs/idl.md``); ``idl/generated`` holds the stubs
written by ``python -m idl.build`` (do not edit them). Importing this package has no side
effects; :func:`load` imports omniORB first, which puts the wheel's precompiled COS stubs
(``CosNotification``, ``CosNotifyComm``, ``CosNotifyChannelAdmin`` ...) on ``sys.path``, and
then returns the generated modules::

    stubs = idl.load()
    bridge_ref = orb_object._narrow(stubs["NsjmsAdmin"].ManagedBridge)
    servant_base = stubs["CosBridgeAdmin__POA"].BridgeFactory

``from idl.generated import CosBridgeAdmin, CosBridgeAdmin__POA`` works as well.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

__all__ = ["MODULES", "load"]

#: IDL modules generated into ``idl.generated`` (each also has a ``<name>__POA`` skeleton module).
MODULES = (
    "CosNotifyCommAck",
    "CosNotifyChannelAdminAck",
    "CosBridgeAdmin",
    "BridgeTransactionMgmt",
    "NsjmsAdmin",
)


def load() -> Mapping[str, ModuleType]:
    """Import omniORB, then the generated stub and skeleton modules; map their names to them."""
    importlib.import_module("omniORB")
    names = [n for m in MODULES for n in (m, f"{m}__POA")]
    return MappingProxyType({n: importlib.import_module(f"{__name__}.generated.{n}") for n in names})
