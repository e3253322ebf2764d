"""``[console] tls_cert/tls_key``: the console is served over HTTPS by cheroot with the standard ``ssl`` module, its
cookies are Secure and HSTS is sent; unreadable TLS files and a taken port are ConsoleErrors naming the key."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from router.console import ConsoleError, start_console


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(state_dir: Path) -> SimpleNamespace:
    """Enough of a node for the sign-in page (which reads nothing of the node)."""
    return SimpleNamespace(s=SimpleNamespace(state_dir=state_dir), txn_admin=SimpleNamespace(ops=None))


def test_https_secure_cookie_and_hsts(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    console = start_console(_node(tmp_path), "127.0.0.1", _free_port(), str(cert), str(key))
    try:
        assert console.url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(cert))
        port = int(console.url.rstrip("/").rsplit(":", 1)[1])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        conn.request("GET", "/login")
        resp = conn.getresponse()
        assert resp.status == 200
        assert "Secure" in resp.getheader("Set-Cookie", "") and "HttpOnly" in resp.getheader("Set-Cookie", "")
        assert resp.getheader("Strict-Transport-Security", "").startswith("max-age=")
        conn.close()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            raw.sendall(b"GET /login HTTP/1.0\r\n\r\n")     # plain HTTP to the TLS port gets no page
            try:
                data = raw.recv(4096)
            except ConnectionResetError:
                data = b""
        assert b"Sign in" not in data and b"200 OK" not in data
    finally:
        console.stop()


def test_bad_tls_files_and_taken_port_are_console_errors(tmp_path: Path) -> None:
    with pytest.raises(ConsoleError, match=r"console\.tls_cert"):
        start_console(_node(tmp_path), "127.0.0.1", _free_port(), str(tmp_path / "no.pem"), str(tmp_path / "no.key"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConsoleError, match=r"console\.port"):
            start_console(_node(tmp_path), "127.0.0.1", int(taken.getsockname()[1]))
