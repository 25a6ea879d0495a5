"""The Spark session of bulk jobs: Java checked first, Spark's console output kept in a log file,
and our code shipped to a cluster's workers. A session is classic (a driver JVM in this
process, any ``--master``) or a Spark Connect client (``--remote``: the driver runs in the
Connect server, and this process only sends it plans and our code).

Spark's JVM inherits this process's stdout and stderr when it starts, and everything it
and its Python workers print goes there for the session's life: start-up notices, log4j
lines, stage bars. Pointing both at a file while the JVM starts keeps all of that in the
file, and this process gets its terminal back for its own output.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from ibe_pubsub.pipelines.exceptions import PipelinesError
from ibe_pubsub.pipelines.shipping import package_archive

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

JAVA_NEEDED = "Spark needs Java 17 or newer"
CONNECT_PORT = 15002  # Spark Connect's default


class SparkStartError(PipelinesError, RuntimeError):
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
    if not local:  # a cluster's workers have Python and pyspark, but not this project
        spark.sparkContext.addPyFile(str(package_archive()))
    return spark


def connect_session(remote: str, partitions: int = 8) -> ConnectSession:
    """A Spark Connect session with the server at ``remote`` (``sc://host:port``), its
    workers given our packages as a Python artifact of this session.

    The server's own settings (master, memory, UI) are its own; only the session's
    shuffle partitions are set here. Raises SparkStartError if the server does not answer."""
    from pyspark.errors import PySparkException

    _reachable(remote)
    try:
        builder = SparkSession.builder.remote(remote).appName("ibe-pubsub bulk")
        spark = builder.config("spark.sql.shuffle.partitions", str(partitions)).getOrCreate()
        spark.addArtifacts(str(package_archive()), pyfile=True)
    except PySparkException as exc:
        raise SparkStartError(f"no Spark Connect server at {remote}: "
                              f"{str(exc).splitlines()[0]}") from exc
    return spark


def _reachable(remote: str, timeout: float = 5.0) -> None:
    """Fail at once if nothing listens at the server's address: Spark Connect's client
    would retry for minutes."""
    address = urlsplit(remote)
    try:
        host, port = address.hostname, address.port or CONNECT_PORT
    except ValueError as exc:  # a port that is not a number
        raise SparkStartError(f"{remote} is not sc://HOST:PORT: {exc}") from exc
    if not host:
        raise SparkStartError(f"{remote} is not sc://HOST:PORT: it names no host")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise SparkStartError(f"no Spark Connect server at {remote}: cannot connect to "
                              f"{host}:{port} ({exc.strerror or exc})") from exc


def is_connect(spark: SparkSession | ConnectSession) -> bool:
    """Whether ``spark`` is a Spark Connect client (it has no SparkContext)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
