"""bench/meter.py (issue 27): CPU is charged by process tree, not by process name, and the broker's JIT and GC
threads are reported apart. A fake /proc: a second broker and a second PostgreSQL beside the bench's own (what
round 8's meter counted as the bench's) must not be counted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _meter_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_meter", ROOT / "bench" / "meter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                              # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


meter = _meter_module()


def _stat(pid: int, comm: str, ppid: int, utime: int, stime: int = 0, cutime: int = 0, cstime: int = 0) -> str:
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime), str(cutime), str(cstime)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root

    def process(self, pid: int, comm: str, ppid: int, utime: int, cutime: int = 0,
                threads: dict[int, tuple[str, int]] | None = None) -> None:
        d = self.root / str(pid)
        (d / "task").mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(_stat(pid, comm, ppid, utime, 0, cutime))
        for tid, (name, ticks) in (threads or {}).items():
            (d / "task" / str(tid)).mkdir(exist_ok=True)
            # a thread's cutime field is the whole process's: the meter must not add it per thread
            (d / "task" / str(tid) / "stat").write_text(_stat(tid, name, ppid, ticks, 0, cutime))


def test_parse_stat_takes_the_fields_after_the_last_parenthesis() -> None:
    comm, ppid, own, children = meter.parse_stat(_stat(7, "odd) (name", 3, 10, 5, 2, 1))
    assert (comm, ppid, own, children) == ("odd) (name", 3, 15, 3)


@pytest.mark.parametrize(("name", "cls"), [("C2 CompilerThre", "broker_jit"), ("C1 CompilerThre", "broker_jit"),
                                           ("GC Thread#0", "broker_gc"), ("G1 Conc#0", "broker_gc"),
                                           ("VM Thread", "broker_gc"), ("ActiveMQ Transp", None), ("java", None)])
def test_jvm_threads_are_classified_by_their_hotspot_names(name: str, cls: str | None) -> None:
    assert meter.jvm_thread_class(name) == cls


def test_roles_are_process_trees_and_foreign_services_are_not_counted(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proc = FakeProc(tmp_path)
    bench = 100
    monkeypatch.setattr(meter.os, "getpid", lambda: bench)
    monkeypatch.setattr(meter.os, "sysconf", lambda name: 100)
    proc.process(1, "init", 0, 0)
    proc.process(bench, "python", 1, 10)
    proc.process(101, "python", bench, 5)                        # a client subprocess of the bench
    proc.process(200, "python", bench, 50)                       # the node
    proc.process(300, "runuser", bench, 1)                       # the broker, started through runuser
    proc.process(301, "java", 300, 40, threads={1: ("C2 CompilerThre", 12), 2: ("GC Thread#0", 3),
                                                3: ("ActiveMQ Transp", 25)})
    proc.process(400, "postgres", bench, 8, cutime=4)            # the postmaster (4 = reaped backends)
    proc.process(401, "postgres", 400, 30)                       # a backend
    proc.process(500, "java", 1, 999, threads={9: ("C2 CompilerThre", 900)})  # another broker on the machine
    proc.process(600, "postgres", 1, 999)                        # another cluster
    m = meter.CpuMeter(proc=tmp_path)
    m.roots.update(node=200, broker=300, postgres=400)
    snap = m.snapshot()
    assert snap["node"] == pytest.approx(0.50)
    assert snap["broker"] == pytest.approx(0.41)                 # runuser + java, not the other java
    assert snap["broker_jit"] == pytest.approx(0.12) and snap["broker_gc"] == pytest.approx(0.03)
    assert snap["postgres"] == pytest.approx(0.42)               # 8 + 4 reaped + 30, not the other cluster
    assert snap["bench"] == pytest.approx(0.15)                  # itself and its client, not the services it started


def test_per_item_figures_and_an_unseen_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = FakeProc(tmp_path)
    monkeypatch.setattr(meter.os, "getpid", lambda: 100)
    monkeypatch.setattr(meter.os, "sysconf", lambda name: 100)
    proc.process(100, "python", 1, 0)
    proc.process(200, "python", 100, 0)
    proc.process(301, "java", 100, 0, threads={1: ("C2 CompilerThre", 0)})
    m = meter.CpuMeter(proc=tmp_path)
    m.roots.update(node=200, broker=301)                         # PostgreSQL external: not seen
    m.start()
    proc.process(200, "python", 100, 30)                         # 0.3 s
    proc.process(301, "java", 100, 20, threads={1: ("C2 CompilerThre", 5)})
    m.stop(1000)
    out = m.take()
    assert "postgres" not in out                                 # not seen is not zero
    assert out["node"] == pytest.approx(300.0)                   # µs per item
    assert out["broker"] == pytest.approx(200.0) and out["broker_jit"] == pytest.approx(50.0)
    assert out["broker_work"] == pytest.approx(150.0)
    assert out["total"] == pytest.approx(500.0)                  # the JIT split is not counted twice
    assert m.take() == {}
