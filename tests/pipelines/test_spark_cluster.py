"""`bulk decompose` on a real standalone Spark cluster (a master and two workers, each its
own JVM) and through a real Spark Connect server, against the single-process run.

The servers' Python workers cannot import the project (see ``spark_servers``), so these
tests also prove that the driver ships all the code they run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_servers import (
    Servers,
    Standalone,
    isolated_python,
    launch_connect,
    server_env,
    start_standalone,
    wait_connect,
)

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.evaluation.synthetic_requests import random_requests
from ibe_pubsub.pipelines.layout import Summary
from ibe_pubsub.pipelines.local_job import run_local
from ibe_pubsub.pipelines.requests import Settings
from ibe_pubsub.pipelines.session import java_problem
from ibe_pubsub.pipelines.shipping import ARCHIVE_NAME

# serial: beside another test process its master's web UI was found answering HTML, twice
pytestmark = [pytest.mark.skipif(java_problem() is not None,
                                 reason=f"a Spark cluster needs Java: {java_problem()}"),
              pytest.mark.serial]

RANDOM = 60  # random requests, then the BAD ones
BAD = [{"identity": "bad name", "role": "publisher", "predicate": ""},
       {"identity": "typo", "role": "subscriber", "predicate": "price in [3, "}]


class Spark(NamedTuple):
    servers: Servers
    cluster: Standalone
    remote: str  # the Spark Connect server's URL; wait_connect before using it


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spark]:
    """A standalone cluster and a Spark Connect server, started together (their JVMs'
    start-ups overlap); every JVM is killed at the end, whatever happened."""
    directory = tmp_path_factory.mktemp("spark-servers")
    python = isolated_python(directory, sys.executable)
    servers = Servers(directory, server_env(python, directory))
    try:
        remote = launch_connect(servers)
        yield Spark(servers, start_standalone(servers), remote)
    finally:
        servers.stop_all()


@pytest.fixture(scope="module")
def requests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Requests with two rejections, and their decomposition in one Python process."""
    root = tmp_path_factory.mktemp("requests")
    table = pa.concat_tables([random_requests(default_schema(), RANDOM, seed=11),
                              pa.Table.from_pylist(BAD, schema=pa.schema(
                                  [(c, pa.string()) for c in ("identity", "role", "predicate")]))])
    pq.write_table(table, root / "in.parquet")
    run_local(Settings(default_schema()), root / "in.parquet", root / "local")
    return root


def _rows(path: Path) -> list[tuple]:
    return sorted((tuple(r.values()) for r in pq.read_table(path).to_pylist()), key=repr)


