"""Helpers for the NS⇄JMS bridge integration tests: IDL endpoints, the bridge factory, and the Java JMS client.

* :func:`bridge_factory` resolves the node's ``BridgeFactory`` from the corbaloc in ``endpoints.json`` and
  narrows it with the OMG IDL stubs (``idl.generated.CosBridgeAdmin``); :func:`channel_ep` / :func:`jms_ep`
  build ``CosBridgeAdmin::ExternalEndpoint`` values;
* :class:`JavaTool` compiles ``java/JmsTool.java`` with ``javac`` against Debian's ActiveMQ client jars (a missing
  ``javac`` or jar is a test *failure* naming what to install) and runs it: ``produce``, ``consume`` (JSON lines
  parsed into dicts) and a background ``durable``/``consume`` process (:class:`JavaConsumer`);
* :func:`java_tool` is the session fixture; test modules import it so pytest finds it.

The Java client speaks OpenWire to the broker; the node speaks STOMP. Nothing here imports ``router``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA

from idl.generated import CosBridgeAdmin as BA

__all__ = [
    "JAVA_JARS",
    "JavaConsumer",
    "JavaTool",
    "bridge_factory",
    "channel_ep",
    "error_codes",
    "java_tool",
    "jms_ep",
    "reconnect_client",
]

JAVA_DIR = Path(__file__).resolve().parent / "java"
JAVA_JARS = tuple(Path("/usr/share/java") / f"{name}.jar" for name in (
    "activemq-client", "geronimo-jms_1.1_spec", "slf4j-api", "hawtbuf", "geronimo-j2ee-management-1.1-spec"))
JAVA_TIMEOUT_S = 120.0


# ------------------------------------------------------------------------------------------- CORBA side
def bridge_factory(client_orb: Any, server: Any) -> Any:
    """The node's CosBridgeAdmin::BridgeFactory, resolved from ``endpoints.json``'s corbaloc."""
    assert server.endpoints is not None
    obj = client_orb.orb.string_to_object(server.endpoints["bridge_factory"]["corbaloc"])
    factory = obj._narrow(BA.BridgeFactory)
    assert factory is not None, "the bridge_factory corbaloc does not name a CosBridgeAdmin::BridgeFactory"
    return factory


def reconnect_client(*refs: Any, timeout: float = 30.0) -> None:
    """After a server restart: call each of ``refs`` until a call goes through. The client ORB's cached connections
    to the killed process fail their next call with COMM_FAILURE (COMPLETED_MAYBE); later calls reconnect."""
    deadline = time.monotonic() + timeout
    for ref in refs:
        while True:
            try:
                ref._non_existent()
                break
            except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def channel_ep(role: Any, channel_id: int, style: Any = BA.PUSH, kind: Any = BA.STRUCTURED_EVENT) -> Any:
    """An ExternalEndpoint naming event channel ``channel_id``."""
    return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(kind, channel_id), style, kind)


def jms_ep(role: Any, name: str, dest_type: Any = BA.QUEUE, style: Any = BA.PUSH, factory_name: str = "") -> Any:
    """An ExternalEndpoint naming a JMS destination."""
    dest = BA.JMSDestination(dest_type, name, factory_name)
    return BA.ExternalEndpoint(role, BA.ExternalEndpointConnector(destination=dest), style, BA.JMS_MESSAGE)


def error_codes(exc: Any) -> list[tuple[str, str]]:
    """``[(role, code), ...]`` of an InvalidExternalEndPoints, as names."""
    return [(str(e.role), str(e.code)) for e in exc.error]


# -------------------------------------------------------------------------------------------- Java side
def _require_java() -> tuple[str, str]:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.fail("javac/java not found: install a JDK (apt-get install -y default-jdk-headless); the bridge "
                    "interop tests need a real Java JMS client", pytrace=False)
    missing = [str(j) for j in JAVA_JARS if not j.exists()]
    if missing:
        pytest.fail(f"Java JMS client jars missing: {missing}; install them with `apt-get install -y activemq`",
                    pytrace=False)
    return javac, java


@dataclass
class JavaConsumer:
    """A ``consume``/``durable`` JmsTool process running in the background; its JSON lines are collected."""

    proc: subprocess.Popen[str]
    messages: list[dict[str, Any]] = field(default_factory=list)
    done: int | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            item = json.loads(line)
            with self._cond:
                if set(item) == {"done"}:
                    self.done = int(item["done"])
                else:
                    self.messages.append(item)
                self._cond.notify_all()

    def count(self) -> int:
        with self._cond:
            return len(self.messages)

    def wait_for(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.messages) >= n or self.done is not None, timeout) \
                and len(self.messages) >= n

    def finish(self, timeout: float = JAVA_TIMEOUT_S) -> list[dict[str, Any]]:
        """Wait for the process to end (it stops at its count or timeout); return every message."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close()
        with self._cond:
            return list(self.messages)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass(frozen=True)
