"""Node lifecycle: the state-directory lock, private files, reachability probes and supervision of services.

* :class:`StateLock` — an exclusive ``flock`` on ``<state_dir>/node.lock``, held for the node's whole life; the
  file records the holder's pid. A second node on the same directory gets :class:`StateDirLocked` at once and
  must touch nothing (no service is stopped, no file removed).
* :func:`private_tree`, :func:`write_private` — state files readable by their owner only.
* :func:`probe_postgres`, :func:`probe_broker`, :func:`stomp_probe` — bounded reachability checks that never
  raise for network trouble and never put a password in their answer.
* :class:`ServiceWatch` — one thread per service: probes reachability every few seconds and restarts an embedded
  service whose process died, with a bounded exponential backoff (:func:`restart_delay`, free of I/O).

Exceptions (the tree of the ``router`` top-level modules)::

    RuntimeError
     └── ServiceError            an embedded service could not be started or stopped (the message says why)
          ├── StateDirLocked     another live node holds the state directory (.path, .pid)
          ├── StateDirUnusable   the state directory cannot be created, locked or written (.path, .reason)
          ├── ServiceUnreachable a required service does not answer at start (.key, .address)
          └── ServiceMisconfigured a service answers but a setting of its own makes it unusable (.setting)
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from router.db.twophase import max_prepared_transactions, prepared_transactions_problem
from router.security.files import write_private

__all__ = [
    "EMBEDDED_RESTART",
    "Health",
    "RestartPolicy",
    "ServiceError",
    "ServiceMisconfigured",
    "ServiceUnreachable",
    "ServiceWatch",
    "StateDirLocked",
    "StateDirUnusable",
    "StateLock",
    "bind_problem",
    "kept_for_restart",
    "max_prepared_transactions",
    "postgres_problem",
    "prepared_transactions_problem",
    "private_tree",
    "probe_broker",
    "probe_postgres",
    "restart_delay",
    "stomp_probe",
    "write_private",
]

log = logging.getLogger("nsjms.lifecycle")

LOCK_FILE = "node.lock"


class ServiceError(RuntimeError):
    """An embedded service could not be started or stopped; the message says why and what to do."""


class StateDirLocked(ServiceError):
    """Another live node holds the state directory's lock; nothing was touched."""

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"state directory {path} is in use by a running nsjms node ({holder}, lock {path / LOCK_FILE}); "
            "refusing to start: stop that node first or give this one another --state-dir"
        )
        self.path = path
        self.pid = pid

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.pid))


class StateDirUnusable(ServiceError):
    """The state directory cannot be used (read-only, a file, under /proc, not ours); nothing was started."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"state directory {path} cannot be used: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


class ServiceUnreachable(ServiceError):
    """A service the node cannot run without does not answer at start; names the key and the (redacted) address."""

    def __init__(self, key: str, address: str, reason: str) -> None:
        super().__init__(f"{key}: cannot reach {address}: {reason}")
        self.key = key
        self.address = address
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.address, self.reason))


class ServiceMisconfigured(ServiceError):
    """A service answers but one of its own settings (``.setting``) makes the node unable to work correctly."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.setting, str(self)))