def _decompose_like_local(servers: Servers, requests: Path, name: str, *where: str
                          ) -> subprocess.CompletedProcess[str]:
    """Run `bulk decompose` with ``where`` (--master or --remote) into ``requests/name``;
    assert that its rows, rejections and counts are the local run's; return the run.

    A driver here tells the executors which Python to run (PYSPARK_PYTHON), and reads
    spark-defaults.conf from SPARK_CONF_DIR: it waits for both executors before the first
    task, so that each worker runs some."""
    conf = servers.directory / "driver-conf"
    conf.mkdir(exist_ok=True)
    (conf / "spark-defaults.conf").write_text(
        "spark.cores.max 2\nspark.scheduler.minRegisteredResourcesRatio 1.0\n")
    env = child_env() | {var: servers.env[var] for var in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON")}
    env["SPARK_CONF_DIR"] = str(conf)
    done = subprocess.run(cli_command(
        "bulk", "decompose", "--schema", "stocks", "--input", str(requests / "in.parquet"),
        "--output", str(requests / name), "--partitions", "3", "--allow-rejects", *where),
        env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for part in ("credentials", "rejected"):
        assert _rows(requests / name / part) == _rows(requests / "local" / part), part
    local, remote = Summary.read(requests / "local"), Summary.read(requests / name)
    counts = ("requests", "accepted", "rejected", "credential_rows", "fine_rows", "schema_id")
    assert [getattr(remote, k) for k in counts] == [getattr(local, k) for k in counts]
    assert (remote.engine, remote.rejected) == ("spark", len(BAD))
    assert "Traceback" not in done.stderr
    return done


def _check_console(done: subprocess.CompletedProcess[str], output: Path) -> None:
    """What a person sees of a run with a driver here: our lines on the terminal (the
    summary, each rejection, progress as lines since stderr is not a terminal, named
    without Spark's stage ids), and Spark's own output in ``output/spark.log``."""
    assert f"{RANDOM + len(BAD)} requests" in done.stdout, done.stdout
    assert f"in.parquet line {RANDOM + 1} (bad name): identity must be" in done.stderr
    assert "a partial run, as --allow-rejects allows" in done.stderr
    assert "log4j" in (output / "spark.log").read_text()
    assert f"its logs go to {output / 'spark.log'}" in done.stderr
    for noise in ("log4j", "WARN", "[Stage", "Traceback"):
        assert noise not in done.stderr, noise
    assert re.search(r"^Spark: \d+ s; stage \d+ of \d+: \d+/\d+ tasks done$", done.stderr,
                     re.MULTILINE), done.stderr
    assert "\r" not in done.stderr


def test_workers_python_cannot_import_the_project(spark):
    """The control of the tests below: the Python the servers run for their workers has
    pyspark and pyarrow, but not this project."""
    servers = spark.servers
    python = str(servers.env["PYSPARK_PYTHON"])
    ours = subprocess.run([python, "-c", "import ibe_pubsub.pipelines"], env=servers.env,
                          cwd=servers.directory, capture_output=True, text=True, timeout=60)
    assert ours.returncode == 1 and "No module named 'ibe_pubsub'" in ours.stderr
    theirs = subprocess.run([python, "-c", "import pyspark, pyarrow, pandas"],
                            env=servers.env, cwd=servers.directory, timeout=60)
    assert theirs.returncode == 0
    plain = subprocess.run([sys.executable, "-c", "import ibe_pubsub.pipelines"], env=servers.env,
                           cwd=servers.directory, timeout=60)
    assert plain.returncode == 0  # without the wrapper, the editable install would serve it


def test_decompose_on_a_standalone_cluster_equals_the_local_run(spark, requests):
    servers, cluster = spark.servers, spark.cluster
    starts = servers.directory / "python-starts.log"
    starts.unlink(missing_ok=True)
    done = _decompose_like_local(servers, requests, "cluster", "--master", cluster.url)
    assert starts.read_text().count("pyspark.daemon") >= 2  # one per executor at least
    _check_console(done, requests / "cluster")

    deadline = time.monotonic() + 10  # the master lists the app once the driver has left
    while not (apps := cluster.state()["completedapps"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    [app] = apps
    assert (app["name"], app["state"], app["cores"]) == ("ibe-pubsub bulk", "FINISHED", 2)
    # an executor ran on each worker, in that worker's directory, with our zip fetched there
    for work_dir in cluster.work_dirs:
        [executor] = (work_dir / app["id"]).iterdir()
        assert (executor / ARCHIVE_NAME).is_file() and (executor / "stderr").is_file()


def test_decompose_through_spark_connect_equals_the_local_run(spark, requests):
    wait_connect(spark.servers)
    starts = spark.servers.directory / "python-starts.log"
    starts.unlink(missing_ok=True)
    stderr = _decompose_like_local(spark.servers, requests, "connect", "--remote",
                                   spark.remote).stderr
    assert "pyspark" in starts.read_text()  # the server's workers ran the isolated Python
    # the progress line follows the stages the server reports
    assert re.search(r"^Spark: \d+ s; stage \d+ of \d+: \d+/\d+ tasks done$", stderr,
                     re.MULTILINE), stderr
