"""Supervisors for private PostgreSQL and ActiveMQ instances living under a state directory.

``nsjms serve`` starts them when ``postgres.dsn`` / ``broker.url`` are empty; test fixtures start them when
no external service is given. Both listen on 127.0.0.1 only and survive a ``kill -9`` of their supervisor: the
next ``start()`` on the same state directory reuses the running PostgreSQL (same port) or stops it and starts
it again (other port), and reuses a leftover ActiveMQ (found through its pid file) when it is ours and healthy:
same ``activemq.xml`` (ports, credentials, policies) and an authenticated STOMP CONNECT answered; otherwise it
stops it and starts a fresh one. Callers must hold the state directory's lock (:mod:`router.lifecycle`) before
``start()``: it may stop a leftover service, which must never be one a live node owns.

Files are private: directories 0700, files 0600 (the broker runs with umask 0077; PostgreSQL sets its own).
With ``authenticate=True`` (what ``nsjms serve`` uses) the broker's STOMP and OpenWire connectors require the
login/passcode generated on first start and kept in ``activemq/credentials`` (mode 0600).

Layout under ``base_dir``::

    pg/            owned by the ``postgres`` OS user when running as root; also the unix socket directory
      data/        the cluster (initdb on first start)
      server.log
      password     generated superuser password for TCP connections (mode 0600)
    activemq/      activemq.xml, log4j.properties and log4j2.properties, lib/ (extra jars), data/ (the KahaDB store
                   and activemq.log, rotated at 10 MB x 5), tmp/, console.log, broker.pid, credentials (login and
                   generated passcode, mode 0600)

Exceptions: :class:`ServiceError` (missing binaries naming the apt package, busy port, start/stop timeout); the
tree is drawn in :mod:`router.lifecycle`.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from router.lifecycle import ServiceError, private_tree, stomp_probe, write_private

__all__ = [
    "EmbeddedActiveMQ",
    "EmbeddedPostgres",
    "ServiceError",
    "free_port",
    "private_tree",
    "stomp_probe",
    "wait_for_port",
]

LOCALHOST = "127.0.0.1"
PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
PG_OS_USER = "postgres"
PG_DATABASE = "nsjms"
PG_SUPERUSER = "postgres"
AMQ_HOME = Path("/usr/share/activemq")
AMQ_INSTANCE = Path("/etc/activemq/instances-available/main")
AMQ_EXTRA_JARS = ("jettison.jar", "xstream.jar", "xpp3.jar", "xmlpull.jar", "mxparser.jar")
JAVA_SHARE = Path("/usr/share/java")
AMQ_LOGIN = "nsjms"
#: The OS user the node's embedded broker runs as when the node runs as root: the system user Debian's ``activemq``
#: package creates (its JVM never runs as root; docs/security.md).
BROKER_OS_USER = "activemq"
PRIVATE_UMASK = 0o077

log = logging.getLogger("nsjms.services")


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


def _ensure_port_free(port: int, what: str, key: str) -> None:
    """Raises ServiceError naming the configuration ``key`` that chose the port (as ``orb.port``'s message does)."""
    if port_in_use(port):
        raise ServiceError(
            f"{key}: port {port} on {LOCALHOST} (wanted for {what}) is already in use; "
            f"set {key} to another port or stop the process holding it"
        )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"(empty log at {path})"


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` is in the process table (running, exiting or a zombie): what PostgreSQL's lock file checks."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_alive(pid: int) -> bool:
    return _pid_exists(pid) and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


# -------------------------------------------------------------------------------------- PostgreSQL
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
            _ensure_port_free(self.port, "embedded PostgreSQL", "postgres.embedded_port")
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
            raise ServiceError(f"{what}: timed out after {exc.timeout:.0f} s\n{_tail(self.log)}") from exc

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
            if time.monotonic() >= deadline or "shared memory block is still in use" not in _tail(
                self.log, 5
            ):
                raise ServiceError(
                    f"PostgreSQL did not start on port {self.port}: {result.stderr.strip()}\n"
                    f"--- tail of {self.log} ---\n{_tail(self.log)}"
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
            return _pid_exists(pid) and not self._is_postmaster(pid)

        deadline = time.monotonic() + 15
        while stale() and time.monotonic() < deadline:
            time.sleep(0.05)
        if stale():
            if _is_zombie(pid):
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
            raise ServiceError(f"pg_ctl {action} failed: {result.stderr.strip()}\n{_tail(self.log)}")

    def _running_port(self) -> int | None:
        """Port of the postmaster running on this data directory, or None (also for a stale pid file)."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        return port if _pid_alive(pid) and self._is_postmaster(pid) else None

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


# ---------------------------------------------------------------------------------------- ActiveMQ
_AMQ_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by nsjms (router/services.py) at every start; do not edit: changes are overwritten. -->
<beans
  xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
    <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
    <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="localhost"
            dataDirectory="${{activemq.base}}/data" schedulerSupport="true">
        <!-- Dead-letter non-persistent and expired messages too (ActiveMQ's default discards non-persistent ones). -->
        <destinationPolicy>
            <policyMap>
                <policyEntries>
                    <policyEntry queue=">">
                        <deadLetterStrategy>
                            <sharedDeadLetterStrategy processNonPersistent="true" processExpired="true"/>
                        </deadLetterStrategy>
                    </policyEntry>
                    <policyEntry topic=">">
                        <deadLetterStrategy>
                            <sharedDeadLetterStrategy processNonPersistent="true" processExpired="true"/>
                        </deadLetterStrategy>
                    </policyEntry>
                </policyEntries>
            </policyMap>
        </destinationPolicy>
        <persistenceAdapter>
            <kahaDB directory="${{activemq.base}}/data/kahadb"/>
        </persistenceAdapter>
{plugins}        <transportConnectors>
            <transportConnector name="openwire" uri="tcp://{host}:{openwire}"/>
            <transportConnector name="stomp" uri="stomp://{host}:{stomp}?transport.tcpNoDelay=true"/>
        </transportConnectors>
    </broker>
</beans>
"""
#: The broker's log (issue 31: it wrote none). Debian's ActiveMQ 5.17 logs through slf4j-log4j12 and log4j 1.2
#: (``/usr/share/activemq/lib/optional``), which never reads the ``log4j2.properties`` Debian ships in
#: ``instances-available/main`` ("log4j:WARN No appenders could be found"), so the broker gets this log4j 1.2
#: configuration (``-Dlog4j.configuration``) as well as that file (for an ActiveMQ that logs through log4j2):
#: ``data/activemq.log`` in the node's state directory, rotated at 10 MB, five old files kept (60 MB at most).
_AMQ_LOG4J = """# Written by nsjms (router/services.py) at every start; do not edit: changes are overwritten.
log4j.rootLogger=INFO, logfile
log4j.logger.org.apache.activemq.spring=WARN
log4j.logger.org.apache.activemq.web.handler=WARN
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.logger.org.eclipse.jetty=WARN
log4j.appender.logfile=org.apache.log4j.RollingFileAppender
log4j.appender.logfile.File=${activemq.data}/activemq.log
log4j.appender.logfile.MaxFileSize=10MB
log4j.appender.logfile.MaxBackupIndex=5
log4j.appender.logfile.Append=true
log4j.appender.logfile.layout=org.apache.log4j.PatternLayout
log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""
_AMQ_AUTH = """        <plugins>
            <simpleAuthenticationPlugin anonymousAccessAllowed="false">
                <users>
                    <authenticationUser username="{login}" password="{passcode}" groups="admins,users"/>
                </users>
            </simpleAuthenticationPlugin>
        </plugins>
"""


class EmbeddedActiveMQ:
    """A private ActiveMQ Classic broker in ``base_dir/activemq``: STOMP and OpenWire on 127.0.0.1.

    ``authenticate=True`` makes both connectors require ``login``/``passcode`` (generated on first start, kept in
    ``activemq/credentials``); ``nsjms serve`` always uses it. With ``False`` (test fixtures) anyone connects.
    Non-persistent and expired messages are dead-lettered to ``ActiveMQ.DLQ`` like persistent ones.

    ``die_with_parent=True`` asks the kernel to SIGTERM the broker when the *thread* that called ``start()``
    ends (use it from a main thread only, e.g. test fixtures). Without it, a broker left by a killed
    supervisor is found through ``broker.pid`` and reused by the next ``start()`` when it is ours and healthy.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        stomp_port: int,
        openwire_port: int,
        *,
        timeout: float = 120.0,
        stop_timeout: float = 30.0,
        die_with_parent: bool = False,
        authenticate: bool = False,
        reuse: bool = True,
        os_user: str | None = None,
    ) -> None:
        self.root = Path(base_dir).resolve() / "activemq"
        self.os_user = os_user  # run the JVM as this user, owning activemq/ (None: as this process)
        self.stomp_port = stomp_port
        self.openwire_port = openwire_port
        self.timeout = timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        self.authenticate = authenticate
        self.reuse = reuse
        self.pid_file = self.root / "broker.pid"
        self.credentials_file = self.root / "credentials"
        self.console_log = self.root / "console.log"
        self.broker_log = self.root / "data" / "activemq.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.login = ""
        self.passcode = ""
        self.reused = False  # the last start() adopted a running broker instead of starting one

    # -- public
    def start(self) -> str:
        """Write the instance config, start the broker (or adopt ours), wait for STOMP; return its URL."""
        java = self._java()
        self.reused = False
        self._prepare_root()
        if self.authenticate:
            self.login, self.passcode = self._credentials()
        xml = self._instance_xml()
        self.url = f"stomp://{LOCALHOST}:{self.stomp_port}"
        if self.reuse and self._adopt_leftover(xml):
            return self.url
        self._kill_leftover()
        for port, what, key in ((self.stomp_port, "ActiveMQ STOMP", "broker.embedded_stomp_port"),
                                (self.openwire_port, "ActiveMQ OpenWire", "broker.embedded_openwire_port")):
            _ensure_port_free(port, what, key)
        self._write_instance(xml)
        self._give_tree()
        self._spawn(java)
        try:
            wait_for_port(LOCALHOST, self.stomp_port, self.timeout, abort=self._exited)
        except ServiceError as exc:
            self.stop()
            raise ServiceError(
                f"ActiveMQ did not open STOMP port {self.stomp_port}: {exc}\n"
                f"--- tail of {self.broker_log} ---\n{_tail(self.broker_log)}\n"
                f"--- tail of {self.console_log} ---\n{_tail(self.console_log)}"
            ) from None
        private_tree(self.root)
        return self.url

    def stop(self) -> None:
        """SIGTERM the broker, SIGKILL it after ``stop_timeout`` s; a no-op when it is not running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._stop_child(proc)
        else:
            self._kill_leftover()
        self.pid_file.unlink(missing_ok=True)

    def is_running(self) -> bool:
        return self._leftover_pid() is not None

    def alive(self) -> bool:
        """The broker process runs (our child, or the adopted leftover); what the node's supervision checks."""
        if self._proc is not None:
            return self._proc.poll() is None
        return self.is_running()

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid if self._proc.poll() is None else None
        return self._leftover_pid()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- process management
    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise ServiceError(
                "`java` not found on PATH: install it with `apt-get install default-jre-headless`"
            )
        if not (AMQ_HOME / "bin" / "activemq.jar").exists() or not (AMQ_INSTANCE / "log4j2.properties").exists():
            raise ServiceError(
                f"ActiveMQ not found under {AMQ_HOME} / {AMQ_INSTANCE}: install it with "
                "`apt-get install activemq` (or run scripts/bootstrap.sh)"
            )
        return java

    def _command(self, java: str) -> list[str]:
        base = str(self.root)
        return [
            java,
            "-Xms256M",
            "-Xmx512M",
            f"-Dactivemq.home={AMQ_HOME}",
            f"-Dactivemq.base={base}",
            f"-Dactivemq.conf={base}",
            f"-Dactivemq.data={base}/data",
            f"-Djava.io.tmpdir={base}/tmp",
            f"-Dlog4j.configuration=file:{base}/log4j.properties",
            "--add-opens",
            "java.base/java.lang=ALL-UNNAMED",
            "-jar",
            str(AMQ_HOME / "bin" / "activemq.jar"),
            "start",
            f"xbean:file:{base}/activemq.xml",
        ]

    def _give_tree(self) -> None:
        """With ``os_user``: ``activemq/`` and everything in it belongs to that user (mode bits stay private)."""
        if self.os_user is None:
            return
        uid, gid = self._uid_gid()
        for directory, dirs, files in os.walk(self.root):
            for name in (*dirs, *files):
                os.chown(Path(directory) / name, uid, gid, follow_symlinks=False)
        os.chown(self.root, uid, gid)

    def _uid_gid(self) -> tuple[int, int]:
        import pwd

        try:
            entry = pwd.getpwnam(self.os_user or "")
        except KeyError:
            raise ServiceError(f"the embedded broker runs as OS user {self.os_user!r}, which does not exist: install "
                               "the `activemq` package (it creates the user) or run the node as a non-root user"
                               ) from None
        return entry.pw_uid, entry.pw_gid

    def _spawn(self, java: str) -> None:
        argv = self._command(java)
        user = group = None
        groups: list[int] | None = None
        env = None
        if self.os_user is not None:
            user, group = self._uid_gid()
            top = os.stat(self.root.parent).st_gid  # the group that may traverse the state directory (0710)
            groups = [top] if top not in (0, group) else []
            env = dict(os.environ, HOME=str(self.root))
        setpriv = shutil.which("setpriv")
        if self.die_with_parent and setpriv:  # util-linux: prctl(PR_SET_PDEATHSIG) then exec, same pid
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        fd = os.open(self.console_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as console:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                umask=PRIVATE_UMASK,  # journal, logs and temp files readable by the broker's user only
                user=user,
                group=group,
                extra_groups=groups,
                env=env,
            )
        write_private(self.pid_file, f"{self._proc.pid}\n")

    def _exited(self) -> str | None:
        if self._proc is not None and self._proc.poll() is not None:
            return f"the broker process exited with status {self._proc.returncode}"
        return None

    def _stop_child(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def _leftover_pid(self) -> int | None:
        """The pid in ``broker.pid`` if that process is alive and is a broker for this directory."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        mine = f"-Dactivemq.base={self.root}".encode() in cmdline.split(b"\0")
        return pid if mine and _pid_alive(pid) else None

    def _adopt_leftover(self, xml: str) -> bool:
        """Keep a running broker of this directory when it was started with exactly this configuration (ports,
        credentials, policies) and answers an authenticated STOMP CONNECT: its clients stay connected."""
        pid = self._leftover_pid()
        if pid is None:
            return False
        try:
            same_config = (self.root / "activemq.xml").read_text() == xml
        except OSError:
            same_config = False
        problem = (
            stomp_probe(LOCALHOST, self.stomp_port, self.login, self.passcode, 5.0)
            if same_config
            else "its configuration differs"
        )
        if problem is not None:
            log.warning("leftover ActiveMQ (pid %d) in %s is not reused (%s): restarting it", pid, self.root, problem)
            return False
        log.info("reusing the running ActiveMQ (pid %d) of %s", pid, self.root)
        self.reused = True
        return True

    def _kill_leftover(self) -> None:
        pid = self._leftover_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, self.stop_timeout):
            os.kill(pid, signal.SIGKILL)
            if not _wait_gone(pid, 10):
                raise ServiceError(f"leftover ActiveMQ (pid {pid}) from {self.root} did not die")

    # -- instance configuration
    def _prepare_root(self) -> None:
        for sub in ("", "data", "tmp", "lib"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        private_tree(self.root)

    def rotate_credentials(self) -> None:
        """A new passcode in ``credentials``; the next :meth:`start` writes it into the broker's configuration and
        restarts a leftover broker running with the old one (node stopped)."""
        write_private(self.credentials_file, f"{AMQ_LOGIN}\n{secrets.token_urlsafe(24)}\n")
        if self.os_user is not None:
            os.chown(self.credentials_file, *self._uid_gid())

    def _credentials(self) -> tuple[str, str]:
        """``(login, passcode)``: read from ``credentials`` or generated (and stored, mode 0600) on first use."""
        try:
            login, passcode = self.credentials_file.read_text().split("\n")[:2]
            if login and passcode:
                return login, passcode
        except (OSError, ValueError):
            pass
        passcode = secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe in XML attributes and STOMP headers
        write_private(self.credentials_file, f"{AMQ_LOGIN}\n{passcode}\n")
        return AMQ_LOGIN, passcode

    def _instance_xml(self) -> str:
        plugins = _AMQ_AUTH.format(login=self.login, passcode=self.passcode) if self.authenticate else ""
        return _AMQ_XML.format(
            plugins=plugins, host=LOCALHOST, openwire=self.openwire_port, stomp=self.stomp_port
        )

    def _write_instance(self, xml: str) -> None:
        shutil.copyfile(AMQ_INSTANCE / "log4j2.properties", self.root / "log4j2.properties")
        os.chmod(self.root / "log4j2.properties", 0o600)
        write_private(self.root / "log4j.properties", _AMQ_LOG4J)
        write_private(self.root / "activemq.xml", xml)  # holds the passcode
        self._link_extra_jars()

    def _link_extra_jars(self) -> None:
        """Link jettison/xstream (``jms-json`` transformations) into ``$activemq.base/lib`` if installed."""
        for name in AMQ_EXTRA_JARS:
            source, target = JAVA_SHARE / name, self.root / "lib" / name
            if source.exists() and not target.exists():
                target.symlink_to(source)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
