"""Our own progress line for a running Spark job, instead of Spark's stage bars.

A classic session is polled through its status tracker; a Spark Connect client is told of
its stages by the server, through a progress handler of the session.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, NamedTuple, TextIO

from pyspark.sql import SparkSession

from ibe_pubsub.pipelines.progress import Progress
from ibe_pubsub.pipelines.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.connect.shell.progress import StageInfo


class Stage(NamedTuple):
    """The running stage: Spark's id, its tasks and those done, and its name "stage k of n"
    of its job rather than Spark's internal id."""

    stage_id: int
    tasks: int
    completed: int
    name: str


class StageProgress:
    """While a Spark job runs, its progress on ``stream`` (stderr), unless Spark shows its
    own stage bars (a classic session without a log file).

    On a terminal: a bar for the tasks of the running stage. Otherwise (a log, a pipe) a
    line when the first stage runs, then at most every ``log_every`` seconds, so an
    unattended run shows it is alive. Use as a context manager around the job; a thread
    polls what Spark reported."""

    def __init__(self, spark: SparkSession | ConnectSession, stream: TextIO | None = None,
                 poll: float = 0.5, log_every: float = 10.0) -> None:
        self.spark = spark
        self.connect = is_connect(spark)
        self.stream = stream or sys.stderr
        self.poll = poll
        self.log_every = log_every
        self.shown = self.connect or spark.sparkContext.getConf().get(
            "spark.ui.showConsoleProgress") != "true"
        self._reported: list[StageInfo] = []  # Spark Connect: the stages last reported
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stage-progress", daemon=True)

    def __enter__(self) -> StageProgress:
        if self.connect:
            self.spark.registerProgressHandler(self._report)
        if self.shown:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.shown:
            self._thread.join()
        if self.connect:
            self.spark.removeProgressHandler(self._report)

    def _report(self, stages: list[StageInfo] | None, inflight_tasks: int,
                operation_id: str | None, done: bool) -> None:
        self._reported = [] if done else list(stages or ())

    def _running(self) -> Stage | None:
        """The running stage (the earliest, if several)."""
        return self._running_connect() if self.connect else self._running_classic()

    def _running_classic(self) -> Stage | None:
        tracker = self.spark.sparkContext.statusTracker()
        active = tracker.getActiveStageIds()
        info = tracker.getStageInfo(min(active)) if active else None
        if info is None:
            return None
        name = "a stage"
        for job_id in tracker.getActiveJobsIds():
            job = tracker.getJobInfo(job_id)
            if job is not None and info.stageId in job.stageIds:
                stages = sorted(job.stageIds)
                name = f"stage {stages.index(info.stageId) + 1} of {len(stages)}"
                break
        return Stage(info.stageId, info.numTasks, info.numCompletedTasks, name)

    def _running_connect(self) -> Stage | None:
        stages = sorted(self._reported, key=lambda s: s.stage_id)
        for k, info in enumerate(stages, start=1):
            if not info.done:
                return Stage(info.stage_id, info.num_tasks, info.num_completed_tasks,
                             f"stage {k} of {len(stages)}")
        return None

    def _watch(self) -> None:
        if self.stream.isatty():
            self._bars()
        else:
            self._lines()

    def _bars(self) -> None:
        stage, bar = None, None
        while not self._stop.wait(self.poll):
            running = self._running()
            if running is None:
                continue
            if bar is None or running.stage_id != stage:
                if bar is not None:
                    bar.close()
                stage = running.stage_id
                bar = Progress(running.tasks, f"Spark tasks, {running.name}", self.stream,
                               done=running.completed)
            bar.advance(running.completed - bar.done)
        if bar is not None:
            bar.close()

    def _lines(self) -> None:
        started = time.monotonic()
        last: float | None = None
        while not self._stop.wait(self.poll):
            running = self._running()
            now = time.monotonic()
            first = last is None and running is not None
            if not first and now - (started if last is None else last) < self.log_every:
                continue
            last = now
            line = f"Spark: {now - started:.0f} s"
            if running:
                line += f"; {running.name}: {running.completed}/{running.tasks} tasks done"
            print(line, file=self.stream, flush=True)
