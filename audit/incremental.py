"""``nsjms audit --incremental``: continuous reconciliation of the ledger by UTC day, in PostgreSQL.

Each run (docs/audit.md, "Incremental audit"):

1. one query computes every day's **fingerprint** (:data:`FINGERPRINT_SQL`): rows, ``max(entry_id)``, the count of
   each nullable column and the sums of the hop times (exact ``numeric`` sums). A late row changes the count and
   ``max(entry_id)``; a column filled in later (the T2 hop times written at the outbox purge, a ``COALESCE`` update)
   changes a count, a changed time a sum;
2. a day is **due** (:func:`due`) when it has no verdict in ``nsjms_audit_day``, its fingerprint or the grace
   differs from the stored one, or its ``recheck_at`` has passed: the earliest time one of its obligations that was
   open at the audit (in flight within the grace, or in doubt) can change status with no row written. An
   obligation's rows all carry its ``accepted_at``, so its delivery lands in its own day however late it comes: an
   obligation accepted at 23:59:59 and delivered after midnight is *open* in its day's verdict until then (or lost
   once its grace has passed), never a loss at the day boundary;
3. each due day is reconciled by one aggregate over its partition (:data:`DAY_SQL`), with the status rules of
   :mod:`audit.transforms` (delivered, duplicated, resent, dead_letter, discarded, expired, in_doubt, lost,
   in_flight); an in-doubt row's gtrid is looked up in the whole ledger (a transaction may resolve on another
   day's rows);
4. the day's verdict (``fail``: lost or duplicated; ``open``: in flight or in doubt; else ``pass``) and its figures
   per (direction, bridge, node, status) are upserted in the same transaction, under an advisory lock (two
   scheduled runs never interleave).

The **node** of an obligation is the node of its ``accepted`` row, else the first node any of its rows names (in
string order), else ``-``; a row names the node in its ``node_id`` (the writer, migration 0009), or, on a row from
before that column, the node of its gtrid (``node:token``, a T2's rows). ``multi_node`` counts the obligations whose
rows' ``node_id`` name more than one node. The same rules as :func:`audit.transforms.obligations`.

Decisions are pure functions (:func:`due`, :func:`verdict`, :func:`recheck_at`, :func:`metrics_text`); the SQL
runs in :func:`run_incremental`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from audit import LedgerError, changes
from audit.ledger import DEFAULT_PARTITION, list_partitions

__all__ = ["DAY_TABLE", "DayResult", "Fingerprint", "Group", "IncrementalResult", "StoredDay", "due", "metrics_text",
           "recheck_at", "run_incremental", "stored_verdicts", "verdict", "write_metrics"]

DAY_TABLE = "nsjms_audit_day"
ADVISORY_LOCK = 7715028          # pg_advisory_xact_lock key of an incremental run
LIST_LIMIT = 100                 # lost / duplicated ids kept per day
OPEN = ("in_flight", "in_doubt")
_NULLABLE = ("event_id", "jms_message_id", "proxy_id", "bridge_id", "destination", "gtrid", "dispatched_at",
             "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at", "failure_reason", "node_id")
_SUMMED = ("dispatched_at", "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at")

FINGERPRINT_SQL = (
    "SELECT (accepted_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n, max(entry_id) AS max_id, "
    + ", ".join(f"count({c})" for c in _NULLABLE) + ", "
    + ", ".join(f"sum(extract(epoch FROM {c}))" for c in _SUMMED)
    + " FROM nsjms_ledger WHERE accepted_at >= %(lo)s AND accepted_at < %(hi)s GROUP BY 1 ORDER BY 1")

#: One day's in-doubt gtrids (its partition only).
DOUBTS_SQL = """
SELECT DISTINCT gtrid FROM nsjms_ledger
WHERE accepted_at >= %(lo)s AND accepted_at < %(hi)s AND outcome = 'in_doubt' AND gtrid IS NOT NULL"""

#: Those of them that a row of the whole ledger resolves (index nsjms_ledger_gtrid); only run when the day has some.
RESOLVED_SQL = """
SELECT DISTINCT gtrid FROM nsjms_ledger
WHERE gtrid = ANY(%(gtrids)s::text[])
  AND outcome IN ('delivered', 'rolled_back', 'dead_letter', 'discarded', 'expired')"""

#: One day reconciled: per obligation, then per (direction, bridge_id, node, status).
DAY_SQL = """
WITH per AS (
    SELECT dedupe_id, min(direction) AS direction, min(bridge_id) AS bridge_id,
           coalesce(min(coalesce(node_id, CASE WHEN gtrid LIKE '%%:%%' THEN split_part(gtrid, ':', 1) END))
                        FILTER (WHERE outcome = 'accepted'),
                    min(coalesce(node_id, CASE WHEN gtrid LIKE '%%:%%' THEN split_part(gtrid, ':', 1) END)),
                    '-') AS node,
           coalesce(min(node_id) <> max(node_id), false) AS multi_node,
           min(accepted_at) AS accepted_at,
           count(*) FILTER (WHERE outcome = 'delivered') AS deliveries,
           min(gtrid) FILTER (WHERE outcome = 'delivered') AS g_min,
           max(gtrid) FILTER (WHERE outcome = 'delivered') AS g_max,
           min(jms_message_id) FILTER (WHERE outcome = 'delivered') AS m_min,
           max(jms_message_id) FILTER (WHERE outcome = 'delivered') AS m_max,
           count(*) FILTER (WHERE outcome = 'delivered' AND gtrid LIKE '%%:%%'
                            AND node_id = split_part(gtrid, ':', 1)) AS by_owner,
           count(*) FILTER (WHERE outcome = 'delivered' AND gtrid LIKE '%%:%%'
                            AND node_id <> split_part(gtrid, ':', 1)) AS by_other,
           count(*) FILTER (WHERE outcome = 'dead_letter') AS dead_letter,
           count(*) FILTER (WHERE outcome = 'discarded') AS discarded,
           count(*) FILTER (WHERE outcome = 'expired') AS expired,
           count(*) FILTER (WHERE outcome = 'in_doubt' AND gtrid = ANY(%(open)s::text[])) AS open_doubts,
           min(prepared_at) FILTER (WHERE outcome = 'in_doubt' AND gtrid = ANY(%(open)s::text[])) AS prepared_at
    FROM nsjms_ledger WHERE accepted_at >= %(lo)s AND accepted_at < %(hi)s
    GROUP BY dedupe_id
), judged AS (
    SELECT *, CASE WHEN deliveries = 2 AND direction = 'channel_to_jms' AND g_min LIKE '%%:%%' AND g_min = g_max
                        AND m_min = m_max AND by_owner = 1 AND by_other = 1 THEN 'resent'
                   WHEN deliveries > 1 THEN 'duplicated' WHEN deliveries = 1 THEN 'delivered'
                   WHEN dead_letter > 0 THEN 'dead_letter' WHEN discarded > 0 THEN 'discarded'
                   WHEN expired > 0 THEN 'expired' WHEN open_doubts > 0 THEN 'in_doubt'
                   WHEN accepted_at <= %(cutoff)s THEN 'lost' ELSE 'in_flight' END AS status
    FROM per
)
SELECT direction, bridge_id, node, status, count(*) AS obligations, min(accepted_at) AS oldest,
       min(prepared_at) AS oldest_prepared,
       (array_agg(dedupe_id ORDER BY accepted_at, dedupe_id)
            FILTER (WHERE status IN ('lost', 'duplicated', 'resent')))[1:%(limit)s] AS ids,
       count(*) FILTER (WHERE multi_node) AS multi_node