# ------------------------------------------------------------------------------------------------ the lock
class StateLock:
    """``flock(LOCK_EX | LOCK_NB)`` on ``<state_dir>/node.lock``; released by :meth:`release` or by process death."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StateDirLocked` at once (never waits). The fd is not inherited."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StateDirLocked(self.state_dir, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fchmod(fd, 0o600)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the only descriptor releases the flock


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ private files
def stomp_probe(host: str, port: int, login: str, passcode: str, timeout: float) -> str | None:
    """One STOMP 1.2 CONNECT/DISCONNECT to ``host:port``; ``None`` when CONNECTED came back, else why not.

    Never raises for network trouble; the passcode is never part of the answer.
    """
    frame = f"CONNECT\naccept-version:1.2\nhost:{host}\n"
    if login or passcode:
        frame += f"login:{_stomp_escape(login)}\npasscode:{_stomp_escape(passcode)}\n"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(frame.encode() + b"\n\x00")
            answer = _read_frame(sock)
            if answer.startswith(b"CONNECTED"):
                sock.sendall(b"DISCONNECT\n\n\x00")
                return None
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    if answer.startswith(b"ERROR"):
        headers = dict(
            line.split(":", 1) for line in answer.decode(errors="replace").splitlines()[1:] if ":" in line
        )
        return f"{host}:{port} refused the STOMP login: {headers.get('message', 'ERROR frame')}"
    return f"{host}:{port} did not answer a STOMP CONNECT"


def _stomp_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")


def _read_frame(sock: socket.socket) -> bytes:
    data = b""
    while b"\x00" not in data and len(data) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.lstrip(b"\r\n")


def private_tree(root: Path) -> None:
    """Remove group/other permission bits from ``root`` and everything below it (symlinks are left alone)."""
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            _make_private(Path(directory) / name)
    _make_private(root)


def _make_private(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
        if not path.is_symlink() and mode & 0o077:
            os.chmod(path, mode & 0o7700)
    except FileNotFoundError:
        pass  # a service removed it meanwhile



# ------------------------------------------------------------------------------------------------- probes
def probe_postgres(dsn: str, timeout: float) -> str | None:
    """Connect and ``SELECT 1`` within ``timeout`` s; ``None`` when it worked, else the (redacted) reason."""
    import psycopg

    from router.db.conninfo import connect as connect_bounded

    try:
        with connect_bounded(dsn, connect_timeout=max(1, int(timeout)), autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return postgres_problem(exc)
    return None


def postgres_problem(exc: Exception) -> str:
    """What a failed probe of PostgreSQL reports: the error on one line, redacted, with :func:`postgres_hint`."""
    from router.node.config import redact_dsn

    return postgres_hint(redact_dsn(" ".join(str(exc).split())) or type(exc).__name__)


def postgres_hint(reason: str) -> str:
    """``reason`` with what it means when that is not obvious (pure): a refused password is most often a data
    directory (a container volume) that kept the password it was created with."""
    if "password authentication failed" in reason:
        return (f"{reason}: the password does not match the one the server has (a PostgreSQL data directory or "
                "container volume keeps the password it was first created with: use that one, or recreate it)")
    return reason


def probe_broker(url: str, login: str, passcode: str, timeout: float) -> str | None:
    """``None`` when one of the URL's brokers accepts a STOMP login (``stomp+ssl``: a TCP connection), else why."""
    from router.node.config import broker_addresses

    problems = []
    for host, port in broker_addresses(url):
        if url.lower().startswith("stomp+ssl:"):
            problem = _tcp_probe(host, port, timeout)
        else:
            problem = stomp_probe(host, port, login, passcode, timeout)
        if problem is None:
            return None
        problems.append(problem)
    return "; ".join(problems) or "no broker address"


def bind_problem(host: str, port: int) -> str | None:
    """``None`` when a listening socket could be bound on ``host:port`` now (``SO_REUSEADDR``, as a server sets
    it), else why not (port in use, address not local, name unknown)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def _tcp_probe(host: str, port: int, timeout: float) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"


# ---------------------------------------------------------------------------------------------- systemd
#: ``$SERVICE_RESULT`` values for which ``Restart=on-failure`` starts the unit's main process again.
RESTARTED_RESULTS = frozenset({"exit-code", "signal", "core-dump", "watchdog", "oom-kill"})
#: Exit statuses systemd does not restart (``RestartPreventExitStatus=`` of deploy/nsjms.service): config, locked.
NOT_RESTARTED_STATUSES = frozenset({"2", "5"})


def kept_for_restart(service_result: str | None, exit_code: str | None, exit_status: str | None) -> bool:
    """Pure: in a systemd ``ExecStopPost``, whether the embedded services stay for the restart that follows.

    True when the main process failed (crash, signal, exit code 1 or 6…) and ``Restart=on-failure`` will start it
    again: the next node adopts them. False for a deliberate stop (``success``; ``timeout``: the node was killed
    after ``TimeoutStopSec``), for exit codes systemd does not retry, and outside systemd (no ``$SERVICE_RESULT``).
    """
    if service_result not in RESTARTED_RESULTS:
        return False
    return not (exit_code == "exited" and exit_status in NOT_RESTARTED_STATUSES)


# ------------------------------------------------------------------------------------------- supervision
@dataclass(frozen=True)
class RestartPolicy:
    """Backoff between restarts of a dead embedded service: 0, then ``initial_s`` doubling up to ``max_s``;
    the count starts again once the service stayed up ``stable_after_s`` seconds. Restarts never stop.
    ``jitter`` (0..1): each delay is drawn from ``[delay * (1 - jitter), delay]``, so restarts of several nodes
    (or of both services) do not fall into step."""

    initial_s: float = 1.0
    max_s: float = 30.0
    stable_after_s: float = 60.0
    jitter: float = 0.0


#: The embedded services' policy (issue 31). A service that died for a cause outside the node (a full disk, a port
#: taken) fails its restarts until the cause is gone; the delay between two attempts is what it costs on top once
#: the cause is gone, so it stays short: 0, 0.5, 1, 2, then 2-4 s (jittered) for as long as it takes. The earlier
#: policy doubled up to 30 s: after a disk-full broker death the restarts kept failing for 64 s after space was
#: freed (a 30 s wait, plus the start that was failing when the space came back, plus the start that succeeds).
EMBEDDED_RESTART = RestartPolicy(initial_s=0.5, max_s=4.0, stable_after_s=60.0, jitter=0.5)


def restart_delay(consecutive: int, policy: RestartPolicy, draw: float = 1.0) -> float:
    """Seconds to wait before the restart that follows ``consecutive`` recent restarts (pure). ``draw`` in [0, 1]
    picks the delay within the policy's jitter band (1: the full delay)."""
    if consecutive <= 0:
        return 0.0
    delay = float(min(policy.max_s, policy.initial_s * 2 ** (consecutive - 1)))
    return delay * (1.0 - policy.jitter * (1.0 - min(1.0, max(0.0, draw))))


