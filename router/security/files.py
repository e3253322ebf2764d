"""Files readable by their owner only (credentials, tokens, the node's records): the one writer the credentials
(:mod:`router.security.auth`), the node (:mod:`router.node.lifecycle` re-exports it) and its services use."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 (never readable by others, not even for a moment)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