FROM judged GROUP BY direction, bridge_id, node, status
ORDER BY direction, bridge_id NULLS FIRST, node, status"""


@dataclass(frozen=True)
class Fingerprint:
    day: date
    text: str
    rows: int


@dataclass(frozen=True)
class Group:
    """The obligations of one day with one (direction, bridge, node, status)."""

    direction: str
    bridge_id: int | None
    node: str
    status: str
    obligations: int
    oldest: datetime | None             # the earliest accepted_at among them
    oldest_prepared: datetime | None    # in doubt: the earliest prepared_at
    ids: tuple[str, ...] = ()           # lost / duplicated / resent: up to LIST_LIMIT dedupe ids
    multi_node: int = 0                 # how many of them have rows written by more than one node

    def as_dict(self) -> dict[str, Any]:
        return {"direction": self.direction, "bridge_id": self.bridge_id, "node": self.node, "status": self.status,
                "obligations": self.obligations, "oldest": _iso(self.oldest),
                "oldest_prepared": _iso(self.oldest_prepared), "ids": list(self.ids), "multi_node": self.multi_node}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Group:
        return Group(d["direction"], d["bridge_id"], d["node"], d["status"], int(d["obligations"]),
                     _time(d.get("oldest")), _time(d.get("oldest_prepared")), tuple(d.get("ids") or ()),
                     int(d.get("multi_node") or 0))


@dataclass(frozen=True)
class DayResult:
    day: date
    verdict: str
    groups: tuple[Group, ...]
    audited: bool                       # reconciled by this run (False: the stored verdict still holds)
    rows: int = 0
    recheck_at: datetime | None = None

    def count(self, *statuses: str) -> int:
        return sum(g.obligations for g in self.groups if g.status in statuses)


@dataclass(frozen=True)
class IncrementalResult:
    as_of: datetime
    days: tuple[DayResult, ...] = field(default_factory=tuple)

    @property
    def audited(self) -> tuple[DayResult, ...]:
        return tuple(d for d in self.days if d.audited)

    def count(self, *statuses: str) -> int:
        return sum(d.count(*statuses) for d in self.days)


# ------------------------------------------------------------------------------------------------ decisions
def verdict(groups: Iterable[Group]) -> str:
    """``fail`` when anything is lost or duplicated, else ``open`` while anything is in flight or in doubt, else
    ``pass``."""
    statuses = {g.status for g in groups if g.obligations}
    if statuses & {"lost", "duplicated"}:
        return "fail"
    return "open" if statuses & set(OPEN) else "pass"


def recheck_at(groups: Iterable[Group], grace: timedelta) -> datetime | None:
    """When the day must be reconciled again even if none of its rows changes (None: nothing open): the earliest
    time an in-flight obligation turns lost (accepted ``grace`` ago); with an obligation in doubt, at once (the
    oldest in-doubt ``accepted_at``, already past): its transaction may resolve on another day's rows, which do not
    change this day's fingerprint, so the day is reconciled on every run while it holds a doubt."""
    times = [g.oldest + grace for g in groups if g.status == "in_flight" and g.oldest is not None]
    times += [g.oldest for g in groups if g.status == "in_doubt" and g.oldest is not None]
    return min(times) if times else None


