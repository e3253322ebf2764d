"""Recovery: finish what the log decided, presume abort for what it did not, never touch another node's xids.

Pure logic over injected parts: the node's recovery log, the resource managers (by key), a re-send callback for
one-phase branches, the clock and the coordinator's in-flight set. :meth:`RecoveryManager.run` reads the log,
THEN the in-flight set, THEN the log again, and acts only on transactions of the first read that are not in
flight and still in the second read (a transaction that begins and decides meanwhile is its coordinator's).
Then, in order:

1. asks every manager for its prepared branches (``recover()`` on a fresh session). An xid with another format
   id, a gtrid that is not nsjms's, or another node's id is FOREIGN: counted, never touched. A manager that
   cannot be reached makes its branches unknown: nothing is concluded about them ("gone" is only believed when
   the manager answered);
2. for each transaction with a COMMIT record and no END: ``commit_branch`` every two-phase branch still
   prepared (a branch already gone counts as done), then, only once every two-phase branch is done (the outbox
   rows are then committed and visible), hands each one-phase branch not known done to the re-send callback
   (``resend(gtrid, participant)``: re-send the outbox rows of ``gtrid`` with their stored dedupe ids). All
   done: END; otherwise a PROGRESS record, and the next run continues. Branches a HEURISTIC record settled are
   skipped, the others are still finished; with a HEURISTIC record there is no END (see 5);
3. for each transaction with a ROLLBACK record: roll back its prepared branches, then END (same rule for
   heuristics);
4. for each of THIS node's prepared branches whose gtrid has no COMMIT or ROLLBACK record (presumed abort; this
   includes a log entry with only HEURISTIC/PROGRESS records, e.g. a heuristic during a rollback): roll it back
   if it is older than ``in_flight_guard`` seconds (by PostgreSQL's ``prepared`` time) and not in flight here;
   younger ones are left alone (their coordinator may be about to log the decision). A gtrid whose COMMIT was
   seen, or whose PROGRESS names a committed branch, is never presumed aborted. An entry without a decision and
   without a heuristic is ended once none of its branches is prepared;
5. a transaction with a HEURISTIC record stays listed until an operator forgets it (:meth:`forget`), which is
   refused while any of its branches is prepared, a manager does not answer, or a branch of its logged COMMIT
   is not finished.

Batches: the two-phase work of a run (the commits of 2 and the presumed-abort rollbacks of 4) goes to each
manager in ONE call when it is a :class:`~xa.resource.BatchManager` (results per branch, exactly as the single
calls); the re-sends of 2 go to the callback's ``many(items)`` in one call when it has one. Order guarantees are
unchanged (a re-send still follows every two-phase commit of its transaction). ``run(resend=False)`` does the
two-phase work only and lists the ready re-sends in ``report.deferred`` (they stay in the log for the next run).

:meth:`RecoveryManager.view` lists the in-doubt transactions with every pending branch, the safe action and its
reason: the data of ``nsjms txn list``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from psycopg import Xid

from .errors import BranchNotFound, HeuristicKind, HeuristicOutcome, UsageError, XAError
from .log import RecoveryLog
from .observer import Guarded, Observer
from .records import Commit, End, Heuristic, LiveTxn, Participant, Progress
from .resource import BatchManager, Clock, RecoverableManager
from .xid import NodeId, branch_xid, is_ours

__all__ = ["OPERATOR_DECISION", "InDoubt", "RecoveryManager", "RecoveryReport", "SafeAction", "render"]

_log = logging.getLogger("xa.recovery")
#: The branch a HEURISTIC record names when an operator took the decision the coordinator never logged (it settles
#: no branch: the transaction is finished as its COMMIT record says, :meth:`RecoveryManager.resolve`).
OPERATOR_DECISION = "(operator decision)"
Resend = Callable[[str, Participant], None]


class SafeAction(enum.StrEnum):
    COMMIT = "commit"  # the decision is COMMIT: commit the prepared branches
    RESEND = "resend"  # committed; the broker's outcome is unknown: re-send the outbox rows (same dedupe ids)
    ROLLBACK = "rollback"  # no decision (presumed abort) or a logged rollback
    WAIT = "wait"  # may still be deciding (in flight, or younger than the guard)
    FORGET = "forget"  # heuristic outcome recorded: an operator checks the data, then forgets it
    RETRY = "retry"  # a manager did not answer; nothing can be concluded yet


@dataclass(frozen=True)
class InDoubt:
    gtrid: str
    status: str
    pending: tuple[str, ...]
    age_s: float | None
    action: SafeAction
    reason: str


@dataclass
class RecoveryReport:
    committed: list[str] = field(default_factory=list)  # "gtrid/branch"
    rolled_back: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # ready for their re-send, left to the next pass
    ended: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    heuristic: list[str] = field(default_factory=list)
    foreign: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    """One logged COMMIT being finished: the branches to do and those done so far."""

    txn: LiveTxn
    todo: list[Participant]
    done: set[str] = field(default_factory=set)


@dataclass
class _Scan:
    prepared: dict[str, dict[str, Xid]] = field(default_factory=dict)  # manager key -> str(xid) -> xid
    unavailable: dict[str, str] = field(default_factory=dict)  # manager key -> error
    foreign: int = 0

    def state(self, manager: str, xid: Xid) -> Xid | str | None:
        """The prepared xid, None if gone, or the manager's error text if it could not be asked."""
        if manager in self.unavailable:
            return self.unavailable[manager]
        if manager not in self.prepared:
            return f"no resource manager {manager!r} is configured"
        return self.prepared[manager].get(str(xid))


