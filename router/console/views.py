"""The console's pure parts: list paging/sorting/filtering, the per-bridge rate samples, the operator log's tail.

No I/O except :func:`read_operator_log` (one file read). Everything here is unit-tested without a node.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Page", "RateSampler", "paginate", "read_operator_log"]

MAX_PER_PAGE = 500
#: The busiest bridges the overview's chart draws one line each for (the others are in the "all bridges" line).
CHART_BRIDGES = 10


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    total: int        # rows matching the filter
    page: int         # 1-based
    pages: int
    per_page: int
    sort: str
    desc: bool
    q: str

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "total": self.total, "page": self.page, "pages": self.pages,
                "per_page": self.per_page, "sort": self.sort, "desc": self.desc, "q": self.q}


def _sort_key(value: Any) -> tuple[int, Any]:
    """None last; numbers before text; text case-insensitively."""
    if value is None:
        return (2, 0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value).lower())


def paginate(rows: Sequence[Mapping[str, Any]], *, q: str = "", sort: str = "id", desc: bool = False,
             page: int = 1, per_page: int = 50, fields: Sequence[str] = ()) -> Page:
    """Filter (``q``: every word must occur, case-insensitively, in one of ``fields``), sort by a column the rows
    have (an unknown column sorts by ``id``), and cut one page (clamped into range)."""
    words = [w.lower() for w in q.split()]
    keys = list(fields) or (list(rows[0]) if rows else [])

    def matches(row: Mapping[str, Any]) -> bool:
        text = " ".join(str(row.get(k, "")) for k in keys).lower()
        return all(w in text for w in words)

    chosen = [dict(r) for r in rows if matches(r)]
    if rows and sort not in rows[0]:
        sort = "id"
    chosen.sort(key=lambda r: _sort_key(r.get(sort)), reverse=desc)
    per_page = max(1, min(int(per_page), MAX_PER_PAGE))
    pages = max(1, -(-len(chosen) // per_page))
    page = max(1, min(int(page), pages))
    start = (page - 1) * per_page
    return Page(chosen[start:start + per_page], len(chosen), page, pages, per_page, sort, desc, q)


class RateSampler:
    """Events/s per bridge over the last ``window_s``: samples the node's forwarded and dead-lettered counters
    (from its status snapshot) every ``interval_s`` on a thread of its own; :meth:`series` gives uPlot's columnar
    data."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], *, interval_s: float = 2.0,
                 window_s: float = 600.0) -> None:
        self._read = read
        self.interval_s = interval_s
        # (time, forwarded per bridge, dead-lettered per bridge)
        self._samples: deque[tuple[float, dict[int, int], dict[int, int]]] = deque(
            maxlen=max(2, int(window_s / interval_s) + 1))
        self._lock = threading.Lock()
        self._series: dict[int | None, dict[str, Any]] = {}     # series() per ``busiest``, until the next sample
        self._generation = 0                                     # samples taken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, now: float | None = None) -> None:
        try:
            snap = self._read()
        except (OSError, ValueError):
            return
        counters = {int(b["id"]): int(b.get("forwarded", 0)) for b in snap.get("bridges", [])}
        dead = {int(b["id"]): int(b.get("dead_lettered") or 0) for b in snap.get("bridges", [])}
        with self._lock:
            self._samples.append((time.time() if now is None else now, counters, dead))
            self._series.clear()
            self._generation += 1

    def series(self, busiest: int | None = None) -> dict[str, Any]:
        """``{"t": [unix s...], "bridges": {id: [events/s or None...]}, "total": [events/s of all...],
        "of": bridges sampled}``: one point per pair of samples; ``busiest``: only the bridges that forwarded the
        most over the window (ties: the lower id), so the chart's data stays the same size with 1,000 bridges."""
        with self._lock:
            if busiest in self._series:            # computed once per sample: every open overview asks every 5 s
                return self._series[busiest]
            samples, generation = [(t, c) for t, c, _ in self._samples], self._generation
        ids = sorted({bid for _, c in samples for bid in c})
        t: list[float] = []
        rates: dict[str, list[float | None]] = {str(bid): [] for bid in ids}
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            dt = t1 - t0
            if dt <= 0:
                continue
            t.append(round(t1, 3))
            for bid in ids:
                rates[str(bid)].append(_rate(c0, c1, bid, dt))
        total = [round(sum(r[i] or 0.0 for r in rates.values()), 3) for i in range(len(t))]
        if busiest is not None and len(rates) > busiest:
            ranked = sorted(rates, key=lambda b: (-sum(v or 0.0 for v in rates[b]), int(b)))[:busiest]
            rates = {b: rates[b] for b in sorted(ranked, key=int)}
        result = {"t": t, "bridges": rates, "total": total, "of": len(ids)}
        with self._lock:
            if generation == self._generation:
                self._series[busiest] = result
        return result

    def series_of(self, bid: int) -> dict[str, Any]:
        """One bridge's events/s forwarded, in :meth:`series`'s form, and its dead letters/s (``dead_lettered``): a
        bridge's page (its chart costs the samples, not the number of bridges); no line when the bridge was in no
        sample."""
        with self._lock:
            samples = list(self._samples)
        t: list[float] = []
        forwarded: list[float | None] = []
        dead: list[float | None] = []
        for (t0, c0, d0), (t1, c1, d1) in itertools.pairwise(samples):
            if t1 - t0 > 0:
                t.append(round(t1, 3))
                forwarded.append(_rate(c0, c1, bid, t1 - t0))
                dead.append(_rate(d0, d1, bid, t1 - t0))
        seen = any(bid in c for _, c, _ in samples)
        return {"t": t, "bridges": {str(bid): forwarded} if seen else {}, "dead_lettered": dead if seen else [],
                "total": [], "of": 1 if seen else 0}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="console-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self.sample()
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _rate(c0: Mapping[int, int], c1: Mapping[int, int], bid: int, dt: float) -> float | None:
    """A bridge's events/s between two samples; None where it is missing from one or its counter went back (the
    node restarted)."""
    if bid in c0 and bid in c1 and c1[bid] >= c0[bid]:
        return round((c1[bid] - c0[bid]) / dt, 3)
    return None


def read_operator_log(path: Path, limit: int = 200) -> list[dict[str, Any]]:
    """The last ``limit`` entries of the operator log (one JSON object a line), newest first."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
        if len(entries) >= limit:
            break
    return entries
