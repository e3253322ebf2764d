"""How much Spark work a piece of the audit ran: jobs, stages and tasks, from Spark's status tracker.

Wall-clock seconds depend on the machine and on what else runs on it; the number of Spark jobs and stages an audit
runs for a given ledger does not (docs/audit.md, "What the audit costs"). :func:`counted` runs its block under a job
group of its own and afterwards asks ``SparkContext.statusTracker()`` for that group's jobs and their stages.
Adaptive execution submits each query stage as a job of its own, so ``jobs`` counts the query stages materialised
plus the result jobs. A stage counts as run when it completed at least one task: a stage whose shuffle output an
earlier job already wrote is *skipped* (Spark reuses it) and is not counted. The tracker keeps the last
``spark.ui.retainedJobs`` / ``spark.ui.retainedStages`` (1000 each by default): far more than an audit runs.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["SparkWork", "counted"]


@dataclass
class SparkWork:
    """Filled when the :func:`counted` block ends."""

    jobs: int = 0
    stages: int = 0          # stages that ran at least one task (skipped stages not counted)
    skipped_stages: int = 0
    tasks: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"jobs": self.jobs, "stages": self.stages, "skipped_stages": self.skipped_stages, "tasks": self.tasks}


@contextmanager
def counted(spark: Any, description: str = "nsjms audit") -> Iterator[SparkWork]:
    """Count the Spark jobs the block runs on ``spark``'s context from this thread (a job group of its own, cleared
    after: the caller's group, if it had one, is not restored)."""
    sc = spark.sparkContext
    group = f"nsjms-{secrets.token_hex(6)}"
    work = SparkWork()
    sc.setJobGroup(group, description)
    try:
        yield work
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        tracker = sc.statusTracker()
        jobs = tracker.getJobIdsForGroup(group)
        stages: set[int] = set()
        for job in jobs:
            info = tracker.getJobInfo(job)
            if info is not None:
                stages.update(info.stageIds)
        work.jobs = len(jobs)
        for stage in stages:
            info = tracker.getStageInfo(stage)
            if info is not None and info.numCompletedTasks > 0:
                work.stages += 1
                work.tasks += info.numCompletedTasks
            else:
                work.skipped_stages += 1
