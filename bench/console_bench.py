"""The console's lists with many channels and bridges: page render time against the same query through the CLI's JSON.

One node (``nsjms serve`` with ``[console] enabled``) gets ``--channels`` channels and ``--bridges`` bridges (channel ->
queue, created stopped: listing needs no broker traffic). Then, in one run, each query is timed ``--repeats`` times:

* the console: ``/channels`` and ``/bridges`` (first page of 50, HTML), the same lists whole as JSON
  (``?format=json&per_page=500`` pages until done), and one channel's and one bridge's page;
* the CLI: ``nsjms channel list --json`` and ``nsjms bridge list --json`` (a process each, as an operator runs them).

Both ask the node the same things (the console calls the CLI's functions in the node process); the CLI pays an
interpreter start and an ORB per call, the console a session and Jinja2 rendering. Medians and spreads are reported;
nothing here is a test (no thresholds).

    .venv/bin/python bench/console_bench.py --channels 1000 --bridges 1000
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from router.services import free_port

from common import ROOT, client_orb, median_spread, node_process, services


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


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
        with self.opener.open(self.base + path, timeout=300) as resp:
            return str(resp.read().decode())

    def all_json(self, path: str) -> int:
        page, rows = 1, 0
        while True:
            data = json.loads(self.get(f"{path}?format=json&per_page=500&page={page}"))
            rows += len(data["rows"])
            if page >= data["pages"]:
                return rows
            page += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=1000)
    ap.add_argument("--bridges", type=int, default=1000, help="one per channel, so at most --channels")
    ap.add_argument("--repeats", type=int, default=5)
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

        def cli(*what: str) -> int:
            out = subprocess.run([sys.executable, "-m", "router.cli", *what, "--json", "--state-dir",
                                  str(proc.state)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            return len(json.loads(out.stdout))

        assert cli("channel", "list") == console.all_json("/channels") == len(ids)
        first, bridge_id = ids[0], 0
        queries: list[tuple[str, Callable[[], Any]]] = [
            ("console /channels (HTML, first 50)", lambda: console.get("/channels")),
            ("console /channels (JSON, all)", lambda: console.all_json("/channels")),
            ("CLI channel list --json", lambda: cli("channel", "list")),
            ("console /bridges (HTML, first 50)", lambda: console.get("/bridges")),
            ("console /bridges (JSON, all)", lambda: console.all_json("/bridges")),
            ("CLI bridge list --json", lambda: cli("bridge", "list")),
            ("console /channels/ID (HTML)", lambda: console.get(f"/channels/{first}")),
            ("console /bridges/ID (HTML)", lambda: console.get(f"/bridges/{bridge_id}")),
            ("console / overview (HTML)", lambda: console.get("/")),
        ]
        results = {}
        for name, fn in queries:
            med, low, high = median_spread(_timed(fn, args.repeats))
            results[name] = {"median_s": med, "min_s": low, "max_s": high}
            print(f"{name:<40} median {med * 1000:8.1f} ms  (min {low * 1000:.1f}, max {high * 1000:.1f})",
                  flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"channels": len(ids), "bridges": min(args.bridges, len(ids)), "repeats": args.repeats,
                           "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
