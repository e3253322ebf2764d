"""CPU per event of the bench's own processes (issue 27: the meter first).

Round 8's meter charged every ``java`` and ``postgres`` process on the machine to the bench's broker and
PostgreSQL: another broker or cluster running beside the bench (a test run, a second bench) was counted, and the
broker's JIT compilation, which lands in the first windows after its start, was mixed with its per-message work.
This meter is scoped to process trees:

* each role (``node``, ``broker``, ``postgres``) is the process tree under a pid the bench started or was given
  (:attr:`CpuMeter.roots`: the node subprocess, the embedded broker's process, the postmaster); ``bench`` is this
  process's own tree less those trees (its client threads and client subprocesses);
* a process's CPU is ``utime + stime + cutime + cstime`` from ``/proc/PID/stat``: a child reaped inside a window
  (a PostgreSQL backend that ends) moves its CPU to its parent's ``c*time``, so a tree's sum stays exact; a process
  that leaves the tree (re-parented to init) takes its CPU with it;
* the broker's CPU is also split by thread name (``/proc/PID/task/TID/stat``, HotSpot names its threads):
  ``broker_jit`` (``C1 CompilerThre``/``C2 CompilerThre``), ``broker_gc`` (``GC Thread#``, ``G1 ...``, ``VM
  Thread``: the safepoint operations, collections among them). A compiler thread that exits inside a window takes
  its share out of the split (HotSpot starts and stops them dynamically): it stays in the broker's total and counts
  as the broker's other work. ``broker_work`` is the broker's total less JIT and GC.

With no root for a role (external services, ``NSJMS_BENCH_*``), the role reads ``None``: not seen, never zero.
Nothing here decides anything from timing; the figures are reported beside units measured in the same run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuMeter", "ProcStat", "jvm_thread_class", "read_proc", "tree_cpu"]

ROLES = ("node", "broker", "postgres", "bench")
JVM_SPLIT = ("broker_jit", "broker_gc")


@dataclass(frozen=True)
class ProcStat:
    """One process as the meter needs it: its parent and its CPU ticks (own and reaped children's)."""

    pid: int
    ppid: int
    ticks: int


def parse_stat(text: str) -> tuple[str, int, int, int]:
    """(comm, ppid, utime + stime, cutime + cstime) in ticks, of a ``/proc/.../stat`` line. ``comm`` may hold
    spaces and parentheses (a thread named ``G1 Conc#0``): the fields after it start after the LAST ``)``. In a
    thread's ``task/TID/stat`` the children's times are the whole process's: use only the first sum there."""
    head, _, rest = text.rpartition(")")
    comm = head.split("(", 1)[1] if "(" in head else ""
    fields = rest.split()
    # fields[0] is the state (field 3); ppid is field 4; utime, stime, cutime, cstime are fields 14..17
    return comm, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def read_proc(proc: Path = Path("/proc")) -> dict[int, ProcStat]:
    """Every process's :class:`ProcStat`; processes that end while being read are skipped."""
    out: dict[int, ProcStat] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            _, ppid, own, children = parse_stat((proc / entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = ProcStat(int(entry), ppid, own + children)
    return out


def _children(procs: Mapping[int, ProcStat]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def tree(root: int, procs: Mapping[int, ProcStat], exclude: Iterable[int] = ()) -> set[int]:
    """``root`` and its live descendants, without the subtrees under ``exclude``."""
    kids, cut = _children(procs), set(exclude)
    out: set[int] = set()
    stack = [root] if root in procs and root not in cut else []
    while stack:
        pid = stack.pop()
        out.add(pid)
        stack.extend(k for k in kids.get(pid, ()) if k not in cut and k not in out)
    return out


def tree_cpu(pids: Iterable[int], procs: Mapping[int, ProcStat]) -> int:
    return sum(procs[p].ticks for p in pids if p in procs)


def jvm_thread_class(comm: str) -> str | None:
    """``broker_jit``, ``broker_gc`` or None (the broker's other work) for a HotSpot thread name (15 characters at
    most in ``comm``)."""
    if comm.startswith(("C1 CompilerThre", "C2 CompilerThre")):
        return "broker_jit"
    if comm.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "broker_gc"
    return None


def jvm_split(pids: Iterable[int], proc: Path = Path("/proc")) -> dict[str, int]:
    """Ticks of the live JIT and GC threads of the processes ``pids`` (the JVM among them)."""
    out = dict.fromkeys(JVM_SPLIT, 0)
    for pid in pids:
        try:
            tids = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                comm, _, own, _ = parse_stat((proc / str(pid) / "task" / tid / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            cls = jvm_thread_class(comm)
            if cls is not None:
                out[cls] += own
    return out


class CpuMeter:
    """CPU seconds by role over the timed windows (:meth:`start` / :meth:`stop`), per item at :meth:`take`.

    ``roots`` maps a role to the pid of the tree it measures; ``node`` may change between windows (a restarted
    node: set :attr:`node_pid`)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self.roots: dict[str, int | None] = {"node": None, "broker": None, "postgres": None}
        self.bench_pid = os.getpid()
        self._start: tuple[float, dict[str, float]] | None = None
        self._cpu: dict[str, float] = {}
        self._wall = 0.0
        self._items = 0

    @property
    def node_pid(self) -> int | None:
        return self.roots["node"]

    @node_pid.setter
    def node_pid(self, pid: int | None) -> None:
        self.roots["node"] = pid

    def snapshot(self) -> dict[str, float]:
        """CPU seconds so far of each role that has a root (absent: not seen)."""
        procs = read_proc(self.proc)
        tick = os.sysconf("SC_CLK_TCK")
        trees = {role: tree(pid, procs) for role, pid in self.roots.items() if pid is not None}
        taken = set().union(*trees.values()) if trees else set()
        roots = [pid for pid in self.roots.values() if pid is not None]
        out = {role: tree_cpu(pids, procs) / tick for role, pids in trees.items()}
        out["bench"] = tree_cpu(tree(self.bench_pid, procs, exclude=roots) - taken, procs) / tick
        if "broker" in trees:
            for cls, ticks in jvm_split(trees["broker"], self.proc).items():
                out[cls] = ticks / tick
        return out

    def start(self) -> None:
        self._start = (time.perf_counter(), self.snapshot())

    def stop(self, items: int) -> None:
        """The timed window that began at :meth:`start` handled ``items`` items."""
        if self._start is None:
            return
        t0, before = self._start
        after = self.snapshot()
        self._start = None
        self._wall += time.perf_counter() - t0
        self._items += items
        for key, value in after.items():
            if key in before:
                self._cpu[key] = self._cpu.get(key, 0.0) + max(0.0, value - before[key])

    def take(self) -> dict[str, float]:
        """Microseconds of CPU per item by role since the last take (a role without a root is absent), ``total``
        (the roles, the JVM split not counted twice), ``broker_work`` (the broker less JIT and GC) and ``cores``
        (CPU seconds per second of the windows); empty when no window was timed."""
        cpu, wall, items = self._cpu, self._wall, self._items
        self._cpu, self._wall, self._items, self._start = {}, 0.0, 0, None
        if not items or wall <= 0:
            return {}
        out = {key: value / items * 1e6 for key, value in cpu.items()}
        roles_cpu = sum(v for k, v in cpu.items() if k in ROLES)
        out["total"] = roles_cpu / items * 1e6
        if "broker" in out:
            out["broker_work"] = out["broker"] - sum(out.get(k, 0.0) for k in JVM_SPLIT)
        out["cores"] = roles_cpu / wall
        return out
