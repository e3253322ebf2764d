"""How one configuration value is checked and shown: the parsers of the keys (each raises ``_Invalid`` with the
expectation for the error message) and ``_Key``, a key's parser with its secrecy."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from router.node.config.redact import _URL_START, REDACTED, _mask, _redact_or_hide, redact_dsn

__all__ = ["BROKER_SCHEMES", "EXPORTERS", "LOG_LEVELS", "PLACEMENTS", "broker_addresses"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_HOST = re.compile(r"[A-Za-z0-9.:_-]{1,253}")


Parser = Callable[[Any, bool], Any]  # (raw value, came from text?) -> typed value; raises _Invalid


class _Invalid(Exception):
    """Internal: a value failed its check; carries the expectation for the error message."""


@dataclass(frozen=True)
class _Key:
    parse: Parser
    secret: bool = False  # the whole value is secret
    has_credentials: bool = False  # the value may embed a password (DSN, URL)

    def show(self, value: Any) -> Any:
        if self.secret:
            return _mask(str(value))
        if self.has_credentials:
            return redact_dsn(str(value))
        return str(value) if isinstance(value, Path) else value

    def describe(self, raw: Any) -> str:
        if self.secret:
            return repr(REDACTED)
        if self.has_credentials and isinstance(raw, str):
            return repr(_redact_or_hide(raw))
        return repr(raw)


def _integer(low: int, high: int) -> Parser:
    def parse(raw: Any, textual: bool) -> int:
        value = raw
        if textual and isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            value = int(raw)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"expected an integer {low}-{high}")
        return value

    return parse


def _boolean(raw: Any, textual: bool) -> bool:
    if isinstance(raw, bool):
        return raw
    if textual and isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return raw.strip().lower() in ("true", "1", "yes")
    raise _Invalid("expected a boolean (true/false)")


def _string(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str):
        raise _Invalid("expected a string")
    return raw


def _path(raw: Any, textual: bool) -> Path:
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise _Invalid("expected a non-empty path")
    return Path(raw).expanduser()


def _node_id(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or not _NODE_ID.fullmatch(raw):
        raise _Invalid("expected 1-32 characters from [A-Za-z0-9_-]")
    return raw


def _log_level(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or raw.strip().upper() not in LOG_LEVELS:
        raise _Invalid("expected one of " + ", ".join(LOG_LEVELS))
    return raw.strip().upper()


def _host(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or not _HOST.fullmatch(raw):
        raise _Invalid("expected a host name or IP address")
    return raw


def _dsn(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    if not value:
        return ""
    expectation = "expected a postgresql:// URL, a key=value DSN or an empty string"
    if _URL_START.match(value) and urlsplit(value).scheme not in ("postgresql", "postgres"):
        raise _Invalid(expectation)
    try:
        conninfo_to_dict(value)
    except psycopg.ProgrammingError as exc:
        raise _Invalid(expectation) from exc
    return value


BROKER_SCHEMES = ("stomp", "stomp+ssl")  # the node's transports (router.jms.transport's table, minus memory://)


def _broker_url(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    if not value:
        return ""
    expectation = (
        "expected a URL stomp://HOST:PORT or stomp+ssl://HOST:PORT (failover: HOST:PORT,HOST:PORT) or an empty string"
    )
    if not _URL_START.match(value):
        raise _Invalid(expectation)
    parts = urlsplit(value)
    if parts.scheme.lower() not in BROKER_SCHEMES:
        raise _Invalid(f"unsupported scheme {parts.scheme + '://'!r}; {expectation}")
    if "@" in parts.netloc:
        raise _Invalid("credentials do not belong in the URL: set broker.login and broker.passcode")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _Invalid(expectation)
    for item in parts.netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _Invalid(expectation)
    return value


def broker_addresses(url: str) -> list[tuple[str, int]]:
    """``[(host, port), ...]`` of a URL accepted by ``broker.url`` (empty for an empty URL)."""
    if not url:
        return []
    out = []
    for item in urlsplit(url).netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


_PORT = _integer(1, 65535)


EXPORTERS = ("none", "console", "prometheus", "otlp")


def _exporter(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip().lower()
    if value not in EXPORTERS:
        raise _Invalid("expected one of " + ", ".join(repr(e) for e in EXPORTERS))
    return value


PLACEMENTS = ("creator", "least-loaded")


def _placement(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip().lower()
    if value not in PLACEMENTS:
        raise _Invalid("expected one of " + ", ".join(repr(p) for p in PLACEMENTS))
    return value


def _listen_address(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    host, _, port = value.rpartition(":")
    if not _HOST.fullmatch(host.strip("[]") or "-") or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _Invalid("expected HOST:PORT, e.g. 127.0.0.1:9464")
    return value


def _addresses(raw: Any, textual: bool) -> tuple[str, ...]:
    """HOST:PORT list: a TOML array of strings, or text with the addresses separated by commas or spaces."""
    items = raw if isinstance(raw, list) else re.split(r"[\s,]+", _string(raw, textual).strip())
    out = []
    for item in items:
        if not isinstance(item, str):
            raise _Invalid("expected HOST:PORT addresses")
        if item.strip():
            host, _, port = item.strip().rpartition(":")
            if not _HOST.fullmatch(host.strip("[]") or "-") or not port.isdigit() or not 0 < int(port) <= 65535:
                raise _Invalid(f"expected HOST:PORT addresses, e.g. 10.0.0.2:2809,10.0.0.3:2809 (got {item!r})")
            out.append(item.strip())
    return tuple(out)


def _http_url(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Invalid("expected an http:// or https:// URL, e.g. http://127.0.0.1:4318")
    return value


def _file_name(raw: Any, textual: bool) -> str:
    """A path kept as text ("" = unset); relative paths in a file are anchored at the file (``_anchor_path``)."""
    value = _string(raw, textual).strip()
    return str(Path(value).expanduser()) if value else ""