def due(fingerprint: str, grace_s: float, as_of: datetime, stored: Mapping[str, Any] | None) -> bool:
    """Whether a day is reconciled by this run (``stored``: its row of ``nsjms_audit_day``, None if never)."""
    if stored is None or stored["fingerprint"] != fingerprint or float(stored["grace_s"]) != grace_s:
        return True
    return stored["recheck_at"] is not None and stored["recheck_at"] <= as_of


# ------------------------------------------------------------------------------------------------------ run
def run_incremental(dsn: str, *, as_of: datetime, grace: timedelta, start: datetime | None = None,
                    end: datetime | None = None) -> IncrementalResult:
    """Reconcile the due days of ``[start, end)`` (default: every day of the ledger); return every day in scope with
    its verdict (the stored one for the days not due). The window is whole UTC days (``start`` rounded down to its
    day, ``end`` up to the next midnight): a day is always reconciled and fingerprinted whole. Days whose rows are
    gone (dropped by retention) lose their stored verdict when they are in scope.

    Which days changed comes from the ledger's change markers (:mod:`audit.changes`): a run where nothing changed
    reads no partition of the ledger, a late row or a filled-in column makes only its day due. The first run after
    the tracking was installed (and a run without it) fingerprints every day of its window instead."""
    lo = _day_start((start or datetime(1, 1, 2, tzinfo=UTC)).astimezone(UTC).date())
    hi = end or datetime(9999, 12, 30, tzinfo=UTC)
    if hi != _day_start(hi.astimezone(UTC).date()):
        hi = _day_start(hi.astimezone(UTC).date()) + timedelta(days=1)
    lo_day, hi_day = lo.astimezone(UTC).date(), hi.astimezone(UTC).date()
    grace_s = grace.total_seconds()
    days: list[DayResult] = []
    try:
        with psycopg.connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
            tracked = changes.ensure(conn)
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
            changed, full = (changes.take(conn, lo_day, hi_day, whole=start is None and end is None)
                             if tracked else (set(), True))
            cur.execute(f"SELECT * FROM {DAY_TABLE} WHERE day >= %s AND day < %s", (lo_day, hi_day))
            stored = {r["day"]: r for r in cur.fetchall()}
            if full:
                prints = [_fingerprint(r) for r in conn.execute(FINGERPRINT_SQL, {"lo": lo, "hi": hi}).fetchall()]
                for fp in prints:
                    old = stored.pop(fp.day, None)
                    if due(fp.text, grace_s, as_of, old):
                        days.append(_audit_day(conn, fp, as_of, grace))
                    else:
                        assert old is not None
                        days.append(_kept(old, fp.rows))
                gone = list(stored)             # days of the window without rows
            else:
                gone = []
                partitions = set(list_partitions(conn))
                for d in sorted(set(stored) | changed):
                    old = stored.get(d)
                    if old is None or d in changed or due(old["fingerprint"], grace_s, as_of, old):
                        day_fp = _day_fingerprint(conn, d)
                        if day_fp is None:
                            gone.append(d)
                        else:
                            days.append(_audit_day(conn, day_fp, as_of, grace))
                    elif d not in partitions and not _in_default(conn, d):
                        gone.append(d)          # its partition dropped (retention)
                    else:
                        days.append(_kept(old, int(old["figures"].get("rows", 0))))
            if gone:
                conn.execute(f"DELETE FROM {DAY_TABLE} WHERE day = ANY(%s)", (gone,))
    except psycopg.Error as exc:
        raise LedgerError("incremental audit", f"{type(exc).__name__}: {exc}") from exc
    return IncrementalResult(as_of, tuple(days))


