"""Process and port helpers of the embedded services: free ports, waiting for a port, whether a pid is alive (a zombie
is not), reading a log's tail."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from router.node.lifecycle import ServiceError

__all__ = ["LOCALHOST", "PRIVATE_UMASK", "ensure_port_free", "free_port", "is_zombie", "pid_alive", "pid_exists",
           "port_in_use", "tail", "wait_for_port", "wait_gone"]

LOCALHOST = "127.0.0.1"
PRIVATE_UMASK = 0o077


# ------------------------------------------------------------------------------------------- ports
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = LOCALHOST) -> bool:
    """True when ``host:port`` cannot be bound (something listens there, on that address or on 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def wait_for_port(
    host: str, port: int, timeout: float, *, abort: Callable[[], str | None] | None = None
) -> None:
    """Return once ``host:port`` accepts a TCP connection; raise :class:`ServiceError` after ``timeout`` s.

    ``abort`` is polled between attempts; a non-empty string it returns ends the wait with that reason.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            pass
        reason = abort() if abort else None
        if reason:
            raise ServiceError(reason)
        if time.monotonic() >= deadline:
            raise ServiceError(f"{host}:{port} did not accept connections within {timeout:.0f} s")
        time.sleep(0.1)


def ensure_port_free(port: int, what: str, key: str) -> None:
    """Raises ServiceError naming the configuration ``key`` that chose the port (as ``orb.port``'s message does)."""
    if port_in_use(port):
        raise ServiceError(
            f"{key}: port {port} on {LOCALHOST} (wanted for {what}) is already in use; "
            f"set {key} to another port or stop the process holding it"
        )


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"(empty log at {path})"


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` is in the process table (running, exiting or a zombie): what PostgreSQL's lock file checks."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    return pid_exists(pid) and not is_zombie(pid)


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
