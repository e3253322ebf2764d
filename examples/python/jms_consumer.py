#!/usr/bin/env python3
"""A JMS-side consumer of what an nsjms bridge sends (stomp.py, the broker's STOMP port; no nsjms code).

    python jms_consumer.py --destination /queue/billing.events [--broker HOST:PORT] [--credentials FILE]
                           [--login L --passcode P] [--count N] [--timeout S]

It connects to the broker (default 127.0.0.1:61613, the embedded broker's STOMP port), logs in with
``--login``/``--passcode`` or with the two lines of ``--credentials`` (the embedded broker's
``<state-dir>/activemq/credentials``: login, then passcode; the embedded broker refuses anonymous connections),
subscribes to ``--destination`` (``/queue/NAME`` or ``/topic/NAME``, the name given to ``nsjms bridge create --to``)
with client acknowledgement, prints ``ready`` and then one line per message: the event's name and type as the
bridge put them in the ``$event_name``, ``$domain_name``, ``$type_name`` headers, the JMS headers (``priority``,
``persistent``, ``type`` = JMSType, ``message-id``) and the body; it acknowledges each message after printing it.
It exits 0 after ``--count`` messages (0: until Ctrl-C), 1 when ``--timeout`` seconds pass first.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from pathlib import Path
from typing import Any

import stomp


class Listener(stomp.ConnectionListener):  # type: ignore[misc]  # stomp.py is untyped
    """stomp.py calls it on its receiver thread: only hand the frame over (acking happens on the main thread)."""

    def __init__(self) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.frames.put(frame)

    def on_error(self, frame: Any) -> None:
        print(f"broker error: {frame.headers.get('message')}", file=sys.stderr, flush=True)


def describe(headers: dict[str, str], body: str) -> str:
    keys = ("priority", "persistent", "type")
    jms = " ".join(f"{k}={headers[k]}" for k in keys if k in headers)
    return (f"{headers.get('$event_name', '')} {headers.get('$domain_name', '')}/{headers.get('$type_name', '')} "
            f"{jms} body={body}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--destination", required=True, help="/queue/NAME or /topic/NAME")
    p.add_argument("--broker", default="127.0.0.1:61613", metavar="HOST:PORT", help="STOMP address")
    p.add_argument("--credentials", type=Path, help="a file with the login and passcode on two lines")
    p.add_argument("--login", default="")
    p.add_argument("--passcode", default="")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout", type=float, default=0.0, help="seconds (0: none)")
    args = p.parse_args(argv)
    login, passcode = args.login, args.passcode
    if args.credentials:
        login, passcode = args.credentials.read_text().split("\n")[:2]
    host, _, port = args.broker.rpartition(":")
    conn = stomp.Connection12([(host, int(port))], heartbeats=(10000, 10000))
    listener = Listener()
    conn.set_listener("printer", listener)
    conn.connect(login, passcode, wait=True)
    conn.subscribe(args.destination, id="1", ack="client-individual")
    print("ready", flush=True)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    seen = 0
    try:
        while args.count == 0 or seen < args.count:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return 1
            try:
                frame = listener.frames.get(timeout=wait)
            except queue.Empty:
                return 1
            print(describe(dict(frame.headers), frame.body if isinstance(frame.body, str) else repr(frame.body)),
                  flush=True)
            conn.ack(frame.headers["ack"])  # STOMP 1.2: the MESSAGE frame's ack header
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        conn.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
