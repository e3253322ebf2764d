"""The embedded ActiveMQ Classic: a private broker in ``base_dir/activemq``, STOMP and OpenWire on 127.0.0.1,
authenticated when asked, adopted after its supervisor's crash when ours and healthy (see :mod:`router.node.services`).
``AMQ_XML`` and ``AMQ_AUTH`` are also the templates of the container image's configuration
(``deploy/images/activemq/render.py``)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from router.node.lifecycle import ServiceError, private_tree, stomp_probe, write_private
from router.node.services.process import (
    LOCALHOST,
    PRIVATE_UMASK,
    ensure_port_free,
    pid_alive,
    tail,
    wait_for_port,
    wait_gone,
)

__all__ = ["AMQ_AUTH", "AMQ_XML", "BROKER_OS_USER", "EmbeddedActiveMQ"]

AMQ_HOME = Path("/usr/share/activemq")
AMQ_INSTANCE = Path("/etc/activemq/instances-available/main")
AMQ_EXTRA_JARS = ("jettison.jar", "xstream.jar", "xpp3.jar", "xmlpull.jar", "mxparser.jar")
JAVA_SHARE = Path("/usr/share/java")
AMQ_LOGIN = "nsjms"
#: The OS user the node's embedded broker runs as when the node runs as root: the system user Debian's ``activemq``
#: package creates (its JVM never runs as root; docs/security.md).
BROKER_OS_USER = "activemq"

log = logging.getLogger("nsjms.services")


AMQ_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by nsjms (router/node/services/activemq.py) at every start; do not edit: changes are overwritten. -->
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
AMQ_LOG4J = """# Written by nsjms (router/node/services/activemq.py) at every start; do not edit: it is overwritten.
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
AMQ_AUTH = """        <plugins>
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
            ensure_port_free(port, what, key)
        self._write_instance(xml)
        self._give_tree()
        self._spawn(java)
        try:
            wait_for_port(LOCALHOST, self.stomp_port, self.timeout, abort=self._exited)
        except ServiceError as exc:
            self.stop()
            raise ServiceError(
                f"ActiveMQ did not open STOMP port {self.stomp_port}: {exc}\n"
                f"--- tail of {self.broker_log} ---\n{tail(self.broker_log)}\n"
                f"--- tail of {self.console_log} ---\n{tail(self.console_log)}"
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
        return pid if mine and pid_alive(pid) else None

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
        if not wait_gone(pid, self.stop_timeout):
            os.kill(pid, signal.SIGKILL)
            if not wait_gone(pid, 10):
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
        plugins = AMQ_AUTH.format(login=self.login, passcode=self.passcode) if self.authenticate else ""
        return AMQ_XML.format(
            plugins=plugins, host=LOCALHOST, openwire=self.openwire_port, stomp=self.stomp_port
        )

    def _write_instance(self, xml: str) -> None:
        shutil.copyfile(AMQ_INSTANCE / "log4j2.properties", self.root / "log4j2.properties")
        os.chmod(self.root / "log4j2.properties", 0o600)
        write_private(self.root / "log4j.properties", AMQ_LOG4J)
        write_private(self.root / "activemq.xml", xml)  # holds the passcode
        self._link_extra_jars()

    def _link_extra_jars(self) -> None:
        """Link jettison/xstream (``jms-json`` transformations) into ``$activemq.base/lib`` if installed."""
        for name in AMQ_EXTRA_JARS:
            source, target = JAVA_SHARE / name, self.root / "lib" / name
            if source.exists() and not target.exists():
                target.symlink_to(source)
