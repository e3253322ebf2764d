"""The embedded PostgreSQL: a private cluster in ``base_dir/pg`` on 127.0.0.1, reused after its supervisor's crash
(see :mod:`router.node.services`)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from router.node.lifecycle import ServiceError
from router.node.services.process import (
    LOCALHOST,
    PRIVATE_UMASK,
    ensure_port_free,
    is_zombie,
    pid_alive,
    pid_exists,
    tail,
)

__all__ = ["PG_OS_USER", "EmbeddedPostgres"]

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
PG_OS_USER = "postgres"
PG_DATABASE = "nsjms"
PG_SUPERUSER = "postgres"

log = logging.getLogger("nsjms.services")


class EmbeddedPostgres:
    """A private PostgreSQL cluster in ``base_dir/pg``, listening on 127.0.0.1:``port``.

    ``start()`` returns a DSN for database ``nsjms`` (superuser ``postgres``, generated password). As root the
    server runs as the ``postgres`` OS user (it refuses root); otherwise as the current user.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.root = Path(base_dir).resolve() / "pg"
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.password_file = self.root / "password"
        self.port = port
        self.timeout = timeout
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.dsn = ""
        self.reused = False  # the last start() kept a server already running here

    # -- public
    def start(self) -> str:
        """Create the cluster if missing, start it (or reuse the one already running here), return the DSN."""
        self._bin("postgres")
        self._prepare_root()
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        running = self._running_port()
        if running is not None and running != self.port:
            self._pg_ctl("stop", "-m", "fast")
            running = None
        self.reused = running is not None
        if running is None:
            ensure_port_free(self.port, "embedded PostgreSQL", "postgres.embedded_port")
            self._start_server()
        self._ensure_password_and_database()
        self.dsn = self._make_dsn()
        return self.dsn

    def stop(self) -> None:
        """Fast shutdown (prepared transactions survive); a no-op when the server is not running."""
        if self._running_port() is not None:
            self._pg_ctl("stop", "-m", "fast")

    def is_running(self) -> bool:
        return self._running_port() is not None

    def alive(self) -> bool:
        """The postmaster of this data directory runs (what the node's supervision checks)."""
        return self.is_running()

    @property
    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if self.is_running() else None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- binaries and users
    def _bin(self, name: str) -> str:
        dirs = [self._bin_dir] if self._bin_dir is not None else [Path(d) for d in PG_BIN_CANDIDATES]
        for directory in dirs:
            if (directory / name).is_file():
                return str(directory / name)
        raise ServiceError(
            f"PostgreSQL server binary {name!r} not found in {', '.join(map(str, dirs))}: "
            "install it with `apt-get install postgresql-15` (or run scripts/bootstrap.sh)"
        )

    def _as_postgres(self) -> bool:
        return os.geteuid() == 0

    def _run(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        if self._as_postgres():
            argv = ["runuser", "-u", PG_OS_USER, "--", *argv]
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout + 30,
                stdin=subprocess.DEVNULL,
                check=False,
                umask=PRIVATE_UMASK,
            )
        except FileNotFoundError as exc:
            raise ServiceError(f"{what}: cannot run {argv[0]!r}: {exc.strerror}") from exc
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(f"{what}: timed out after {exc.timeout:.0f} s\n{tail(self.log)}") from exc

    def _prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if not self._as_postgres():
            return
        try:
            shutil.chown(self.root, PG_OS_USER, PG_OS_USER)
        except LookupError as exc:
            raise ServiceError(
                f"OS user {PG_OS_USER!r} does not exist: install `postgresql-15` "
                "(it creates the user) or run as a non-root user"
            ) from exc
        probe = self._run(["test", "-w", str(self.root)], "permission check")
        if probe.returncode != 0:
            raise ServiceError(
                f"the {PG_OS_USER!r} OS user cannot reach {self.root}: make every parent "
                "directory traversable (chmod o+x) or use a state_dir elsewhere"
            )

    # -- cluster lifecycle
    def _initdb(self) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)  # remains of an interrupted initdb: ours, never initialised
        result = self._run(
            [
                self._bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                PG_SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
            "initdb",
        )
        if result.returncode != 0:
            raise ServiceError(
                f"initdb failed for {self.data}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )

    def _server_options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses={LOCALHOST} -c max_prepared_transactions=64 "
            "-c unix_socket_permissions=0700"
        )

    def _start_server(self) -> None:
        self._wait_stale_postmaster_gone()
        deadline = time.monotonic() + self.timeout
        while True:
            result = self._pg_ctl_raw("start", "-l", str(self.log), "-o", self._server_options())
            if result.returncode == 0:
                return
            # After a SIGKILL of the postmaster its children may hold the old shared memory for a moment.
            if time.monotonic() >= deadline or "shared memory block is still in use" not in tail(
                self.log, 5
            ):
                raise ServiceError(
                    f"PostgreSQL did not start on port {self.port}: {result.stderr.strip()}\n"
                    f"--- tail of {self.log} ---\n{tail(self.log)}"
                )
            time.sleep(0.5)

    def _wait_stale_postmaster_gone(self) -> None:
        """After a SIGKILL the dead postmaster stays in the process table for a moment: still exiting (its command
        line already gone, so it no longer counts as running here), then a zombie until its parent reaps it.
        PostgreSQL refuses to start while the pid of its lock file exists at all ("lock file postmaster.pid already
        exists"), so wait until it is gone (a pid that is a running postmaster of this data directory is not
        stale: the caller stops or reuses that one)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return

        def stale() -> bool:      # a zombie or an exiting process has no command line: not a postmaster
            return pid_exists(pid) and not self._is_postmaster(pid)

        deadline = time.monotonic() + 15
        while stale() and time.monotonic() < deadline:
            time.sleep(0.05)
        if stale():
            if is_zombie(pid):
                raise ServiceError(
                    f"the previous postmaster (pid {pid}) of {self.data} is dead but not reaped yet; "
                    "its parent must reap it before the cluster can start again"
                )
            raise ServiceError(
                f"the pid {pid} of {self.data / 'postmaster.pid'} belongs to a process that is not this cluster's "
                "postmaster; PostgreSQL will not start while it exists (remove the stale postmaster.pid once you "
                "are sure no postmaster runs on this data directory)"
            )

    def _pg_ctl_raw(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [self._bin("pg_ctl"), "-D", str(self.data), "-w", "-t", str(int(self.timeout)), *args, action]
        return self._run(argv, f"pg_ctl {action}")

    def _pg_ctl(self, action: str, *args: str) -> None:
        result = self._pg_ctl_raw(action, *args)
        if result.returncode != 0:
            raise ServiceError(f"pg_ctl {action} failed: {result.stderr.strip()}\n{tail(self.log)}")

    def _running_port(self) -> int | None:
        """Port of the postmaster running on this data directory, or None (also for a stale pid file)."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        return port if pid_alive(pid) and self._is_postmaster(pid) else None

    def _is_postmaster(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(part.endswith(b"postgres") for part in cmdline[:1]) and str(self.data).encode() in cmdline

    # -- credentials and database
    def _socket_conninfo(self) -> str:
        conninfo: str = make_conninfo(
            host=str(self.root), port=self.port, user=PG_SUPERUSER, dbname="postgres", connect_timeout=10
        )
        return conninfo

    def _ensure_password_and_database(self) -> None:
        try:
            self._setup_over_socket()
        except psycopg.Error as exc:
            raise ServiceError(
                f"embedded PostgreSQL on port {self.port} is up but not usable: {exc}"
            ) from exc

    def _setup_over_socket(self) -> None:
        """Set the superuser password to the ``password`` file's (generated on first start; a rotated one,
        ``nsjms credentials rotate --surface postgres``, is applied here at the next start) and create the ``nsjms``
        database if missing."""
        password = self._read_password()
        with psycopg.connect(self._socket_conninfo(), autocommit=True) as conn:
            if password is None:
                password = secrets.token_urlsafe(24)
                self._write_password(password)
            # the client computes the SCRAM verifier (as psql's \password does): the password itself never reaches
            # the server, whose log would show it with log_statement=ddl or a failed statement (review finding)
            verifier = conn.pgconn.encrypt_password(password.encode(), PG_SUPERUSER.encode(), b"scram-sha-256")
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(PG_SUPERUSER), sql.Literal(verifier.decode())
                )
            )
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_DATABASE)))

    def _read_password(self) -> str | None:
        try:
            return self.password_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def rotate_password(self) -> None:
        """A new superuser password in the ``password`` file, applied at the next :meth:`start` (node stopped)."""
        self._write_password(secrets.token_urlsafe(24))

    def _write_password(self, password: str) -> None:
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        if self._as_postgres():
            shutil.chown(self.password_file, PG_OS_USER, PG_OS_USER)

    def _make_dsn(self) -> str:
        password = self._read_password() or ""
        return f"postgresql://{PG_SUPERUSER}:{password}@{LOCALHOST}:{self.port}/{PG_DATABASE}"
