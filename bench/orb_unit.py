"""The raw ORB's cost, measured in the same run as the paths (issue 27's unit for the node's CPU per event).

A server subprocess with nothing but omniORBpy and one ``StructuredPushConsumer`` / ``SequencePushConsumer``
servant that counts what it receives; this process pushes the bench's 1 KB events to it. The server's CPU per call
(``/proc/PID/stat``, the whole process: ORB threads and the servant) is what any CORBA server in Python pays to
receive an event on this machine now; the node's CPU per event is reported beside it.

    .venv/bin/python bench/orb_unit.py [--calls 5000] [--auth] [--reps 1]

``--auth``: also measure (alternating with the plain server, ``--reps`` pairs) a server that installs the node's
credential interceptor (``router.security.auth.install_server``, issue 27) while this client presents the bench's token
on every call, as the bench's suppliers do: the interceptor's cost per incoming request.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from channel_bench import _event
from common import BENCH_ADMIN_TOKEN, ROOT, client_orb

SERVER = r"""
import sys, threading
import omniORB
if len(sys.argv) > 2:                       # [state dir, token]: the node's credential interceptor
    from pathlib import Path
    from router.security import auth
    auth.install_token(Path(sys.argv[1]), sys.argv[2], auth.Role.OPERATOR)
    auth.install_server(auth.Authenticator(Path(sys.argv[1])))
from omniORB import CORBA
import CosNotifyComm__POA

class Sink:
    n = 0

class Structured(CosNotifyComm__POA.StructuredPushConsumer):
    def push_structured_event(self, event): Sink.n += 1
    def offer_change(self, added, removed): pass
    def disconnect_structured_push_consumer(self): pass

class Sequence(CosNotifyComm__POA.SequencePushConsumer):
    def push_structured_events(self, events): Sink.n += len(events)
    def offer_change(self, added, removed): pass
    def disconnect_sequence_push_consumer(self): pass

orb = CORBA.ORB_init(["unit", "-ORBendPoint", "giop:tcp:127.0.0.1:", "-ORBnativeCharCodeSet", "UTF-8"], CORBA.ORB_ID)
poa = orb.resolve_initial_references("RootPOA")
poa._get_the_POAManager().activate()
print(orb.object_to_string(Structured()._this()), flush=True)
print(orb.object_to_string(Sequence()._this()), flush=True)
for line in sys.stdin:                      # "count" -> the events received so far; EOF -> exit
    print(Sink.n, flush=True)
orb.shutdown(True)
"""


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def orb_units(calls: int = 5000, batch: int = 100, auth_dir: str | None = None) -> dict[str, float]:
    """µs of the raw server's CPU per ``push_structured_event`` call (``structured``) and per event in
    ``push_structured_events`` of ``batch`` (``sequence``), each after a warm-up of a tenth of the calls.
    ``auth_dir``: the server installs the node's credential interceptor with the bench's token registered there."""
    import CosNotifyComm

    extra = [auth_dir, BENCH_ADMIN_TOKEN] if auth_dir else []
    server = subprocess.Popen([sys.executable, "-c", SERVER, *extra], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    orb = client_orb()
    try:
        structured = orb.string_to_object(server.stdout.readline().strip())._narrow(
            CosNotifyComm.StructuredPushConsumer)
        sequence = orb.string_to_object(server.stdout.readline().strip())._narrow(
            CosNotifyComm.SequencePushConsumer)
        events = [_event(i) for i in range(batch)]

        def measured(push: Any, n_calls: int, per_call: int) -> float:
            for i in range(max(1, n_calls // 10)):          # warm-up: connections, the servant's first calls
                push(i)
            cpu0 = _cpu_s(server.pid)
            for i in range(n_calls):
                push(i)
            server.stdin.write("count\n")                   # type: ignore[union-attr]
            server.stdin.flush()                            # type: ignore[union-attr]
            server.stdout.readline()                        # type: ignore[union-attr]  (every call was served)
            return (_cpu_s(server.pid) - cpu0) / (n_calls * per_call) * 1e6

        return {
            "structured": measured(lambda i: structured.push_structured_event(events[i % batch]), calls, 1),
            "sequence": measured(lambda i: sequence.push_structured_events(events), max(1, calls // batch), batch),
        }
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        orb.destroy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--auth", action="store_true", help="A/B: also with the node's credential interceptor")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nsjms-orb-unit-") as state:
        for _ in range(args.reps):
            for auth_dir in ([None, state] if args.auth else [None]):
                units = orb_units(args.calls, auth_dir=auth_dir)
                print(f"raw omniORBpy server CPU{' + auth interceptor' if auth_dir else ''}: push_structured_event "
                      f"{units['structured']:.1f} µs per call, push_structured_events x100 "
                      f"{units['sequence']:.1f} µs per event ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
