"""nsjms delivery ledger and its audit.

* :mod:`audit.ledger` — the ledger's schema (:mod:`router.routing.ledger`, migration ``0003_ledger.sql``), day
  partitions, retention;
* :mod:`audit.synth` — a deterministic synthetic ledger with injected faults (benchmarks, tests, demos);
* :mod:`audit.export` — ledger rows → Parquet by day (pyarrow);
* :mod:`audit.transforms` — the audit as pure PySpark DataFrame → DataFrame transforms;
* :mod:`audit.job` / :mod:`audit.report` — the ``nsjms audit`` job and its JSON/HTML output;
* :mod:`audit.cli` — ``nsjms ledger …`` and ``nsjms audit``.

pyspark, pyarrow, matplotlib and tqdm come with the ``audit`` extra; importing this package (or
:mod:`audit.ledger`, :mod:`audit.cli`) imports none of them.

Exceptions::

    AuditError
     ├── UsageError      the caller asked for something impossible (bad window, missing extra, bad option)
     └── LedgerError     PostgreSQL failed while reading or maintaining the ledger (carries the operation)
"""

from __future__ import annotations

__all__ = ["AuditError", "LedgerError", "UsageError"]


class AuditError(Exception):
    """Base of the audit package's errors."""


class UsageError(AuditError):
    """A bad request by the caller; the message names the option or value."""


class LedgerError(AuditError):
    """The database failed during ``operation``; the message says how."""

    def __init__(self, operation: str, message: str) -> None:
        super().__init__(f"{operation}: {message}")
        self.operation = operation

    def __reduce__(self) -> tuple[type[LedgerError], tuple[str, str]]:
        return (type(self), (self.operation, str(self).split(": ", 1)[1]))