class JavaTool:
    """Runs the compiled ``JmsTool`` against one broker's OpenWire URL."""

    java: str
    classes: Path
    url: str

    def _argv(self, *args: object) -> list[str]:
        cp = ":".join([str(self.classes), *map(str, JAVA_JARS)])
        return [self.java, "-cp", cp, "JmsTool", *map(str, args)]

    def with_url(self, url: str) -> JavaTool:
        return JavaTool(self.java, self.classes, url)

    def produce(self, kind: str, name: str, count: int, kinds: str = "text", persistent: bool = True) -> None:
        """Send ``count`` messages (see JmsTool's header) to ``kind`` (queue|topic) ``name``."""
        argv = self._argv("produce", self.url, kind, name, count, kinds,
                          "persistent" if persistent else "nonpersistent")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
        assert done.returncode == 0, f"JmsTool produce failed ({done.returncode}):\n{done.stderr[-3000:]}"

    def consume(self, kind: str, name: str, count: int, timeout_s: float, selector: str | None = None
                ) -> list[dict[str, Any]]:
        """Receive up to ``count`` messages (client-acknowledged) within ``timeout_s``."""
        return self.consume_async(kind, name, count, timeout_s, selector).finish(timeout_s + JAVA_TIMEOUT_S)

    def consume_async(self, kind: str, name: str, count: int, timeout_s: float,
                      selector: str | None = None) -> JavaConsumer:
        extra = [selector] if selector else []
        return self._spawn("consume", self.url, kind, name, count, int(timeout_s * 1000), *extra)

    def durable_async(self, client_id: str, topic: str, subscription: str, count: int,
                      timeout_s: float) -> JavaConsumer:
        return self._spawn("durable", self.url, client_id, topic, subscription, count, int(timeout_s * 1000))

    def _spawn(self, *args: object) -> JavaConsumer:
        proc = subprocess.Popen(self._argv(*args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                stdin=subprocess.DEVNULL)
        consumer = JavaConsumer(proc)
        consumer.start_reader()
        return consumer


_COMPILED: dict[str, Path] = {}


def compile_java(out_dir: Path) -> tuple[str, Path]:
    """Compile JmsTool.java into ``out_dir`` (once per process); returns (java, classes dir)."""
    javac, java = _require_java()
    if "classes" not in _COMPILED:
        out_dir.mkdir(parents=True, exist_ok=True)
        cp = ":".join(map(str, JAVA_JARS))
        done = subprocess.run([javac, "-nowarn", "-cp", cp, "-d", str(out_dir), str(JAVA_DIR / "JmsTool.java")],
                              capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
        if done.returncode != 0:
            pytest.fail(f"javac JmsTool.java failed:\n{done.stderr[-3000:]}", pytrace=False)
        _COMPILED["classes"] = out_dir
    return java, _COMPILED["classes"]


@pytest.fixture(scope="session")
def java_tool(tmp_path_factory: pytest.TempPathFactory, broker_openwire_url: str) -> Iterator[JavaTool]:
    """The compiled Java JMS client bound to the session broker's OpenWire URL."""
    java, classes = compile_java(tmp_path_factory.mktemp("jmstool"))
    yield JavaTool(java, classes, broker_openwire_url)
