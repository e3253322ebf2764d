"""Redaction of credentials in DSNs and URLs: nothing secret reaches a log, an error message or a ``repr``."""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_dsn"]

REDACTED = "***"
_URL_START = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
_SECRET_KEYS = ("password", "sslpassword", "passcode")
_SECRET_ALT = "|".join(_SECRET_KEYS)
_KV_SECRET = re.compile(rf"(\b(?:{_SECRET_ALT})\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s]*)", re.IGNORECASE)
_QUERY_SECRET = re.compile(rf"([?&](?:{_SECRET_ALT})=)([^&#]*)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``.

    Handles URLs (``postgresql://user:pw@host/db``, ``stomp://user:pw@host:61613``, ``?password=`` query
    parameters) and libpq ``key=value`` strings (``password=pw``, ``password='p w'``). When in doubt it
    removes more, never less.
    """
    if not dsn:
        return dsn
    if _URL_START.match(dsn):
        return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, _redact_userinfo(dsn))
    return _KV_SECRET.sub(lambda m: m.group(1) + REDACTED, dsn)


def _redact_or_hide(value: str) -> str:
    """Redact a value that should hold credentials; hide it entirely when its shape is not recognisable."""
    if _URL_START.match(value) or re.match(r"^\s*[A-Za-z_]+\s*=", value):
        return redact_dsn(value)
    return f"<{len(value)} characters, not shown>"


def _redact_userinfo(url: str) -> str:
    scheme_end = url.index("://") + 3
    head_end = min(
        (i for i in (url.find("?", scheme_end), url.find("#", scheme_end)) if i >= 0), default=len(url)
    )
    at = url.rfind("@", scheme_end, head_end)
    if at < 0:
        return url
    colon = url.find(":", scheme_end, at)
    if colon < 0:
        return url
    return url[: colon + 1] + REDACTED + url[at:]



def _mask(secret: str) -> str:
    return REDACTED if secret else ""
