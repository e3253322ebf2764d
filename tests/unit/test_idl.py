"""Tests for the ``idl`` package: the IDL compiles, the committed stubs are current, and the
stubs carry the formal OMG repository ids, inheritance and operation signatures.

Recompiling needs the standard COS IDL (Debian ``omniorb-idl``); when it is missing these
tests fail with the build's message instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import idl
from idl import build

REPO = Path(__file__).resolve().parents[2]
OMG = "IDL:omg.org"

STANDARD_TYPES: dict[str, tuple[str, ...]] = {
    "CosBridgeAdmin": (
        "ExternalEndpointRole", "JMSDestinationType", "MessageType", "JMSDestination", "FlowStyle",
        "ExternalEndpointConnector", "ExternalEndpoint", "ExternalEndpointErrorCode",
        "ExternalEndpointError", "ExternalEndpointErrorSeq", "InvalidExternalEndPoints", "BridgeID",
        "BridgeIDSeq", "BridgeAlreadyStarted", "BridgeInactive", "BridgeNotFound", "Bridge",
        "BridgeFactory",
    ),
    "BridgeTransactionMgmt": (
        "UnsupportedTransaction", "TransactionAlreadyActive", "TransactionActive",
        "TransactionManagement",
    ),
    "CosNotifyCommAck": (
        "SequenceNumbers", "StructuredPushSupplierAck", "StructuredPullSupplierAck",
        "SequencePushSupplierAck", "SequencePullSupplierAck",
    ),
    "CosNotifyChannelAdminAck": (
        "SequenceNumbers", "StructuredProxyPushSupplierAck", "StructuredProxyPullSupplierAck",
        "SequenceProxyPushSupplierAck", "SequenceProxyPullSupplierAck",
    ),
}
NSJMS_TYPES = (
    "status", "EndpointReceiverType", "EndpointReceiver", "EndpointSenderType", "EndpointSender",
    "ManagedBridge", "TransactionRefused", "TransactionAdmin", "DeadLetterRefused", "DeadLetterAdmin",
)
ACK_BASES = {
    ("CosNotifyCommAck", "StructuredPushSupplierAck"): ("CosNotifyComm", "StructuredPushSupplier"),
    ("CosNotifyCommAck", "StructuredPullSupplierAck"): ("CosNotifyComm", "StructuredPullSupplier"),
    ("CosNotifyCommAck", "SequencePushSupplierAck"): ("CosNotifyComm", "SequencePushSupplier"),
    ("CosNotifyCommAck", "SequencePullSupplierAck"): ("CosNotifyComm", "SequencePullSupplier"),
    ("CosNotifyChannelAdminAck", "StructuredProxyPushSupplierAck"):
        ("CosNotifyChannelAdmin", "StructuredProxyPushSupplier"),
    ("CosNotifyChannelAdminAck", "StructuredProxyPullSupplierAck"):
        ("CosNotifyChannelAdmin", "StructuredProxyPullSupplier"),
    ("CosNotifyChannelAdminAck", "SequenceProxyPushSupplierAck"):
        ("CosNotifyChannelAdmin", "SequenceProxyPushSupplier"),
    ("CosNotifyChannelAdminAck", "SequenceProxyPullSupplierAck"):
        ("CosNotifyChannelAdmin", "SequenceProxyPullSupplier"),
}


# ---------------------------------------------------------------- helpers

def _include_dirs() -> tuple[Path, ...]:
    """The COS IDL include directories, or a test failure explaining how to install them."""
    try:
        return build.include_dirs()
    except build.IdlBuildError as exc:
        pytest.fail(f"cannot recompile the IDL: {exc}", pytrace=False)


def _stubs() -> dict[str, ModuleType]:
    return dict(idl.load())


def _cos(name: str) -> ModuleType:
    """A precompiled COS stub module from the omniORB wheel (importable after idl.load())."""
    idl.load()
    return __import__(name)


def _declared_types(module: ModuleType) -> set[str]:
    return {name[len("_tc_"):] for name in vars(module) if name.startswith("_tc_")}


def _tc(desc: Any) -> Any:
    import omniORB

    return omniORB.tcInternal.createTypeCode(desc)


def _expected_files() -> set[str]:
    files = {"__init__.py"}
    for name in idl.MODULES:
        files |= {f"{name}_idl.py", f"{name}/__init__.py", f"{name}__POA/__init__.py"}
    return files


def _listing(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


# ---------------------------------------------------------------- build

def test_idl_compiles_to_exactly_the_project_modules(tmp_path: Path) -> None:
    dest = tmp_path / "generated"
    build.generate(dest, _include_dirs())
    assert _listing(dest) == _expected_files()  # no COS module regenerated into the package


def test_committed_stubs_are_up_to_date() -> None:
    _include_dirs()
    proc = subprocess.run(
        [sys.executable, "-m", "idl.build", "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == build.EXIT_OK, proc.stderr
    assert "up to date" in proc.stdout


def test_check_reports_edited_missing_and_extra_files(tmp_path: Path) -> None:
    dirs = _include_dirs()
    copy = tmp_path / "generated"
    shutil.copytree(build.GENERATED_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "CosBridgeAdmin_idl.py").open("a") as fh:
        fh.write("# hand edit\n")
    (copy / "NsjmsAdmin__POA" / "__init__.py").unlink()
    (copy / "stray.py").write_text("")
    assert build.check(copy, dirs) == [
        "missing: NsjmsAdmin__POA/__init__.py",
        "unexpected: stray.py",
        "differs: CosBridgeAdmin_idl.py",
    ]
    assert build.main(["--check", "--generated-dir", str(copy)]) == build.EXIT_STALE


def test_generate_replaces_stale_files(tmp_path: Path) -> None:
    dest = tmp_path / "generated"
    dest.mkdir()
    (dest / "Obsolete_idl.py").write_text("")
    build.generate(dest, _include_dirs())
    assert build.compare_trees(build.GENERATED_DIR, dest) == []


def test_missing_cos_idl_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absent = tmp_path / "no-such-dir"
    with pytest.raises(build.IdlBuildError, match="omniorb-idl"):
        build.include_dirs({build.INCLUDE_ENV: str(absent)})
    with pytest.raises(build.IdlBuildError, match=r"CosNotifyChannelAdmin\.idl not found"):
        build.include_dirs({build.INCLUDE_ENV: str(tmp_path)})
    monkeypatch.setenv(build.INCLUDE_ENV, str(absent))
    assert build.main(["--check"]) == build.EXIT_ERROR


def test_idl_with_errors_fails_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = _include_dirs()
    bad = tmp_path / "idl"
    bad.mkdir()
    (bad / "Broken.idl").write_text("module Broken { interface I { void op(in Undeclared x); }; };\n")
    monkeypatch.setattr(build, "IDL_DIR", bad)
    with pytest.raises(build.IdlBuildError, match=r"Broken\.idl"):
        build.compile_file("Broken.idl", tmp_path / "out", dirs)


def test_generated_stubs_are_marked_and_portable() -> None:
    package_init = build.GENERATED_DIR / "__init__.py"
    for path in sorted(build.GENERATED_DIR.rglob("*.py")):
        text = path.read_text()
        assert path == package_init or "DO NOT EDIT" in text, path
        for needle in (str(REPO), "/usr/share/idl", "/tmp/", "/work/"):
            assert needle not in text, f"{path} mentions {needle}"
    for name in idl.MODULES:
        first = (build.GENERATED_DIR / f"{name}_idl.py").read_text().splitlines()[0]
        assert first == f"# Python stubs generated by omniidl from {name}.idl"


def test_import_without_importing_omniorb_first() -> None:
    code = (
        "from idl.generated import CosBridgeAdmin, CosBridgeAdmin__POA\n"
        "import sys\n"
        "print(sys.modules['CosNotifyChannelAdmin_idl'].__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).parent.name == "COS"  # the wheel's precompiled COS stub


# ---------------------------------------------------------------- repository ids and shapes

@pytest.mark.parametrize("module_name", sorted(STANDARD_TYPES))
def test_standard_modules_declare_formal_types_and_ids(module_name: str) -> None:
    module = _stubs()[module_name]
    assert _declared_types(module) == set(STANDARD_TYPES[module_name])
    for type_name in STANDARD_TYPES[module_name]:
        expected = f"{OMG}/{module_name}/{type_name}:1.0"
        assert getattr(module, f"_tc_{type_name}").id() == expected
        declared = getattr(module, type_name)
        if hasattr(declared, "_NP_RepositoryId"):
            assert declared._NP_RepositoryId == expected


def test_nsjms_admin_uses_its_own_prefix() -> None:
    module = _stubs()["NsjmsAdmin"]
    assert _declared_types(module) == set(NSJMS_TYPES)
    for type_name in NSJMS_TYPES:
        assert getattr(module, f"_tc_{type_name}").id() == f"IDL:nsjms.org/NsjmsAdmin/{type_name}:1.0"


@pytest.mark.parametrize("ack, base", sorted(ACK_BASES.items()))
def test_ack_interfaces_derive_from_the_notification_interfaces(
    ack: tuple[str, str], base: tuple[str, str]
) -> None:
    stubs = _stubs()
    ack_mod, ack_poa = stubs[ack[0]], stubs[f"{ack[0]}__POA"]
    base_mod, base_poa = _cos(base[0]), _cos(f"{base[0]}__POA")
    assert issubclass(getattr(ack_mod, ack[1]), getattr(base_mod, base[1]))
    assert issubclass(getattr(ack_mod, f"_objref_{ack[1]}"), getattr(base_mod, f"_objref_{base[1]}"))
    assert issubclass(getattr(ack_poa, ack[1]), getattr(base_poa, base[1]))
    assert getattr(ack_poa, ack[1])._NP_RepositoryId == f"{OMG}/{ack[0]}/{ack[1]}:1.0"


@pytest.mark.parametrize("ack", sorted(ACK_BASES))
def test_acknowledge_takes_a_sequence_of_long(ack: tuple[str, str]) -> None:
    import omniORB

    iface = getattr(_stubs()[ack[0]], ack[1])
    in_params, out_params, raises = iface._d_acknowledge
    assert (len(in_params), out_params, raises) == (1, (), None)
    tc = _tc(in_params[0])
    assert tc.id() == f"{OMG}/{ack[0]}/SequenceNumbers:1.0"
    assert tc.content_type().kind() == omniORB.CORBA.tk_sequence
    assert tc.content_type().content_type().kind() == omniORB.CORBA.tk_long


def test_ack_constants_match_the_specification() -> None:
    module = _stubs()["CosNotifyCommAck"]
    assert module.SequenceNumber == "SequenceNumber"
    assert module.DeliveryReliability == "DeliveryReliability"
    assert (module._None, module.Acknowledgment) == (0, 1)  # IDL "None" is a Python keyword
    assert (module.RetryInterval, module.Retries) == ("RetryInterval", "Retries")


def test_bridge_has_the_formal_shape() -> None:
    cba = _stubs()["CosBridgeAdmin"]
    endpoint_id = f"{OMG}/CosBridgeAdmin/ExternalEndpoint:1.0"
    for attr in ("end_point_receiver", "end_point_sender"):
        assert _tc(getattr(cba.Bridge, f"_d__get_{attr}")[1][0]).id() == endpoint_id
    raised = {_tc(d).id() for d in cba.Bridge._d_start_bridge[2].values()}
    assert raised == {f"{OMG}/CosBridgeAdmin/BridgeAlreadyStarted:1.0",
                      f"{OMG}/CosBridgeAdmin/InvalidExternalEndPoints:1.0"}
    objref = cba._objref_Bridge
    assert all(hasattr(objref, op) for op in ("start_bridge", "stop_bridge", "destroy"))
    assert not any(hasattr(objref, op) for op in ("start", "stop", "get_status"))
    style = cba._tc_ExternalEndpoint
    assert (style.member_name(2), style.member_type(2).id()) == ("style", f"{OMG}/CosBridgeAdmin/FlowStyle:1.0")
    assert [str(i) for i in cba.FlowStyle._items] == ["PUSH", "PULL"]


def test_managed_bridge_is_a_bridge_with_transaction_management() -> None:
    stubs = _stubs()
    nsjms, poa = stubs["NsjmsAdmin"], stubs["NsjmsAdmin__POA"]
    for iface in (stubs["CosBridgeAdmin"].Bridge, stubs["BridgeTransactionMgmt"].TransactionManagement):
        assert issubclass(nsjms.ManagedBridge, iface)
    assert issubclass(poa.ManagedBridge, stubs["CosBridgeAdmin__POA"].Bridge)
    assert issubclass(poa.ManagedBridge, stubs["BridgeTransactionMgmt__POA"].TransactionManagement)
    ops = ("start", "stop", "get_status", "start_bridge", "stop_bridge", "destroy",
           "enable_transaction", "disable_transaction", "_get_end_point_receiver", "_get_receiver_ref")
    assert all(hasattr(nsjms._objref_ManagedBridge, op) for op in ops)
    assert _tc(nsjms.ManagedBridge._d_get_status[1][0]).id() == "IDL:nsjms.org/NsjmsAdmin/status:1.0"
    assert [str(i) for i in nsjms.status._items] == ["stopped", "started"]


# ---------------------------------------------------------------- through a (collocated) ORB

_ORB_PROBE = r'''
import json, sys
import idl
from omniORB import CORBA
s = idl.load()
ack, ack_poa = s["CosNotifyChannelAdminAck"], s["CosNotifyChannelAdminAck__POA"]
cba, nsjms, nsjms_poa = s["CosBridgeAdmin"], s["NsjmsAdmin"], s["NsjmsAdmin__POA"]
orb = CORBA.ORB_init(["probe", "-ORBendPoint", "giop:tcp:127.0.0.1:"], CORBA.ORB_ID)
poa = orb.resolve_initial_references("RootPOA")
poa._get_the_POAManager().activate()
out = {}

class Proxy(ack_poa.StructuredProxyPushSupplierAck):
    def __init__(self):
        self.acked = []
    def acknowledge(self, numbers):
        self.acked.append(list(numbers))

class Managed(nsjms_poa.ManagedBridge):
    def get_status(self):
        return nsjms.started
    def start(self):
        raise cba.BridgeAlreadyStarted()
    def _get_end_point_receiver(self):
        conn = cba.ExternalEndpointConnector(cba.STRUCTURED_EVENT, 7)
        return cba.ExternalEndpoint(cba.SINK, conn, cba.PULL, cba.STRUCTURED_EVENT)

proxy = Proxy()
ref = proxy._this()
ref.acknowledge([0, 1, 2**31 - 1])
out["acked"] = proxy.acked
try:
    ref.acknowledge([2**31])
    out["overflow"] = "accepted"
except CORBA.BAD_PARAM:
    out["overflow"] = "BAD_PARAM"
out["proxy_is_a"] = ref._is_a("IDL:omg.org/CosNotifyChannelAdmin/StructuredProxyPushSupplier:1.0")
bridge = Managed()._this()
out["bridge_is_a"] = bridge._is_a("IDL:omg.org/CosBridgeAdmin/Bridge:1.0")
out["tm_is_a"] = bridge._is_a("IDL:omg.org/BridgeTransactionMgmt/TransactionManagement:1.0")
out["status"] = str(bridge.get_status())
try:
    bridge.start()
except cba.BridgeAlreadyStarted as exc:
    out["start"] = exc._NP_RepositoryId
receiver = bridge._get_end_point_receiver()
out["receiver"] = [str(receiver.role), receiver.connector.channel_id, str(receiver.style)]
import omniORB
try:
    bad = cba.ExternalEndpoint(cba.SOURCE, cba.ExternalEndpointConnector(cba.STRUCTURED_EVENT, 1),
                               nsjms.started, cba.STRUCTURED_EVENT)
    omniORB.cdrMarshal(cba._tc_ExternalEndpoint, bad)
    out["wrong_enum"] = "accepted"
except CORBA.BAD_PARAM:
    out["wrong_enum"] = "BAD_PARAM"
orb.destroy()
print(json.dumps(out))
'''


def test_stubs_work_through_an_orb() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _ORB_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {
        "acked": [[0, 1, 2**31 - 1]],
        "overflow": "BAD_PARAM",
        "proxy_is_a": True,
        "bridge_is_a": True,
        "tm_is_a": True,
        "status": "started",
        "start": f"{OMG}/CosBridgeAdmin/BridgeAlreadyStarted:1.0",
        "receiver": ["SINK", 7, "PULL"],
        "wrong_enum": "BAD_PARAM",
    }
