"""The audit reports the console lists and serves, and the audit runs it starts (docs/console.md, "Audit reports").

* **Reports**: each directory directly under the reports directory (``[console] audit_reports``, default
  ``<state-dir>/audit``) that holds a ``report.html`` is a report (what ``nsjms audit --out DIR`` writes: the HTML
  with its plots embedded, ``plots/*.png``, ``summary.json``). A file is served only when it appears in the listing
  of that directory (regular files, no symbolic links, inside the directory once resolved): a request names a
  report and a file of its listing, never a path of the machine.
* **Runs**: ``nsjms audit --out <reports>/<run>`` started as a subprocess (the node never imports pyspark: the
  import-linter contract and tests/unit/test_audit_units.py check it), its output in ``<reports>/<run>.log``, its
  exit status in ``<run>.exit`` once it ends. One run at a time; refused when pyspark (the ``audit`` extra) is not
  installed.
* **Window**: a run may be given ``--from`` / ``--to`` (:func:`parse_window`: ISO 8601 dates or date-times, UTC
  without a zone, ``from`` before ``to``), parsed here and passed to the command as separate arguments of its argv
  in the parsed value's own ISO form (never a shell, never the text typed); the window asked for is kept beside
  the run's log (``<run>.window.json``) and, once written, the report's ``summary.json`` says which window it
  audited: a run's page and the list show that one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["AuditRefused", "AuditRuns", "AuditWindow", "WindowRefused", "nsjms_audit_command", "parse_window",
           "spark_installed"]

LOG_TAIL = 40          # lines of a run's log the progress page shows
MAX_TIME_TEXT = 40     # an ISO 8601 date-time with an offset and microseconds is 32 characters


class AuditRefused(Exception):
    """An audit run cannot start (one is running, pyspark is missing, the directory is not writable): 409."""


class WindowRefused(AuditRefused):
    """The window asked for is not one (a bound that is no ISO 8601 date or date-time, ``from`` not before
    ``to``): the request's fault, 400, nothing started."""


@dataclass(frozen=True)
class AuditWindow:
    """``nsjms audit --from START --to END`` (either open): ``accepted_at >= start`` and ``< end``, in UTC."""

    start: datetime | None = None
    end: datetime | None = None

    def argv(self) -> list[str]:
        """The options for the command's argv: the parsed values' ISO form, never the text that was typed."""
        out: list[str] = []
        if self.start is not None:
            out += ["--from", self.start.isoformat()]
        if self.end is not None:
            out += ["--to", self.end.isoformat()]
        return out

    def as_dict(self) -> dict[str, str | None]:
        return {"from": None if self.start is None else self.start.isoformat(),
                "to": None if self.end is None else self.end.isoformat()}


def _parse_time(text: str, what: str) -> datetime | None:
    """An ISO 8601 date or date-time (``nsjms audit``'s own rule: without a zone it is UTC), as UTC; None when
    empty."""
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_TIME_TEXT:
        raise WindowRefused(f"{what}: not an ISO 8601 date or date-time (longer than {MAX_TIME_TEXT} characters)")
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise WindowRefused(f"{what}: not an ISO 8601 date or date-time: {text!r} (e.g. 2026-02-01 or "
                            "2026-02-01T12:00:00Z)") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_window(start: str = "", end: str = "") -> AuditWindow:
    """The window of an audit run from the text of its two fields (empty: open on that side); WindowRefused
    naming the field when a bound is no date or the window is empty or reversed."""
    window = AuditWindow(_parse_time(start, "from"), _parse_time(end, "to"))
    if window.start is not None and window.end is not None and window.start >= window.end:
        raise WindowRefused(f"from {window.start.isoformat()} is not before to {window.end.isoformat()}: the "
                            "window would be empty")
    return window


def spark_installed() -> bool:
    """Whether the ``audit`` extra's pyspark is importable, without importing it."""
    return importlib.util.find_spec("pyspark") is not None


def nsjms_audit_command(state_dir: Path) -> Callable[[Path], list[str]]:
    """``nsjms audit --out OUT`` for the node's state directory (its DSN comes from the environment)."""
    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "router.cli", "--state-dir", str(state_dir), "audit", "--out", str(out)]
    return command