def _kept(old: Mapping[str, Any], rows: int) -> DayResult:
    groups = tuple(Group.from_dict(g) for g in old["figures"]["groups"])
    return DayResult(old["day"], old["verdict"], groups, False, rows, old["recheck_at"])


def _day_fingerprint(conn: psycopg.Connection[Any], day: date) -> Fingerprint | None:
    """One day's fingerprint (its partition only), None when the day has no rows."""
    lo = _day_start(day)
    row = conn.execute(FINGERPRINT_SQL, {"lo": lo, "hi": lo + timedelta(days=1)}).fetchone()
    return None if row is None else _fingerprint(row)


def _in_default(conn: psycopg.Connection[Any], day: date) -> bool:
    """Whether the default partition holds rows of ``day`` (a day without a partition of its own)."""
    lo = _day_start(day)
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE accepted_at >= %s AND accepted_at < %s)")
                       .format(sql.Identifier(DEFAULT_PARTITION)), (lo, lo + timedelta(days=1))).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class StoredDay:
    """A day's verdict as the last incremental run that reconciled it stored it."""

    result: DayResult                   # ``audited`` is False: read back, not reconciled now
    as_of: datetime
    audited_at: datetime
    grace_s: float


def stored_verdicts(dsn: str, limit: int = 31, connect_timeout: int = 5) -> tuple[StoredDay, ...]:
    """The stored verdicts of the latest ``limit`` days, newest first: what ``nsjms audit --incremental`` wrote, read
    in a read-only transaction without its advisory lock (a run in progress is seen once it commits)."""
    try:
        with psycopg.connect(dsn, connect_timeout=connect_timeout) as conn:
            conn.read_only = True
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(f"SELECT day, verdict, recheck_at, figures, grace_s, as_of, audited_at FROM {DAY_TABLE} "
                            "ORDER BY day DESC LIMIT %s", (max(1, limit),))
                rows = cur.fetchall()
    except psycopg.Error as exc:
        raise LedgerError("incremental audit verdicts", f"{type(exc).__name__}: {exc}") from exc
    return tuple(StoredDay(DayResult(r["day"], r["verdict"], tuple(Group.from_dict(g) for g in r["figures"]["groups"]),
                                     False, int(r["figures"].get("rows", 0)), r["recheck_at"]),
                           r["as_of"], r["audited_at"], float(r["grace_s"])) for r in rows)


def _fingerprint(row: Sequence[Any]) -> Fingerprint:
    text = "|".join("" if v is None else str(v) for v in row[1:])
    return Fingerprint(row[0], text, int(row[1]))


def _day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _audit_day(conn: psycopg.Connection[Any], fp: Fingerprint, as_of: datetime, grace: timedelta) -> DayResult:
    lo = _day_start(fp.day)
    window = {"lo": lo, "hi": lo + timedelta(days=1)}
    doubts = [r[0] for r in conn.execute(DOUBTS_SQL, window).fetchall()]
    resolved = {r[0] for r in conn.execute(RESOLVED_SQL, {"gtrids": doubts}).fetchall()} if doubts else set()
    open_ = [g for g in doubts if g not in resolved]
    rows = conn.execute(DAY_SQL, {**window, "open": open_, "cutoff": as_of - grace, "limit": LIST_LIMIT}).fetchall()
    groups = tuple(Group(r[0], r[1], r[2], r[3], int(r[4]), r[5], r[6], tuple(r[7] or ()), int(r[8])) for r in rows)
    result = DayResult(fp.day, verdict(groups), groups, True, fp.rows, recheck_at(groups, grace))
    figures = {"rows": fp.rows, "groups": [g.as_dict() for g in groups]}
    conn.execute(
        f"""INSERT INTO {DAY_TABLE} (day, fingerprint, grace_s, as_of, verdict, recheck_at, figures)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (day) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, grace_s = EXCLUDED.grace_s,
              as_of = EXCLUDED.as_of, audited_at = clock_timestamp(), verdict = EXCLUDED.verdict,
              recheck_at = EXCLUDED.recheck_at, figures = EXCLUDED.figures""",
        (fp.day, fp.text, grace.total_seconds(), as_of, result.verdict, result.recheck_at, json.dumps(figures)))
    return result


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat()


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


