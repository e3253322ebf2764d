"""The operator web console (docs/console.md): served by the node (``nsjms serve``) when ``[console] enabled``.

Flask renders the pages (Jinja2 templates, vendored static files, no CDN); cheroot (CherryPy's thread-pooled WSGI
server, TLS through the standard ``ssl`` module) serves them from threads of the node process: the node has no
asyncio loop (omniORB and stomp.py are thread-based), and the console calls the node's objects in-process through
the CLI's own functions (:mod:`router.console.backend`).

Exceptions::

    Exception
     └── ConsoleError        the console cannot be served (address taken, TLS files unreadable)
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["ConsoleError", "ConsoleServer", "start_console"]

log = logging.getLogger("nsjms.console")


class ConsoleError(Exception):
    """The console cannot be served; the message names the key and why."""


@dataclass
class ConsoleServer:
    url: str
    server: Any
    thread: threading.Thread
    sampler: Any

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=10)
        self.sampler.stop()


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as cheroot binds
        probe.bind((host, port))


def start_console(node: Any, host: str, port: int, tls_cert: str = "", tls_key: str = "",
                  audit_reports: str = "") -> ConsoleServer:
    """Serve the console of a started node on ``host:port`` (TLS when both files are given); returns at once.
    ``audit_reports``: the directory of ``nsjms audit`` reports (default ``<state-dir>/audit``)."""
    from pathlib import Path

    from cheroot import wsgi

    from router.console.app import create_app
    from router.console.auditruns import AuditRuns, nsjms_audit_command
    from router.console.backend import NodeBackend
    from router.console.views import RateSampler

    backend = NodeBackend(node)
    sampler = RateSampler(backend.snapshot)
    tls = bool(tls_cert and tls_key)
    reports = Path(audit_reports) if audit_reports else backend.state_dir / "audit"
    runs = AuditRuns(reports, nsjms_audit_command(backend.state_dir),
                     env={"NSJMS_POSTGRES_DSN": str(node.pg_dsn)} if getattr(node, "pg_dsn", None) else None)
    app = create_app(backend, secure_cookies=tls, sampler=sampler, audit_runs=runs)
    server = wsgi.Server((host, port), app, numthreads=4, server_name="nsjms-console")
    if tls:
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        try:
            server.ssl_adapter = BuiltinSSLAdapter(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConsoleError(f"console.tls_cert / console.tls_key: cannot load: {exc}") from exc
    try:
        _check_free(host, port)   # cheroot's prepare() drops (never closes) its socket when the bind fails
        server.prepare()
    except OSError as exc:
        raise ConsoleError(f"console.port {host}:{port}: cannot serve there: {exc.strerror or exc}") from exc
    bound = server.bind_addr[1] if isinstance(server.bind_addr, tuple) else port
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if tls else 'http'}://{shown}:{bound}/"
    thread = threading.Thread(target=server.serve, name="console-http", daemon=True)
    thread.start()
    sampler.start()
    log.info("console serving at %s", url)
    return ConsoleServer(url, server, thread, sampler)
