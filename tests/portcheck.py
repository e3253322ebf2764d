"""Is a port a container engine published on 127.0.0.1 reachable from this network namespace? (issue 29)

With a Docker engine that answers but runs in another network namespace (rootless Docker, a VM, ``ip netns``),
``NSJMS_TEST_SERVICES=auto`` picked containers and every test then waited 120 s for a port nothing here listens on.
The engine's userland proxy (``docker-proxy``, Docker's default) listens on a published port as soon as the
container starts, so a published port with no listening socket in *our* ``/proc/net/tcp`` means the engine's
ports are elsewhere (or the engine runs without its userland proxy): the fixtures say so at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["listening_ports", "unpublished_problem"]

_LISTEN = "0A"


def listening_ports(tables: Iterable[str]) -> set[int]:
    """The local ports in LISTEN state in ``/proc/net/tcp`` / ``tcp6`` texts (pure)."""
    ports: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _proc_tables() -> list[str]:
    out = []
    for name in ("tcp", "tcp6"):
        try:
            out.append(Path("/proc/net", name).read_text())
        except OSError:
            pass
    return out


def unpublished_problem(port: int, *, timeout: float = 5.0, tables: Callable[[], list[str]] = _proc_tables,
                        sleep: Callable[[float], None] = time.sleep) -> str | None:
    """None once ``port`` listens in this network namespace; after ``timeout`` s the reason it does not."""
    waited = 0.0
    while port not in listening_ports(tables()):
        if waited >= timeout:
            return (f"the container's published port 127.0.0.1:{port} has no listener in this network namespace: "
                    "the Docker engine answers but publishes its ports elsewhere (rootless Docker, a VM, another "
                    "network namespace) or runs without its userland proxy; run the tests on local processes "
                    "(NSJMS_TEST_SERVICES=local) or where the engine's ports are")
        sleep(0.2)
        waited += 0.2
    return None