class Supervised(Protocol):
    """What :class:`ServiceWatch` needs from an embedded service (``router.node.services`` classes fit)."""

    @property
    def pid(self) -> int | None: ...

    def alive(self) -> bool: ...

    def start(self) -> str: ...


@dataclass
class Health:
    """What ``nsjms status`` shows for one service; updated by its :class:`ServiceWatch`."""

    key: str                    # the configuration key naming it: postgres.dsn, broker.url
    address: str                # redacted
    embedded: bool
    reachable: bool | None = None
    error: str = ""
    checked_at: float | None = None
    changed_at: float | None = None
    pid: int | None = None
    restarts: int = 0
    last_restart: float | None = None
    last_restart_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "key": self.key, "address": self.address, "embedded": self.embedded,
                "reachable": self.reachable, "error": self.error, "checked_at": self.checked_at,
                "changed_at": self.changed_at, "pid": self.pid, "restarts": self.restarts,
                "last_restart": self.last_restart, "last_restart_error": self.last_restart_error,
            }

    def record_probe(self, problem: str | None, now: float) -> None:
        with self.lock:
            reachable = problem is None
            if reachable != self.reachable:
                self.changed_at = now
                if reachable:
                    log.info("%s %s is reachable", self.key, self.address)
                else:
                    log.error("%s %s is unreachable: %s", self.key, self.address, problem)
            self.reachable, self.error, self.checked_at = reachable, problem or "", now


class ServiceWatch:
    """A thread probing one service every ``interval`` s and restarting it (when embedded) if its process died."""

    def __init__(self, name: str, health: Health, probe: Callable[[], str | None],
                 service: Supervised | None = None, *, interval: float = 2.0,
                 policy: RestartPolicy = EMBEDDED_RESTART, clock: Callable[[], float] = time.monotonic,
                 draw: Callable[[], float] = random.random) -> None:
        self.name = name
        self.health = health
        self.probe = probe
        self.service = service
        self.interval = interval
        self.policy = policy
        self.clock = clock
        self.draw = draw                 # the jitter's random draw in [0, 1) (injected by tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consecutive = 0
        self._last_restart_at: float | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (waits for a restart in progress, so the caller may then stop the service)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:
                log.exception("watching %s failed; next check in %.0f s", self.name, self.interval)

    def check_once(self) -> None:
        service = self.service
        if service is not None:
            if service.alive():
                self._maybe_stable()
            else:
                self._restart(service)
            with self.health.lock:
                self.health.pid = service.pid
        if not self._stop.is_set():
            self.health.record_probe(self.probe(), time.time())

    def _maybe_stable(self) -> None:
        since = self._last_restart_at
        if since is not None and self.clock() - since >= self.policy.stable_after_s:
            self._consecutive = 0

    def _restart(self, service: Supervised) -> None:
        delay = restart_delay(self._consecutive, self.policy, self.draw())
        log.error("embedded %s (%s) is not running; restarting it in %.1f s (restart %d)",
                  self.name, self.health.key, delay, self.health.restarts + 1)
        if self._stop.wait(delay):
            return
        self._consecutive += 1
        self._last_restart_at = self.clock()
        try:
            service.start()
        except Exception as exc:  # noqa: BLE001 — reported, retried with a longer delay at the next check
            with self.health.lock:
                self.health.last_restart_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("restarting embedded %s failed: %s", self.name, exc)
            return
        with self.health.lock:
            self.health.restarts += 1
            self.health.last_restart = time.time()
            self.health.last_restart_error = ""
        log.warning("embedded %s restarted (pid %s, restart %d)", self.name, service.pid, self.health.restarts)
