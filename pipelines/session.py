"""The Spark session of bulk jobs: Java checked first, Spark's console output kept in a log file,
and our own progress line instead of Spark's stage bars.

Spark's JVM inherits this process's stdout and stderr when it starts, and everything it
and its Python workers print goes there for the session's life: start-up notices, log4j
lines, stage bars. Pointing both at a file while the JVM starts keeps all of that in the
file, and this process gets its terminal back for its own output.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession
from pyspark.status import SparkStageInfo

from pipelines.progress import Progress

JAVA_NEEDED = "Spark needs Java 17 or newer"
# Packages the executors import; shipped as a zip when they run outside this machine.
SHIPPED_PACKAGES = ("credentials", "pipelines")


class SparkStartError(RuntimeError):
    """Spark could not start; the message says why, in one line."""


def java_problem() -> str | None:
    """Why Spark's launcher will find no Java (it tries $JAVA_HOME/bin/java, then PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if os.access(Path(home) / "bin" / "java", os.X_OK):
            return None
        return f"no Java found: JAVA_HOME is {home}, which has no bin/java"
    if shutil.which("java"):
        return None
    return "no Java found: JAVA_HOME is not set and java is not on PATH"


@contextmanager
def _console_to(log: Path | None) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``log`` (emptied first) for the block, then restore
    them."""
    if log is None:
        yield
        return
    try:
        handle = log.open("wb")
    except OSError as exc:
        raise SparkStartError(f"cannot write {log}: {exc.strerror}") from exc
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with handle:
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in enumerate(saved, start=1):
            os.dup2(copy, fd)
            os.close(copy)


def spark_session(master: str = "local[*]", partitions: int = 8, driver_memory: str = "2g",
                  log: Path | None = None) -> SparkSession:
    """A session for bulk jobs: no UI, few shuffle partitions, Spark's console output in
    ``log`` (None: on this process's stdout and stderr, with Spark's stage bars).

    Raises SparkStartError if there is no Java or Spark does not start."""
    problem = java_problem()
    if problem:
        raise SparkStartError(f"{problem}; {JAVA_NEEDED}")
    builder = (SparkSession.builder.master(master).appName("ibe-pubsub bulk")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", str(log is None).lower())
               .config("spark.sql.shuffle.partitions", str(partitions))
               .config("spark.driver.memory", driver_memory))
    local = master.startswith("local")
    if local:  # the workers must run this interpreter, which has the project installed
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    details = f"details in {log}" if log else "details above"
    try:
        with _console_to(log):
            spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:  # the JVM exited before it answered
        raise SparkStartError(f"Spark's Java process exited at start-up ({details}); "
                              f"{JAVA_NEEDED}") from exc
    except Py4JJavaError as exc:  # the JVM runs, but Spark refused the settings
        message = str(exc.java_exception).splitlines()[0]
        raise SparkStartError(f"{message} ({details})") from exc
    spark.sparkContext.setLogLevel("WARN")
    if not local:
        _ship_packages(spark)
    return spark


def _ship_packages(spark: SparkSession) -> None:
    """Make the project's pure-Python packages importable on a cluster's executors."""
    archive = Path(tempfile.mkdtemp(prefix="ibe-pubsub-")) / "ibe_pubsub_packages.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in SHIPPED_PACKAGES:
            package = Path(sys.modules[name].__file__ or "").parent
            for path in package.rglob("*"):
                if path.suffix in (".py", ".toml"):
                    zf.write(path, path.relative_to(package.parent))
    spark.sparkContext.addPyFile(str(archive))


class StageProgress:
    """While a Spark job runs, its progress on ``stream`` (stderr), unless Spark shows its
    own stage bars (a session without a log file).

    On a terminal: a bar for the tasks of the running stage, named "stage k of n" of its
    job rather than by Spark's internal stage ids. Otherwise (a log, a pipe) a line when the
    first stage runs, then at most every ``log_every`` seconds, so an unattended run shows
    it is alive. Use as a context manager around the job; it polls Spark's status tracker
    in a thread."""

    def __init__(self, spark: SparkSession, stream: TextIO | None = None,
                 poll: float = 0.5, log_every: float = 10.0) -> None:
        context = spark.sparkContext
        self.tracker = context.statusTracker()
        self.stream = stream or sys.stderr
        self.poll = poll
        self.log_every = log_every
        self.shown = context.getConf().get("spark.ui.showConsoleProgress") != "true"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stage-progress", daemon=True)

    def __enter__(self) -> StageProgress:
        if self.shown:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.shown:
            self._thread.join()

    def _running(self) -> tuple[SparkStageInfo, str] | None:
        """The running stage (the earliest, if several) and its name, "stage k of n"."""
        active = self.tracker.getActiveStageIds()
        info = self.tracker.getStageInfo(min(active)) if active else None
        if info is None:
            return None
        for job_id in self.tracker.getActiveJobsIds():
            job = self.tracker.getJobInfo(job_id)
            if job is not None and info.stageId in job.stageIds:
                stages = sorted(job.stageIds)
                return info, f"stage {stages.index(info.stageId) + 1} of {len(stages)}"
        return info, "a stage"

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
            info, name = running
            if bar is None or info.stageId != stage:
                if bar is not None:
                    bar.close()
                stage = info.stageId
                bar = Progress(info.numTasks, f"Spark tasks, {name}", self.stream,
                               done=info.numCompletedTasks)
            bar.advance(info.numCompletedTasks - bar.done)
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
                info, name = running
                line += f"; {name}: {info.numCompletedTasks}/{info.numTasks} tasks done"
            print(line, file=self.stream, flush=True)
