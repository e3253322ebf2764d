"""The client examples of docs/clients.md, run as separate processes against a real node over IIOP.

* The Python (omniORBpy) and C++ (omniORB, Debian's ``libomniorb4-dev`` and ``libcos4-dev``) structured push
  supplier and consumer under ``examples/`` reach the factory by ``corbaloc`` and by the IOR file the node writes;
  the consumer must print every event the supplier pushed, in order, with its content, and nothing else. The
  C++ examples are compiled once per session into a temporary directory; a missing compiler or library fails.
* What the docs promise about the published endpoints: ``docs/channel.md``'s ``endpoints.json`` example has the
  keys the node writes, and ``factory.ior`` holds the factory's IOR and stays valid across a restart.

The Java example is not run here: no Java ORB with the OMG COS Notification stubs is installable on the project's
machines (see docs/clients.md, "Java"); tests/unit/test_java_example.py only compiles it.

The tests share one node (``module_server``): each makes its own channel (and queue) and asserts only about those;
the one that stops and restarts a node (the endpoints test) has its own.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
COUNT = 25
RUN_TIMEOUT_S = 120.0
CXX_FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-I/usr/include/COS"]
CXX_LIBS = ["-lCOS4", "-lomniORB4", "-lomniDynamic4", "-lomnithread"]  # the line docs/clients.md gives


@pytest.fixture(scope="session")
def cpp_examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """examples/cpp/{supplier,consumer,admin}.cc compiled with the documented command line (once per session)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ is missing: scripts/bootstrap.sh installs it (with libomniorb4-dev and libcos4-dev)")
    out = tmp_path_factory.mktemp("cpp-examples")
    built = {}
    for name in ("supplier", "consumer", "admin"):
        binary = out / name
        cmd = [compiler, *CXX_FLAGS, "-o", str(binary), str(EXAMPLES / "cpp" / f"{name}.cc"), *CXX_LIBS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            pytest.fail(f"building the C++ {name} failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}\n"
                        "scripts/bootstrap.sh installs libomniorb4-dev libcos4-dev g++")
        built[name] = binary
    return built


def _command(lang: str, role: str, cpp: dict[str, Path]) -> list[str]:
    if lang == "python":
        return [sys.executable, str(EXAMPLES / "python" / f"{role}.py")]
    return [str(cpp[role])]


def _factory_ior(server: Any) -> str:
    """The IOR in ``<state-dir>/factory.ior``, once the file holds a whole IOR line.

    The node writes it just after ``endpoints.json`` (which the fixture waits for) and not atomically, so a reader
    that comes at once can see it missing, or empty while it is rewritten at a restart.
    """
    path: Path = server.state_dir / "factory.ior"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text.startswith("IOR:") and text.endswith("\n"):
            return text.strip()
        time.sleep(0.05)
    pytest.fail(f"{path} holds no whole IOR line within {RUN_TIMEOUT_S:.0f} s")


def _reference(kind: str, server: Any) -> list[str]:
    if kind == "corbaloc":
        return ["--factory", server.corbaloc()]
    _factory_ior(server)  # written once per start: a whole line now stays whole
    return ["--factory-file", str(server.state_dir / "factory.ior")]


@dataclass
class Consumer:
    """A running consumer example; its stdout lines arrive on a queue (read by a thread: never blocks a test)."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None]
    reader: threading.Thread

    @classmethod
    def start(cls, cmd: list[str]) -> Consumer:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, cwd=REPO)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        return cls(proc, lines, reader)

    def wait_ready(self) -> int:
        """The channel id from the ``ready channel=ID`` line."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                self.fail("the consumer ended before it was ready")
            match = re.fullmatch(r"ready channel=(\d+)", line or "")
            if match:
                return int(match.group(1))
        self.fail(f"the consumer was not ready within {RUN_TIMEOUT_S:.0f} s")
        raise AssertionError("unreachable")

    def finish(self) -> list[str]:
        """Wait for the process to end; all the lines it printed after ``ready``."""
        try:
            self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.fail(f"the consumer did not end within {RUN_TIMEOUT_S:.0f} s")
        out = []
        while (line := self.lines.get(timeout=RUN_TIMEOUT_S)) is not None:
            out.append(line)
        if self.proc.returncode != 0:
            self.fail(f"the consumer exited with {self.proc.returncode}; it printed {out}")
        return out

    def fail(self, why: str) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        pytest.fail(f"{why}\n--- consumer stderr ---\n{self.proc.stderr.read()[-4000:]}")

    def stop(self) -> None:
        """Kill the process if it still runs and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=RUN_TIMEOUT_S)  # ends at the end of the process's output
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    """Consumers started by a test; killed if the test ends before they do."""
    started: list[Consumer] = []
    yield started
    for consumer in started:
        consumer.stop()


def _run(cmd: list[str]) -> list[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=REPO)
    assert done.returncode == 0, f"{cmd[:2]} exited with {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout.splitlines()


def _expected(text: str) -> list[str]:
    """What the examples push and print: event i carries seq i, the run's text, and body 'text #i'."""
    return [f"example-{i} nsjms.example/ExampleEvent seq={i} text={text} body={text} #{i}" for i in range(COUNT)]


CASES = [  # (supplier language, consumer language, how the factory is reached, who starts first)
    ("python", "python", "corbaloc", "consumer"),
    ("python", "python", "ior-file", "consumer"),
    ("cpp", "cpp", "corbaloc", "consumer"),
    ("cpp", "cpp", "ior-file", "consumer"),
    ("python", "cpp", "corbaloc", "supplier"),
    ("cpp", "python", "ior-file", "supplier"),
]


@pytest.mark.parametrize(("supplier", "consumer", "reference", "first_run"), CASES,
                         ids=[f"{s}-to-{c}-{r}-{w}-first" for s, c, r, w in CASES])
def test_consumer_prints_every_event_the_supplier_pushed(module_server: Any, cpp_examples: dict[str, Path],
                                                         consumers: list[Consumer], client_orb: Any, supplier: str,
                                                         consumer: str, reference: str, first_run: str) -> None:
    """Creating a channel is an operator's action (docs/security.md): the test's operator creates it; the examples
    (standard clients, no credential) use it with --channel."""
    ref = _reference(reference, module_server)
    _, made = client_orb.factory(module_server.ior()).create_channel([], [])
    supplier_cmd = _command(supplier, "supplier", cpp_examples) + ref
    channel_args = ["--channel", str(made)]
    if first_run == "supplier":  # a supplier run that pushes nothing prints the channel id
        first = _run([*supplier_cmd, *channel_args, "--count", "0"])
        assert first == [f"channel {made}"], first
    listener = Consumer.start([*_command(consumer, "consumer", cpp_examples), *ref, *channel_args,
                               "--count", str(COUNT), "--timeout", str(RUN_TIMEOUT_S)])
    consumers.append(listener)
    cid = listener.wait_ready()
    assert cid == made
    text = f"{supplier}-{reference}"
    pushed = _run([*supplier_cmd, "--channel", str(cid), "--count", str(COUNT), "--text", text])
    received = listener.finish()

    want = _expected(text)
    assert pushed == [f"channel {cid}"] + [f"pushed {line}" for line in want]
    assert received == [f"received {line}" for line in want] + [f"done: received {COUNT} of {COUNT}"]


def _json_block_after(markdown: str, marker: str) -> dict[str, Any]:
    """The first ```json block after the line holding ``marker``."""
    tail = markdown[markdown.index(marker):]
    match = re.search(r"```json\n(.*?)```", tail, re.S)
    assert match, f"no json block after {marker!r}"
    return dict(json.loads(match.group(1)))


def _shape(value: Any) -> Any:
    """Keys all the way down; a leaf stands for its JSON type (null and string are both 'text or absent')."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return "number" if isinstance(value, int) else "text"


def test_published_endpoints_match_the_docs(nsjms_server: Any, cpp_examples: dict[str, Path], tmp_path: Path,
                                            client_orb: Any) -> None:
    documented = _json_block_after((REPO / "docs" / "channel.md").read_text(), "<state-dir>/endpoints.json")
    written = json.loads(nsjms_server.endpoints_path.read_text())
    assert _shape(documented) == _shape(written), "docs/channel.md's endpoints.json example is stale"

    ior_file = nsjms_server.state_dir / "factory.ior"
    ior = _factory_ior(nsjms_server)
    assert ior == written["event_channel_factory"]["ior"], "factory.ior and endpoints.json disagree"

    kept = tmp_path / "kept.ior"  # a copy taken before the restart, as a client machine would keep it
    kept.write_text(ior + "\n")
    nsjms_server.stop()
    assert ior_file.exists(), "docs/clients.md: factory.ior stays when the node stops"
    nsjms_server.restart()
    assert _factory_ior(nsjms_server) == ior, "docs/clients.md: the IOR is the same after a restart"
    _, cid = client_orb.factory(ior).create_channel([], [])   # an operator's action (docs/security.md)
    out = _run([*_command("cpp", "supplier", cpp_examples), "--factory-file", str(kept), "--channel", str(cid),
                "--count", "1"])
    assert len(out) == 2 and out[1].startswith("pushed example-0 "), out


@pytest.mark.parametrize("lang", ["python", "cpp"])
def test_admin_example_presents_the_credential(module_server: Any, cpp_examples: dict[str, Path], client_orb: Any,
                                               lang: str) -> None:
    """docs/security.md: a standard client presents the admin credential with a client request interceptor; without
    it the node refuses create_channel (NO_PERMISSION), with the operator's token file it creates the channel."""
    command = ([sys.executable, str(EXAMPLES / "python" / "admin.py")] if lang == "python"
               else [str(cpp_examples["admin"])])
    factory = ["--factory", f"corbaloc::127.0.0.1:{module_server.port}/NotifyEventChannelFactory"]
    refused = subprocess.run([*command, *factory], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 4 and "NO_PERMISSION" in refused.stderr, refused.stdout + refused.stderr
    token = str(module_server.state_dir / "credentials" / "operator.token")
    done = subprocess.run([*command, "--token-file", token, *factory], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert re.fullmatch(r"channel \d+", line), line
    assert int(line.split()[1]) in client_orb.factory(module_server.ior()).get_all_channels()


def test_jms_consumer_example_receives_what_a_bridge_sends(module_server: Any, consumers: list[Consumer]) -> None:
    """docs/clients.md, "JMS clients": examples/python/jms_consumer.py (stomp.py alone) reads what a channel -> queue
    bridge sends, with the headers the page lists (issue 29: no JMS client was documented)."""
    state = str(module_server.state_dir)
    nsjms = [sys.executable, "-m", "router.cli"]
    created = _run([*nsjms, "channel", "create", "--state-dir", state, "--qos", "EventReliability=Persistent",
                    "--qos", "ConnectionReliability=Persistent"])
    cid = int(re.search(r"channel (\d+) created", "\n".join(created)).group(1))  # type: ignore[union-attr]
    queue_name = f"nsjms.test.example.jms.{cid}.{time.monotonic_ns()}"
    _run([*nsjms, "bridge", "create", "--state-dir", state, "--from", f"channel:{cid}", "--to", f"queue:{queue_name}"])
    broker = module_server.broker_url.removeprefix("stomp://")
    consumer = Consumer.start([sys.executable, str(EXAMPLES / "python" / "jms_consumer.py"), "--destination",
                               f"/queue/{queue_name}", "--broker", broker, "--count", str(COUNT), "--timeout",
                               str(RUN_TIMEOUT_S)])
    consumers.append(consumer)
    assert consumer.lines.get(timeout=RUN_TIMEOUT_S) == "ready"
    _run(_command("python", "supplier", {}) + ["--factory", module_server.corbaloc(), "--channel", str(cid),
                                               "--count", str(COUNT), "--text", "jms"])
    lines = consumer.finish()
    assert len(lines) == COUNT, lines
    for i, line in enumerate(lines):
        assert re.fullmatch(rf"example-{i} nsjms\.example/ExampleEvent priority=0 persistent=true "
                            rf"type=Structured Event body=jms #{i}", line), line


def test_java_jms_consumer_example_receives_what_a_bridge_sends(module_server: Any, consumers: list[Consumer],
                                                                 java_tool: Any, tmp_path: Path) -> None:
    """docs/clients.md, "JMS clients": examples/jms/JmsConsumer.java (the ActiveMQ client over OpenWire), compiled
    with the documented class path, reads what a channel -> queue bridge sends."""
    from bridgekit import JAVA_JARS

    cp = ":".join(map(str, JAVA_JARS))
    javac = shutil.which("javac")
    assert javac is not None, "javac is missing: scripts/bootstrap.sh installs it"
    source = str(EXAMPLES / "jms" / "JmsConsumer.java")
    built = subprocess.run([javac, "-nowarn", "-cp", cp, "-d", str(tmp_path), source],
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    state = str(module_server.state_dir)
    nsjms = [sys.executable, "-m", "router.cli"]
    created = _run([*nsjms, "channel", "create", "--state-dir", state, "--qos", "EventReliability=Persistent",
                    "--qos", "ConnectionReliability=Persistent"])
    cid = int(re.search(r"channel (\d+) created", "\n".join(created)).group(1))  # type: ignore[union-attr]
    queue_name = f"nsjms.test.example.java.{cid}.{time.monotonic_ns()}"
    _run([*nsjms, "bridge", "create", "--state-dir", state, "--from", f"channel:{cid}", "--to", f"queue:{queue_name}"])
    consumer = Consumer.start([java_tool.java, "-cp", f"{tmp_path}:{cp}", "JmsConsumer", java_tool.url, "queue",
                               queue_name, str(COUNT), str(int(RUN_TIMEOUT_S))])
    consumers.append(consumer)
    assert consumer.lines.get(timeout=RUN_TIMEOUT_S) == "ready"
    _run(_command("python", "supplier", {}) + ["--factory", module_server.corbaloc(), "--channel", str(cid),
                                               "--count", str(COUNT), "--text", "java"])
    lines = consumer.finish()
    assert lines == [f"example-{i} nsjms.example/ExampleEvent priority=0 persistent=true type=Structured Event "
                     f"body=java #{i}" for i in range(COUNT)], lines  # the supplier's Priority 0 (NJI Table 2-6)