class AuditRuns:
    """The reports under ``directory`` and the one audit run the console may have going."""

    def __init__(self, directory: Path, command: Callable[[Path], Sequence[str]], *,
                 env: dict[str, str] | None = None, spark: Callable[[], bool] = spark_installed,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory, self.command, self.env, self.spark, self.clock = directory, command, env, spark, clock
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._run = ""

    # ------------------------------------------------------------------------------------------- reports
    def _children(self) -> dict[str, Path]:
        if not self.directory.is_dir():
            return {}
        return {p.name: p for p in self.directory.iterdir() if not p.is_symlink()}

    def reports(self) -> list[dict[str, Any]]:
        """Every report (newest first) and every run the console started (their logs), by name."""
        children = self._children()
        names = {n for n, p in children.items() if p.is_dir() and (p / "report.html").is_file()}
        names |= {n[:-4] for n, p in children.items() if n.endswith(".log") and p.is_file()}
        rows = [self.status(n) for n in names]
        return sorted(rows, key=lambda r: (r["time"], r["name"]), reverse=True)

    def files(self, name: str) -> dict[str, Path]:
        """The files of report ``name`` by their path inside it (only those of the listing; empty when unknown)."""
        base = self._children().get(name)
        if base is None or not base.is_dir():
            return {}
        root = base.resolve()
        out: dict[str, Path] = {}
        for path in sorted(base.rglob("*")):
            if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root):
                continue
            out[path.relative_to(base).as_posix()] = path
        return out

    # ---------------------------------------------------------------------------------------------- runs
    def _poll(self) -> None:
        """Record the exit status of the console's run once it has ended (called under the lock)."""
        if self._proc is not None and self._proc.poll() is not None:
            (self.directory / f"{self._run}.exit").write_text(f"{self._proc.returncode}\n")
            self._proc = None

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the console's run (if any) has ended and record its exit status (a test's teardown; a node's
        stop leaves a run going: it runs in a session of its own and writes its report and exit file anyway)."""
        with self._lock:
            proc = self._proc
        if proc is not None:
            proc.wait(timeout)
        with self._lock:
            self._poll()

    def running(self) -> str:
        with self._lock:
            self._poll()
            return self._run if self._proc is not None else ""

    def start(self, window: AuditWindow | None = None) -> str:
        """Start ``nsjms audit [--from ...] [--to ...]`` into a new report directory; returns the run's name or
        raises AuditRefused."""
        window = window or AuditWindow()
        if not self.spark():
            raise AuditRefused("the audit extra is not installed (pyspark): install nsjms[audit] on this node "
                               "to run `nsjms audit` (docs/audit.md)")
        with self._lock:
            self._poll()
            if self._proc is not None:
                raise AuditRefused(f"an audit run is already going ({self._run}): one run at a time")
            name = time.strftime("run-%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                if (self.directory / f"{name}.log").exists() or (self.directory / name).exists():
                    raise AuditRefused(f"a run named {name} exists already: start again in a second")
                (self.directory / f"{name}.window.json").write_text(json.dumps(window.as_dict()) + "\n")
                with open(self.directory / f"{name}.log", "xb") as log:
                    env = {**os.environ, **(self.env or {})}
                    argv = [*self.command(self.directory / name), *window.argv()]
                    self._proc = subprocess.Popen(argv, stdout=log,
                                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                                  start_new_session=True)
            except OSError as exc:
                raise AuditRefused(f"cannot start the audit in {self.directory}: {exc.strerror or exc}") from exc
            self._run = name
            return name

    def status(self, name: str) -> dict[str, Any]:
        """A run's or a report's state (running / done / failed / unknown), exit status, log tail, report."""
        with self._lock:
            self._poll()
            current = self._proc is not None and name == self._run
        children = self._children()     # after the poll: an exit status it just recorded is seen
        log, exit_file, report = children.get(f"{name}.log"), children.get(f"{name}.exit"), children.get(name)
        code: int | None = None
        if exit_file is not None and exit_file.is_file():
            text = exit_file.read_text().strip()
            code = int(text) if text.lstrip("-").isdigit() else None
        has_report = report is not None and report.is_dir() and (report / "report.html").is_file()
        if current:
            state = "running"
        elif code is not None:
            state = "done" if code == 0 else ("violation" if code == 7 else "failed")
        elif log is not None:
            state = "unknown"       # started by a node that stopped before it ended
        else:
            state = "done"          # a report written by `nsjms audit --out` by hand
        stamp = next((p.stat().st_mtime for p in (report, log) if p is not None and p.exists()), 0.0)
        tail: list[str] = []
        if log is not None and log.is_file():
            tail = log.read_bytes()[-16384:].decode("utf-8", "replace").replace("\r", "\n").splitlines()[-LOG_TAIL:]
        return {"name": name, "state": state, "exit": code, "report": has_report, "time": stamp,
                "log": tail, "has_log": log is not None,
                **_window(report if has_report else None, children.get(f"{name}.window.json"))}


def _window(report: Path | None, asked: Path | None) -> dict[str, Any]:
    """``window`` ({"from", "to"}: ISO text or None for an open side) and ``window_of``: "report" (what its
    summary.json says it audited), "requested" (what the run was started with; no report yet), or None (unknown)."""
    for path, of in ((report / "summary.json" if report is not None else None, "report"), (asked, "requested")):
        if path is None or not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        window = data.get("window") if of == "report" and isinstance(data, dict) else data
        if isinstance(window, dict):
            return {"window": {k: None if window.get(k) is None else str(window[k]) for k in ("from", "to")},
                    "window_of": of}
    return {"window": None, "window_of": None}