class RecoveryManager:
    def __init__(self, node: NodeId, log: RecoveryLog, managers: Sequence[RecoverableManager], resend: Resend,
                 clock: Clock, *, in_flight_guard: float = 60.0,
                 in_flight: Callable[[], frozenset[str]] = frozenset, observer: Observer | None = None) -> None:
        if log.node != node:
            raise UsageError(f"the recovery log belongs to node {log.node}, not {node}")
        self.node, self.log, self.clock = node, log, clock
        self.observer = Guarded(observer)  # telemetry (xa.observer): one recovery_pass per run()
        self.managers: Mapping[str, RecoverableManager] = {m.key: m for m in managers}
        self.resend, self.guard, self.in_flight = resend, in_flight_guard, in_flight

    # -------------------------------------------------------------------------------------------- scan
    def _scan(self) -> _Scan:
        scan = _Scan()
        for key, manager in self.managers.items():
            try:
                xids = manager.recover()
            except XAError as exc:
                scan.unavailable[key] = f"{type(exc).__name__}: {exc}"
                continue
            ours = [x for x in xids if is_ours(x, self.node)]
            scan.foreign += len(xids) - len(ours)
            scan.prepared[key] = {str(x): x for x in ours}
        return scan

    # --------------------------------------------------------------------------------------------- run
    def run(self, *, resend: bool = True) -> RecoveryReport:
        """One recovery pass (see the module docstring); the observer hears of it, also when it raises.
        ``resend=False``: the two-phase work only; one-phase branches ready for their re-send are listed in
        ``report.deferred`` and left to the next pass."""
        report = RecoveryReport()
        start = self.clock.monotonic()
        try:
            self._run(report, resend)
        except Exception as exc:
            self.observer.recovery_pass(report, self.clock.monotonic() - start, f"{type(exc).__name__}: {exc}")
            raise
        self.observer.recovery_pass(report, self.clock.monotonic() - start, "")
        return report

    def _run(self, report: RecoveryReport, resend: bool) -> None:
        # Read the log, THEN the in-flight set, THEN the log again. A gtrid of the first read that is not in
        # flight was handed off by its coordinator before the in-flight read (a coordinator writes END before
        # handing off), so it is safe to act on if it is still in the second read. A gtrid that appears only
        # in the second read may have been begun and decided after the in-flight read: left alone this run.
        first = self.log.live()
        busy = self.in_flight()
        live = self.log.live()
        scan = self._scan()
        report.foreign = scan.foreign
        report.errors += [f"{k}: {e}" for k, e in scan.unavailable.items()]
        keep = set(busy) | {g for g, t in [*first.items(), *live.items()] if _decided(t) or t.done}
        keep |= set(live) - set(first)
        undecided: list[LiveTxn] = []
        commits: list[LiveTxn] = []
        for txn in live.values():
            if txn.gtrid in busy or txn.gtrid not in first:
                report.waiting.append(txn.gtrid)
                continue
            if txn.heuristics:
                report.heuristic.append(txn.gtrid)
            if txn.commit is not None:
                commits.append(txn)
            elif txn.rollback is not None:
                self._finish_rollback(txn, txn.rollback.participants, scan, report)
            elif txn.done:  # branches committed, decision record lost: only an operator can decide
                report.waiting.append(txn.gtrid)
            else:  # no decision logged (e.g. a heuristic during a rollback): presumed abort below
                undecided.append(txn)
        doomed = self._presume_abort(keep, set(live), scan, report)
        self._finish_commits(commits, scan, report, doomed, resend=resend)
        for txn in undecided:
            self._end_undecided(txn, scan, report)

    def _finish_commit(self, txn: LiveTxn, scan: _Scan, report: RecoveryReport) -> None:
        self._finish_commits([txn], scan, report)

    def _finish_commits(self, txns: Sequence[LiveTxn], scan: _Scan, report: RecoveryReport,
                        rollbacks: Mapping[str, Sequence[Xid]] | None = None, *, resend: bool = True) -> None:
        """Every branch not done and not settled by a heuristic record is finished (heuristic or not). The
        two-phase branches of all ``txns`` are committed together, in one batch per manager with the presumed-abort
        ``rollbacks`` of that manager; then the one-phase branches of every transaction whose two-phase branches
        are all done are re-sent together (unless ``resend`` is False: they stay for the next pass)."""
        plans: list[_Plan] = []
        pending: dict[str, list[tuple[_Plan, str, Xid]]] = {}
        for txn in txns:
            assert txn.commit is not None
            settled = _settled(txn)
            plan = _Plan(txn, [p for p in txn.commit.participants if p.name not in txn.done and p.name not in settled])
            plans.append(plan)
            for p in plan.todo:
                if p.one_phase:
                    continue
                found = scan.state(p.manager, branch_xid(txn.gtrid, p.name))
                if isinstance(found, str):
                    report.errors.append(f"{txn.gtrid}/{p.name}: {found}")
                elif found is None:
                    plan.done.add(p.name)  # already gone: committed before the crash (or by an earlier recovery)
                else:
                    pending.setdefault(p.manager, []).append((plan, p.name, found))
        rollbacks = rollbacks or {}
        for key in [*pending, *(k for k in rollbacks if k not in pending)]:
            items, doomed = pending.get(key, []), list(rollbacks.get(key, ()))
            results = self._each(key, [("commit", x) for _, _, x in items] + [("rollback", x) for x in doomed])
            for xid, err in zip(doomed, results[len(items):], strict=True):
                self._rolled_back(xid, err, report)
            for (plan, name, _xid), err in zip(items, results[:len(items)], strict=True):
                if err is None:
                    report.committed.append(f"{plan.txn.gtrid}/{name}")
                    plan.done.add(name)
                elif isinstance(err, BranchNotFound):
                    plan.done.add(name)
                elif isinstance(err, HeuristicOutcome):
                    self._heuristic(plan.txn.gtrid, name, err, report)
                else:
                    report.errors.append(f"{plan.txn.gtrid}/{name}: commit failed: {err}")
        # Every two-phase branch done: the outbox rows are committed and visible, the re-send may run.
        ready = [(plan, p) for plan in plans if all(p.one_phase or p.name in plan.done for p in plan.todo)
                 for p in plan.todo if p.one_phase]
        if not resend:
            report.deferred += [f"{plan.txn.gtrid}/{p.name}" for plan, p in ready]
            ready = []
        for (plan, p), exc in zip(ready, self._resend_all([(plan.txn.gtrid, p) for plan, p in ready]),
                                  strict=True):
            if exc is None:
                report.resent.append(f"{plan.txn.gtrid}/{p.name}")
                plan.done.add(p.name)
            else:
                report.errors.append(f"{plan.txn.gtrid}/{p.name}: re-send failed: {type(exc).__name__}: {exc}")
        for plan in plans:
            self._progress(plan.txn, plan.todo, [p.name for p in plan.todo if p.name in plan.done], report)

    def _each(self, key: str, ops: Sequence[tuple[str, Xid]]) -> list[XAError | None]:
        """``("commit"|"rollback", xid)`` operations at manager ``key``: one batch call when the manager can
        (:class:`~xa.resource.BatchManager`), else one call each. The error of each, or None."""
        manager = self.managers[key]
        if len(ops) > 1 and isinstance(manager, BatchManager):
            return manager.finish_branches(ops)
        out: list[XAError | None] = []
        for step, xid in ops:
            try:
                manager.commit_branch(xid) if step == "commit" else manager.rollback_branch(xid)
            except XAError as exc:
                out.append(exc)
            else:
                out.append(None)
        return out

    def _resend_all(self, items: Sequence[tuple[str, Participant]]) -> list[Exception | None]:
        """The re-send callback for each (gtrid, participant): its ``many`` in one call when it has one."""
        if not items:
            return []
        many = getattr(self.resend, "many", None)
        if many is not None and len(items) > 1:
            try:
                return list(many(items))
            except Exception as exc:  # noqa: BLE001 - every item failed; the next run retries
                return [exc] * len(items)
        out: list[Exception | None] = []
        for gtrid, p in items:
            try:
                self.resend(gtrid, p)
            except Exception as exc:  # noqa: BLE001 - the callback's failure is reported; the next run retries
                out.append(exc)
            else:
                out.append(None)
        return out

    def _finish_rollback(self, txn: LiveTxn, parts: Sequence[Participant], scan: _Scan,
                         report: RecoveryReport) -> None:
        settled = _settled(txn)
        todo = [p for p in parts if p.name not in txn.done and p.name not in settled]
        done = [p.name for p in todo if p.one_phase or self._rollback_branch(txn.gtrid, p, scan, report)]
        self._progress(txn, todo, done, report)

    def _rollback_branch(self, gtrid: str, p: Participant, scan: _Scan, report: RecoveryReport) -> bool:
        xid = branch_xid(gtrid, p.name)
        found = scan.state(p.manager, xid)
        if isinstance(found, str):
            report.errors.append(f"{gtrid}/{p.name}: {found}")
            return False
        return found is None or self._rollback_xid(p.manager, found, report)

    def _rollback_xid(self, manager: str, xid: Xid, report: RecoveryReport) -> bool:
        return self._rolled_back(xid, self._each(manager, [("rollback", xid)])[0], report)

    def _rolled_back(self, xid: Xid, err: XAError | None, report: RecoveryReport) -> bool:
        if err is None:
            report.rolled_back.append(f"{xid.gtrid}/{xid.bqual}")
            return True
        if isinstance(err, BranchNotFound):
            return True
        if isinstance(err, HeuristicOutcome):
            self._heuristic(xid.gtrid, xid.bqual or "", err, report)
        else:
            report.errors.append(f"{xid.gtrid}/{xid.bqual}: rollback failed: {err}")
        return False

    def _progress(self, txn: LiveTxn, todo: Sequence[Participant], done: Sequence[str],
                  report: RecoveryReport) -> None:
        """END once every branch is done, unless a heuristic outcome is recorded: that stays until forgotten."""
        now = self.clock.wall()
        if len(done) == len(todo) and not txn.heuristics and txn.gtrid not in report.heuristic:
            self.log.append(End(txn.gtrid, now), durable=False)
            report.ended.append(txn.gtrid)
        elif done:
            self.log.append(Progress(txn.gtrid, tuple(done), (), now), durable=False)

    def _end_undecided(self, txn: LiveTxn, scan: _Scan, report: RecoveryReport) -> None:
        """A log entry without a decision and without a heuristic: END once none of its branches is prepared."""
        if txn.heuristics or scan.unavailable:
            return
        left = [x for x in _prepared_of(scan, txn.gtrid) if f"{x.gtrid}/{x.bqual}" not in report.rolled_back]
        if not left:
            self.log.append(End(txn.gtrid, self.clock.wall()), durable=False)
            report.ended.append(txn.gtrid)

    def _heuristic(self, gtrid: str, branch: str, exc: HeuristicOutcome, report: RecoveryReport) -> None:
        record = Heuristic(gtrid, exc.kind, branch, f"participant:{branch}", str(exc), self.clock.wall())
        self.log.append(record, durable=True)
        report.heuristic.append(gtrid)

    def _presume_abort(self, known: set[str], seen: set[str], scan: _Scan,
                       report: RecoveryReport) -> dict[str, list[Xid]]:
        """This node's old prepared branches whose gtrid is not in ``known`` (in flight, decided, or new in the
        log), by manager: the caller rolls them back; ``seen``: the gtrids of the log read before the scan."""
        candidates: list[tuple[str, Xid]] = []
        for key, xids in scan.prepared.items():
            for xid in xids.values():
                age = self._age(xid)
                if xid.gtrid in known:
                    continue
                if age is None or age < self.guard:
                    report.waiting.append(f"{xid.gtrid}/{xid.bqual}")
                else:
                    candidates.append((key, xid))
        if not candidates:
            return {}
        # Re-check AFTER the scan, in-flight set first, then the log: a transaction that decided while we
        # scanned is either still in flight here or has its COMMIT record in the log (it stays until END, and
        # END is written only when every branch is done, in which case the rollback below finds nothing).
        busy = self.in_flight()
        again = self.log.live()
        doomed: dict[str, list[Xid]] = {}
        for key, xid in candidates:
            txn = again.get(xid.gtrid)
            if xid.gtrid in busy or (txn is not None and (_decided(txn) or txn.done or xid.gtrid not in seen)):
                report.waiting.append(f"{xid.gtrid}/{xid.bqual}")
            else:
                doomed.setdefault(key, []).append(xid)
        return doomed

    def _age(self, xid: Xid) -> float | None:
        return None if xid.prepared is None else self.clock.wall() - xid.prepared.timestamp()

    # ---------------------------------------------------------------------------------------- operator
    def forget(self, gtrid: str, who: str) -> None:
        """An operator checked a heuristic outcome: drop it from the log (END with ``who``). Refused while any
        branch is still prepared, a manager cannot be asked, or a branch of a logged COMMIT is not finished:
        END would let presumed abort roll back part of a decided transaction, or lose a re-send."""
        txn = self.log.live().get(gtrid)
        if txn is None or not txn.heuristics:
            raise UsageError("only a transaction with a heuristic outcome can be forgotten", gtrid=gtrid)
        if gtrid in self.in_flight():
            raise UsageError("this node is driving the transaction now", gtrid=gtrid)
        scan = self._scan()
        if scan.unavailable:
            raise UsageError(f"cannot forget yet: {', '.join(sorted(scan.unavailable))} did not answer, its "
                             "branches may still be prepared", gtrid=gtrid)
        prepared = sorted(x.bqual or "" for x in _prepared_of(scan, gtrid))
        if prepared:
            raise UsageError(f"cannot forget yet: branches {', '.join(prepared)} are still prepared (let recovery "
                             "finish them, or decide them with commit/rollback first)", gtrid=gtrid)
        settled = _settled(txn)
        unfinished = [p.name for p in (txn.commit.participants if txn.commit is not None else ())
                      if p.one_phase and p.name not in txn.done and p.name not in settled]
        if unfinished:
            raise UsageError(f"cannot forget yet: branches {', '.join(unfinished)} of the logged COMMIT are not "
                             "finished (recovery re-sends them)", gtrid=gtrid)
        self.log.append(End(gtrid, self.clock.wall(), who), durable=True)

    def resolve(self, gtrid: str, action: SafeAction, who: str, why: str, *, heuristic: bool = False,
                one_phase: Sequence[Participant] = ()) -> RecoveryReport:
        """An operator's decision for one in-doubt transaction (``nsjms txn commit|rollback``).

        Acting as the log says (commit a logged COMMIT; roll back what has no COMMIT record) is ordinary recovery,
        without waiting for the in-flight guard. Acting AGAINST the log (commit without a COMMIT record, roll
        back a logged COMMIT) is a heuristic decision: a HEURISTIC record (who, when, why) is made durable BEFORE
        any branch is touched, and the transaction stays listed until it is forgotten.

        Committing a transaction that has no decision at all (its coordinator died before deciding) needs
        ``heuristic`` (:class:`UsageError` without it, nothing done). The operator then takes the decision the
        coordinator never logged: a COMMIT record naming its prepared branches and the ``one_phase`` participants
        (the broker send, whose outbox rows the prepared branch holds) and a HEURISTIC record (who, why; branch
        :data:`OPERATOR_DECISION`, which settles no branch) are made durable first, then the transaction is
        finished exactly as a logged COMMIT: the prepared branches are committed, then the one-phase branches
        re-sent (same dedupe ids); a re-send that fails is retried by every later recovery pass. It stays listed
        until it is forgotten.
        """
        if action not in (SafeAction.COMMIT, SafeAction.ROLLBACK):
            raise UsageError(f"an operator can commit or roll back, not {action.value}", gtrid=gtrid)
        if not who.strip() or not why.strip():
            raise UsageError("an operator decision needs who and why", gtrid=gtrid)
        if gtrid in self.in_flight():
            raise UsageError("this node is driving the transaction now", gtrid=gtrid)
        txn = self.log.live().get(gtrid)
        scan = self._scan()
        found = [(key, x) for key, xids in scan.prepared.items() for x in xids.values() if x.gtrid == gtrid]
        if txn is None and not found:
            raise UsageError("no such in-doubt transaction on this node", gtrid=gtrid)
        report = RecoveryReport(foreign=scan.foreign, errors=[f"{k}: {e}" for k, e in scan.unavailable.items()])
        logged_commit = txn is not None and txn.commit is not None
        if action is SafeAction.COMMIT and logged_commit and txn is not None and all(
                h.branch == OPERATOR_DECISION for h in txn.heuristics):   # an operator's COMMIT is finished as any
            self._finish_commit(txn, scan, report)
            if txn.heuristics:
                report.heuristic.append(gtrid)
            return report
        if action is SafeAction.COMMIT and not logged_commit and (txn is None or txn.rollback is None):
            if not heuristic:
                raise UsageError("no COMMIT is logged: committing it is a heuristic decision (heuristic=True)",
                                 gtrid=gtrid)
            return self._operator_commit(gtrid, txn, found, scan, report, who, why, one_phase)
        if action is SafeAction.ROLLBACK and not logged_commit:
            for key, xid in found:
                self._rollback_xid(key, xid, report)
            if txn is not None and txn.rollback is not None and not txn.heuristics and not report.errors:
                self._progress(txn, [], [], report)
            return report
        kind = HeuristicKind.COMMIT if action is SafeAction.COMMIT else self._rollback_kind(txn, found)
        self.log.append(Heuristic(gtrid, kind, "*", who, why, self.clock.wall()), durable=True)
        report.heuristic.append(gtrid)
        for key, xid in found:
            if action is SafeAction.COMMIT:
                self._commit_xid(key, xid, report)
            else:
                self._rollback_xid(key, xid, report)
        return report

    def _operator_commit(self, gtrid: str, txn: LiveTxn | None, found: Sequence[tuple[str, Xid]], scan: _Scan,
                         report: RecoveryReport, who: str, why: str,
                         one_phase: Sequence[Participant]) -> RecoveryReport:
        """The operator's COMMIT of an undecided transaction (see :meth:`resolve`)."""
        now = self.clock.wall()
        known = {p.name for p in one_phase}
        two_phase = tuple(Participant(x.bqual or "", key, key, False)
                          for key, x in found)
        done = tuple(sorted(txn.done)) if txn is not None else ()
        extra = tuple(Participant(n, "unknown", "unknown", True) for n in done
                      if n not in known and all(p.name != n for p in two_phase))
        record = Commit(gtrid, two_phase + extra + tuple(one_phase), None, now)
        self.log.append(record, durable=False)
        self.log.append(Heuristic(gtrid, HeuristicKind.COMMIT, OPERATOR_DECISION, who, why, now), durable=True)
        report.heuristic.append(gtrid)
        decided = self.log.live().get(gtrid)
        if decided is None or decided.commit is None:
            raise UsageError("the operator's COMMIT record could not be read back", gtrid=gtrid)
        self._finish_commit(decided, scan, report)
        return report

    @staticmethod
    def _rollback_kind(txn: LiveTxn | None, found: Sequence[tuple[str, Xid]]) -> HeuristicKind:
        """ROLLBACK if nothing of a logged COMMIT can have committed yet (every two-phase branch still prepared,
        nothing recorded done), else MIXED."""
        if txn is None or txn.commit is None:
            return HeuristicKind.ROLLBACK
        still = {x.bqual for _, x in found}
        two_phase = {p.name for p in txn.commit.participants if not p.one_phase}
        return HeuristicKind.ROLLBACK if two_phase <= still and not txn.done else HeuristicKind.MIXED

    def _commit_xid(self, manager: str, xid: Xid, report: RecoveryReport) -> None:
        try:
            self.managers[manager].commit_branch(xid)
        except BranchNotFound:
            return
        except XAError as exc:
            report.errors.append(f"{xid.gtrid}/{xid.bqual}: commit failed: {exc}")
            return
        report.committed.append(f"{xid.gtrid}/{xid.bqual}")

    def view(self) -> list[InDoubt]:
        """Every in-doubt transaction of this node, oldest first, with the safe action and why. Total: any log
        entry is shown, whatever records it holds."""
        first = self.log.live()  # same read order as run(): an entry new in the second read may be in flight
        busy = self.in_flight()
        live, scan = self.log.live(), self._scan()
        busy |= set(live) - set(first)
        out = [self._view_logged(t, scan, busy) for t in live.values()]
        by_gtrid: dict[str, list[Xid]] = {}
        for xids in scan.prepared.values():
            for xid in xids.values():
                if xid.gtrid not in live:
                    by_gtrid.setdefault(xid.gtrid, []).append(xid)
        out += [self._view_undecided(g, xids, busy) for g, xids in by_gtrid.items()]
        return sorted(out, key=lambda d: -(d.age_s or 0.0))

    def _view_logged(self, txn: LiveTxn, scan: _Scan, busy: frozenset[str]) -> InDoubt:
        now = self.clock.wall()
        decision = txn.commit or txn.rollback
        prepared = _prepared_of(scan, txn.gtrid)
        if decision is not None:
            pending = tuple(p.name for p in decision.participants if p.name not in txn.done)
        else:
            pending = tuple(sorted({x.bqual or "" for x in prepared} | txn.unknown))
        at = decision.at if decision is not None else min((h.at for h in txn.heuristics), default=None)
        ages = [a for a in (self._age(x) for x in prepared) if a is not None]
        age = now - at if at is not None else (max(ages) if ages else None)
        h = txn.heuristics[-1] if txn.heuristics else None
        if h is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(h.at))
            status, note = f"heuristic-{h.kind.value}", f"{h.who} at {when}: {h.why}; "
        else:
            status = "commit-logged" if txn.commit else "rollback-logged" if txn.rollback else "undecided"
            note = ""
        if txn.gtrid in busy:
            return InDoubt(txn.gtrid, "in-flight", pending, age, SafeAction.WAIT, "this node is driving it now")
        action, reason = self._next_step(txn, scan, prepared, ages)
        if action is None:
            if h is not None:
                return InDoubt(txn.gtrid, status, pending, age, SafeAction.FORGET,
                               f"{note}nothing left to finish; check the data, then forget")
            return InDoubt(txn.gtrid, status, pending, age, SafeAction.RETRY, "finished; the next run ends it")
        return InDoubt(txn.gtrid, status, pending, age, action, note + reason)

    def _next_step(self, txn: LiveTxn, scan: _Scan, prepared: list[Xid],
                   ages: list[float]) -> tuple[SafeAction | None, str]:
        """What is still to be done for a logged transaction, heuristic or not (None: nothing)."""
        settled = _settled(txn)
        names = {x.bqual or "" for x in prepared}
        decision = txn.commit or txn.rollback
        if decision is None:
            if txn.done:
                return SafeAction.COMMIT, (f"no decision logged, yet {', '.join(sorted(txn.done))} committed: "
                                           "decide the rest by hand (commit)")
            if prepared:
                if not ages or min(ages) < self.guard:
                    return SafeAction.WAIT, f"no decision yet; younger than the in-flight guard ({self.guard:.0f} s)"
                return SafeAction.ROLLBACK, f"no COMMIT logged: presumed abort of {', '.join(sorted(names))}"
            if scan.unavailable:
                return SafeAction.RETRY, f"cannot reach {', '.join(sorted(scan.unavailable))}"
            return None, ""
        work = [p for p in decision.participants if p.name not in txn.done and p.name not in settled]
        unreachable = sorted({p.manager for p in work if not p.one_phase and p.manager not in scan.prepared})
        if unreachable:
            return SafeAction.RETRY, f"{'COMMIT' if txn.commit else 'ROLLBACK'} logged; cannot reach " \
                                     f"{', '.join(unreachable)}"
        left = [p.name for p in work if not p.one_phase and p.name in names]
        if txn.rollback is not None and left:
            return SafeAction.ROLLBACK, (f"rollback decided ({txn.rollback.reason}); branches {', '.join(left)} "
                                         "left prepared")
        if txn.commit is not None and left:
            return SafeAction.COMMIT, f"COMMIT logged; prepared branches {', '.join(left)} must be committed"
        if txn.commit is not None and any(p.one_phase for p in work):
            return SafeAction.RESEND, ("COMMIT logged; broker outcome unknown: re-send the outbox rows with "
                                       "their dedupe ids")
        held = sorted(names & settled)
        if held:
            action = SafeAction.COMMIT if txn.heuristics[-1].kind is HeuristicKind.COMMIT else SafeAction.ROLLBACK
            return action, f"heuristic branches {', '.join(held)} still prepared: decide them, then forget"
        return None, ""

    def _view_undecided(self, gtrid: str, xids: list[Xid], busy: frozenset[str]) -> InDoubt:
        ages = [a for a in (self._age(x) for x in xids) if a is not None]
        age = max(ages) if ages else None
        pending = tuple(sorted(x.bqual or "" for x in xids))
        if gtrid in busy:
            return InDoubt(gtrid, "in-flight", pending, age, SafeAction.WAIT, "this node is driving it now")
        if age is None or age < self.guard:
            return InDoubt(gtrid, "undecided", pending, age, SafeAction.WAIT,
                           f"no decision yet; younger than the in-flight guard ({self.guard:.0f} s)")
        return InDoubt(gtrid, "undecided", pending, age, SafeAction.ROLLBACK,
                       "no COMMIT logged: presumed abort")


def _decided(txn: LiveTxn) -> bool:
    return txn.commit is not None or txn.rollback is not None


def _settled(txn: LiveTxn) -> set[str]:
    """Branches a heuristic record settled (``*``: every branch of the transaction)."""
    names = {h.branch for h in txn.heuristics}
    if "*" in names:
        decision = txn.commit or txn.rollback
        names |= {p.name for p in decision.participants} if decision is not None else set()
    return names


def _prepared_of(scan: _Scan, gtrid: str) -> list[Xid]:
    return [x for xids in scan.prepared.values() for x in xids.values() if x.gtrid == gtrid]


def render(view: Sequence[InDoubt]) -> str:
    """The operator view as a plain-text table (what ``nsjms txn list`` prints)."""
    head = ("GTRID", "STATUS", "AGE", "PENDING", "ACTION", "REASON")
    rows = [(d.gtrid, d.status, "-" if d.age_s is None else f"{d.age_s:.0f}s", ",".join(d.pending) or "-",
             d.action.value, d.reason) for d in view]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in [head, *rows]]
    return "\n".join(lines) + "\n"
