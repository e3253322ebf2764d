"""The console's lists with many channels and bridges: what a page costs the node, against the same query through the
CLI's JSON.

One node (``nsjms serve`` with ``[console] enabled``) gets ``--channels`` channels and ``--bridges`` bridges (channel ->
queue, created stopped: listing needs no broker traffic). Then, in one run, each query is made ``--repeats`` times and
measured by what stays stable on a shared machine: the **node process's CPU seconds** per request (``utime + stime``
of ``/proc/PID/stat``; also with the node's idle CPU over the same wall time taken off), the **bytes** of the answer
and the **node calls** the console made for it (the CORBA operations on the node's objects, counted by the console
and sent in its ``X-Nsjms-Node-Calls`` header; absent in versions before it). Wall times are printed too, and mean
little while others use the machine. The queries:

* the console: ``/channels`` and ``/bridges`` (first page of 50, HTML), the same lists whole as JSON
  (``?format=json&per_page=500`` pages until done), and one channel's and one bridge's page;
* the CLI: ``nsjms channel list --json`` and ``nsjms bridge list --json`` (a process each, as an operator runs them).

Both ask the node the same things (the console calls the CLI's functions in the node process); the CLI pays an
interpreter start and an ORB per call, the console a session and Jinja2 rendering. Medians and spreads are reported;
nothing here is a test (no thresholds). For the CLI, the node's CPU and the CLI process's own (``getrusage`` of the
children) are given apart.

    .venv/bin/python bench/console_bench.py --channels 1000 --bridges 1000
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.node.services import free_port

from common import ROOT, client_orb, median_spread, node_process, services


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Took:
    wall_s: float
    node_cpu_s: float
    client_cpu_s: float
    bytes: int
    calls: int | None


def measured(fn: Callable[[], tuple[int, int | None]], pid: int) -> Took:
    wall, node, kids = time.perf_counter(), cpu_s(pid), children_cpu_s()
    size, calls = fn()
    return Took(time.perf_counter() - wall, cpu_s(pid) - node, children_cpu_s() - kids, size, calls)


class Console:
    def __init__(self, base: str, state: Any) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        page = self.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf
        secret = (state / "credentials" / "operator.token").read_text().strip().partition(":")[2]
        data = urllib.parse.urlencode({"csrf": csrf.group(1), "name": "operator", "secret": secret,
                                       "next": "/"}).encode()
        self.opener.open(self.base + "/login", data, timeout=120).read()

    def get(self, path: str) -> str:
        return self.fetch(path)[0]

    def fetch(self, path: str) -> tuple[str, int, int | None]:
        """(text, bytes, node calls from the X-Nsjms-Node-Calls header or None)."""
        with self.opener.open(self.base + path, timeout=600) as resp:
            body = resp.read()
            calls = resp.headers.get("X-Nsjms-Node-Calls")
        return body.decode(), len(body), None if calls is None else int(calls)

    def sized(self, path: str) -> tuple[int, int | None]:
        _, size, calls = self.fetch(path)
        return size, calls

    def all_json(self, path: str) -> tuple[int, int, int | None]:
        """(rows, bytes, node calls) of every page of ``path`` as JSON, 500 rows a page."""
        page, rows, size, calls = 1, 0, 0, 0
        counted = True
        while True:
            text, n, c = self.fetch(f"{path}?format=json&per_page=500&page={page}")
            data = json.loads(text)
            rows, size, calls, counted = rows + len(data["rows"]), size + n, calls + (c or 0), counted and c is not None
            if page >= data["pages"]:
                return rows, size, calls if counted else None
            page += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=1000)
    ap.add_argument("--bridges", type=int, default=1000, help="one per channel, so at most --channels")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the node's idle CPU measured first")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()
    port = free_port()
    os.environ.update(NSJMS_CONSOLE_ENABLED="true", NSJMS_CONSOLE_PORT=str(port))
    with services() as (dsn, broker_url), node_process(dsn, broker_url) as proc:
        endpoints = json.loads((proc.state / "endpoints.json").read_text())
        orb = client_orb()
        import CosNotifyChannelAdmin

        from idl.generated import CosBridgeAdmin as BA

        ecf = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])._narrow(
            CosNotifyChannelAdmin.EventChannelFactory)
        bf = orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        from router.channel.qos import to_properties

        persistent = to_properties({"EventReliability": 1, "ConnectionReliability": 1})  # a queue sink needs it
        t0 = time.perf_counter()
        ids = [ecf.create_channel(persistent, [])[1] for _ in range(args.channels)]
        for i, cid in enumerate(ids[:args.bridges]):
            bf.create_bridge(BA.ExternalEndpoint(BA.SOURCE, BA.ExternalEndpointConnector(BA.STRUCTURED_EVENT, cid),
                                                 BA.PUSH, BA.STRUCTURED_EVENT),
                             BA.ExternalEndpoint(BA.SINK, BA.ExternalEndpointConnector(
                                 destination=BA.JMSDestination(BA.QUEUE, f"console.bench.{i}", "")),
                                 BA.PUSH, BA.JMS_MESSAGE))
        print(f"created {len(ids)} channels and {min(args.bridges, len(ids))} bridges in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        time.sleep(3)                      # the node's status snapshot (every 2 s) has them all
        console = Console(f"http://127.0.0.1:{port}", proc.state)
        env = dict(os.environ, NSJMS_POSTGRES_DSN=proc.dsn)

        def cli(*what: str) -> tuple[int, int]:
            out = subprocess.run([sys.executable, "-m", "router.cli", *what, "--json", "--state-dir",
                                  str(proc.state)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            return len(json.loads(out.stdout)), len(out.stdout.encode())

        assert cli("channel", "list")[0] == console.all_json("/channels")[0] == len(ids)
        first, bridge_id = ids[0], 0
        queries: list[tuple[str, Callable[[], tuple[int, int | None]]]] = [
            ("console /channels (HTML, first 50)", lambda: console.sized("/channels")),
            ("console /channels (JSON, all)", lambda: console.all_json("/channels")[1:]),
            ("CLI channel list --json", lambda: (cli("channel", "list")[1], None)),
            ("console /bridges (HTML, first 50)", lambda: console.sized("/bridges")),
            ("console /bridges?sort=state (HTML)", lambda: console.sized("/bridges?sort=state")),
            ("console /bridges (JSON, all)", lambda: console.all_json("/bridges")[1:]),
            ("CLI bridge list --json", lambda: (cli("bridge", "list")[1], None)),
            ("console /channels/ID (HTML)", lambda: console.sized(f"/channels/{first}")),
            ("console /bridges/ID (HTML)", lambda: console.sized(f"/bridges/{bridge_id}")),
            ("console / overview (HTML)", lambda: console.sized("/")),
            ("console / overview (JSON)", lambda: console.sized("/?format=json")),
        ]
        assert proc.proc is not None
        pid = proc.proc.pid
        idle_wall, idle_cpu = time.perf_counter(), cpu_s(pid)
        time.sleep(args.idle)
        idle = (cpu_s(pid) - idle_cpu) / (time.perf_counter() - idle_wall)
        print(f"node idle: {idle * 1000:.1f} ms CPU per s (status snapshot, rate sampler)", flush=True)
        results = {}
        for name, fn in queries:
            runs = [measured(fn, pid) for _ in range(args.repeats)]
            node, _, _ = median_spread([r.node_cpu_s for r in runs])
            net = statistics.median([max(0.0, r.node_cpu_s - idle * r.wall_s) for r in runs])
            client = statistics.median([r.client_cpu_s for r in runs])
            wall, low, high = median_spread([r.wall_s for r in runs])
            results[name] = {"node_cpu_s": node, "node_cpu_less_idle_s": net, "cli_process_cpu_s": client,
                             "bytes": runs[-1].bytes, "node_calls": runs[-1].calls, "wall_median_s": wall,
                             "wall_min_s": low, "wall_max_s": high}
            calls = "-" if runs[-1].calls is None else str(runs[-1].calls)
            print(f"{name:<38} node CPU {node * 1000:8.1f} ms ({net * 1000:8.1f} less idle)"
                  f"{f'  CLI process {client * 1000:7.1f} ms' if client else ''}  {runs[-1].bytes:>9} bytes  "
                  f"{calls:>6} node calls  wall {wall * 1000:8.1f} ms", flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"channels": len(ids), "bridges": min(args.bridges, len(ids)), "repeats": args.repeats,
                           "node_idle_cpu_per_s": idle, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