# -------------------------------------------------------------------------------------------------- metrics
_METRICS = (
    ("lost", ("lost",), "obligations lost (accepted longer than the grace ago, no terminal row, not in doubt)"),
    ("duplicated", ("duplicated",), "obligations delivered more than once"),
    ("in_doubt", ("in_doubt",), "obligations whose routing transaction is in doubt"),
    ("in_flight", ("in_flight",), "obligations accepted within the grace and not yet delivered"),
    ("resent", ("resent",), "obligations re-sent at a takeover (allowed: one nsjms_dedupe_id, two nodes)"),
    ("delivered", ("delivered", "duplicated", "resent"), "obligations delivered"),
    ("dead_letter", ("dead_letter",), "obligations dead-lettered"),
)


def _labels(direction: str, bridge: int | None, node: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'direction="{esc(direction)}",bridge="{"" if bridge is None else bridge}",node="{esc(node)}"'


def metrics_text(result: IncrementalResult) -> str:
    """The per-bridge results in Prometheus' text exposition format (node_exporter's textfile collector): per
    (direction, bridge, node) the obligations lost, duplicated, in doubt, in flight, delivered and dead-lettered
    over every day in scope, the age of the oldest open obligation (0 when none), and the run's time and days."""
    keys = sorted({(g.direction, g.bridge_id, g.node) for d in result.days for g in d.groups},
                  key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2]))
    out: list[str] = []
    for name, statuses, text in _METRICS:
        out += [f"# HELP nsjms_audit_{name}_obligations {text}", f"# TYPE nsjms_audit_{name}_obligations gauge"]
        for k in keys:
            n = sum(g.obligations for d in result.days for g in d.groups
                    if (g.direction, g.bridge_id, g.node) == k and g.status in statuses)
            out.append(f"nsjms_audit_{name}_obligations{{{_labels(*k)}}} {n}")
    out += ["# HELP nsjms_audit_oldest_open_seconds age of the oldest obligation in flight or in doubt (0: none)",
            "# TYPE nsjms_audit_oldest_open_seconds gauge"]
    for k in keys:
        oldest = [g.oldest for d in result.days for g in d.groups
                  if (g.direction, g.bridge_id, g.node) == k and g.status in OPEN and g.oldest is not None]
        age = max(0.0, (result.as_of - min(oldest)).total_seconds()) if oldest else 0.0
        out.append(f"nsjms_audit_oldest_open_seconds{{{_labels(*k)}}} {age:.3f}")
    failing = sum(1 for d in result.days if d.verdict == "fail")
    out += ["# HELP nsjms_audit_days days of the ledger in scope, by verdict", "# TYPE nsjms_audit_days gauge",
            *[f'nsjms_audit_days{{verdict="{v}"}} {sum(1 for d in result.days if d.verdict == v)}'
              for v in ("pass", "open", "fail")],
            "# HELP nsjms_audit_days_reconciled days reconciled by the last run (the others had not changed)",
            "# TYPE nsjms_audit_days_reconciled gauge", f"nsjms_audit_days_reconciled {len(result.audited)}",
            "# HELP nsjms_audit_last_run_timestamp_seconds when the last incremental audit ran (its as-of time)",
            "# TYPE nsjms_audit_last_run_timestamp_seconds gauge",
            f"nsjms_audit_last_run_timestamp_seconds {result.as_of.timestamp():.3f}",
            "# HELP nsjms_audit_failing_days days with a lost or duplicated obligation",
            "# TYPE nsjms_audit_failing_days gauge", f"nsjms_audit_failing_days {failing}"]
    return "\n".join(out) + "\n"


def write_metrics(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in the same directory, renamed over it), readable by
    node_exporter (mode 0644): the collector never reads half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
