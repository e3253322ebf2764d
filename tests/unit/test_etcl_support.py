"""Shared helpers for the ETCL unit tests (no tests here).

``load_idl()`` compiles a small test IDL with the ``omniidl`` that ships with omniORBpy and imports the
generated stubs once per process, so the tests use real generated structs, unions and enums.
Test modules load this file by path (see ``_support()`` in each), so the package layout of ``tests``
does not matter.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import omniORB  # noqa: F401  (before CosNotification)
from omniORB import CORBA

import CosNotification as N

TEST_IDL = r"""
module EtclTest {
  enum Kind { HOUSE, CAR, BOAT };
  struct Asset { Kind _in; long value; };
  struct X { long A; string B; short C; };
  union K switch (short) { case 0: case 2: string S; case 3: X L; case 5: long M; default: short N; };
  union NoDef switch (long) { case 1: long a; case 2: string b; };
  union DefUnion switch (long) { case 1: string text; default: long defvalue; };
  union ByKind switch (Kind) { case HOUSE: string address; case CAR: long wheels; };
  union ByChar switch (char) { case 'a': long x; default: string y; };
  union ByKindDef switch (Kind) { case HOUSE: case BOAT: string place; default: long other; };
  union ByBool switch (boolean) { case TRUE: long yes; case FALSE: string no; };
  enum Way { _in, outward };
  union ByWay switch (Way) { case _in: long inbound; case outward: string outbound; };
  typedef Kind KindAlias;
  union ByAlias switch (KindAlias) { case CAR: long cars; case BOAT: string boats; };
  struct TestResult { string name; long score; };
  typedef sequence<TestResult> ResultSeq;
  struct Student { string name; ResultSeq test; };
  struct Proc { long memsize; double cputime; long filesize; };
  struct Numbers { short s; unsigned short us; long l; unsigned long ul; long long ll;
                   unsigned long long ull; float f; double d; octet o; char c; boolean b; };
  typedef short Threshold;
  typedef long Matrix[2][3];
  struct NV { string name; any value; };
  typedef sequence<NV> NVSeq;
  struct Pupil { long gpa; NVSeq tests; sequence<long> monthly_attendance; };
  struct Holder { any memA; any memB; K u; Matrix grid; sequence<octet> raw; sequence<Kind> kinds;
                  sequence<string> names; sequence<any> anys; };
};
module TelecomNotification {
  struct ServiceUserType { string user; };
};
"""


def _omniidl() -> str:
    beside = Path(sys.executable).with_name("omniidl")
    found = str(beside) if beside.exists() else shutil.which("omniidl")
    if not found:
        raise RuntimeError("omniidl (from jeteve-omniorb) is needed by the ETCL tests")
    return found


def load_idl() -> tuple[ModuleType, ModuleType]:
    """The generated ``EtclTest`` and ``TelecomNotification`` modules (compiled on first use)."""
    if "EtclTest" not in sys.modules:
        tmp = Path(tempfile.mkdtemp(prefix="etcl-idl-"))
        try:
            idl = tmp / "etcl_test.idl"
            idl.write_text(TEST_IDL)
            cmd = [_omniidl(), "-bpython", f"-C{tmp}", str(idl)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"omniidl failed: {done.stderr}")
            sys.path.insert(0, str(tmp))
            try:
                importlib.import_module("EtclTest")
                importlib.import_module("TelecomNotification")
            finally:
                sys.path.remove(str(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return sys.modules["EtclTest"], sys.modules["TelecomNotification"]


def any_of(tc: Any, value: Any) -> Any:
    return CORBA.Any(tc, value)


def prop(name: str, value: Any) -> Any:
    """A Property; plain Python values are wrapped with omniORB.any.to_any."""
    from omniORB.any import to_any

    return N.Property(name, value if isinstance(value, CORBA.Any) else to_any(value))


def structured(domain: str = "Telecom", type_name: str = "CommunicationsAlarm", event_name: str = "ev1",
               variable: dict[str, Any] | None = None, filterable: dict[str, Any] | None = None,
               remainder: Any = None) -> Any:
    """A StructuredEvent; dict values become Properties (plain values via to_any)."""
    header = N.EventHeader(N.FixedEventHeader(N.EventType(domain, type_name), event_name),
                           [prop(k, v) for k, v in (variable or {}).items()])
    body = remainder if remainder is not None else CORBA.Any(CORBA.TC_null, None)
    return N.StructuredEvent(header, [prop(k, v) for k, v in (filterable or {}).items()], body)

