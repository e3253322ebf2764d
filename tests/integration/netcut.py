"""Silent network cuts for fault tests: a service in a network namespace of its own, reached over veth pairs.

Setting the host's end of a pair down drops every packet either way without a word (no RST, no FIN, no ICMP) until
it is set up again. Needs root (network namespaces); a machine without them fails the test, never a skip.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass


def ip(*args: str, ns: str | None = None) -> None:
    """``ip ARGS`` (inside namespace ``ns``); asserts it worked."""
    argv = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr.strip()} (network namespaces need root)"


@dataclass
class Link:
    """One veth pair from the host into a namespace: ``host_addr`` on the host's end, ``addr`` inside."""

    host_if: str
    host_addr: str
    addr: str

    def cut(self) -> None:
        ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        ip("link", "set", self.host_if, "up")


def add_namespace(ns: str) -> None:
    ip("netns", "add", ns)
    ip("link", "set", "lo", "up", ns=ns)


def add_link(ns: str, second: int) -> Link:
    """A new veth pair into ``ns`` on a random /30 of ``10.<second>.0.0/16``."""
    tag = secrets.token_hex(3)
    host_if, ns_if = f"nh{tag}", f"nn{tag}"
    third, fourth = secrets.randbelow(256), secrets.randbelow(64) * 4
    link = Link(host_if, f"10.{second}.{third}.{fourth + 1}", f"10.{second}.{third}.{fourth + 2}")
    ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    ip("link", "set", ns_if, "netns", ns)
    ip("addr", "add", f"{link.host_addr}/30", "dev", host_if)
    ip("link", "set", host_if, "up")
    ip("addr", "add", f"{link.addr}/30", "dev", ns_if, ns=ns)
    ip("link", "set", ns_if, "up", ns=ns)
    return link


def remove(ns: str, *links: Link) -> None:
    """Best effort (cleanup): the host ends of ``links`` (their peers go with them), then the namespace."""
    for link in links:
        subprocess.run(["ip", "link", "del", link.host_if], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
