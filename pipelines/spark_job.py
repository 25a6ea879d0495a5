"""The Spark driver of bulk decomposition: DataFrame API around one Arrow-batch function.

Duplicates are counted with a window over ``identity`` (which also co-locates
each identity's rows), the decomposition runs in Python workers through
``mapInArrow``, and the decomposed rows are cached once and written as two
Parquet outputs. Nothing is collected to the driver except four counts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import zipfile
from functools import partial
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from pipelines.batches import (
    COPIES,
    CREDENTIAL_COLUMNS,
    DECOMPOSED,
    REJECTED_COLUMNS,
    REQUEST_COLUMNS,
    decompose_batches,
)
from pipelines.layout import (
    CREDENTIALS,
    REJECTED,
    LayoutError,
    Summary,
    input_format,
    prepare_output,
)
from pipelines.requests import Settings

# Packages the executors import; shipped as a zip when they run outside this machine.
SHIPPED_PACKAGES = ("credentials", "pipelines")


def spark_session(master: str = "local[*]", partitions: int = 8,
                  driver_memory: str = "2g") -> SparkSession:
    """A session for bulk jobs: no UI, few shuffle partitions, quiet logs."""
    builder = (SparkSession.builder.master(master).appName("ibe-pubsub bulk")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(partitions))
               .config("spark.driver.memory", driver_memory))
    local = master.startswith("local")
    if local:  # the workers must run this interpreter, which has the project installed
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
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


def read_requests(spark: SparkSession, path: Path) -> DataFrame:
    """The request columns as strings; JSON lines may omit a key (null), other formats not."""
    fmt = input_format(path)
    if fmt == "json":
        schema = ", ".join(f"{c} string" for c in REQUEST_COLUMNS)
        return spark.read.schema(schema).json(str(path))
    if fmt == "csv":  # RFC 4180 quoting ("" inside a field); empty is null, quoted "" is ""
        frame = (spark.read.option("header", True).option("escape", '"')
                 .option("nullValue", "\u0000").csv(str(path)))
    else:
        frame = spark.read.parquet(str(path))
    missing = [c for c in REQUEST_COLUMNS if c not in frame.columns]
    if missing:
        raise LayoutError(f"{path} lacks the column(s) {', '.join(missing)}")
    return frame.select(*(F.col(c).cast("string") for c in REQUEST_COLUMNS))


def decompose_frame(requests: DataFrame, settings: Settings) -> DataFrame:
    """Requests -> decomposed rows (``batches.DECOMPOSED``), each identity's rows contiguous."""
    copies = F.count(F.lit(1)).over(Window.partitionBy("identity"))
    return requests.withColumn(COPIES, copies).mapInArrow(
        partial(decompose_batches, settings), from_arrow_schema(DECOMPOSED))


def run_spark(spark: SparkSession, settings: Settings, input_path: Path, out: Path,
              overwrite: bool = False) -> Summary:
    """Decompose ``input_path`` into the bulk output layout under ``out`` with Spark."""
    started = time.perf_counter()
    requests = read_requests(spark, input_path)
    prepare_output(out, overwrite)
    decomposed = decompose_frame(requests, settings).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        accepted = F.col("reason").isNull()
        decomposed.filter(accepted).select(*CREDENTIAL_COLUMNS).write.parquet(
            str(out / CREDENTIALS))
        decomposed.filter(~accepted).select(*REJECTED_COLUMNS).write.parquet(
            str(out / REJECTED))
        counts = decomposed.agg(
            F.count(F.when(accepted, 1)).alias("rows"),
            F.count(F.when(accepted & F.col("fine"), 1)).alias("fine"),
            F.count(F.when(~accepted, 1)).alias("rejected"),
            F.count_distinct(F.when(accepted, F.col("identity"))).alias("accepted"),
        ).collect()[0]
    finally:
        decomposed.unpersist()
    summary = Summary("spark", settings.schema.id, counts["accepted"] + counts["rejected"],
                      counts["accepted"], counts["rejected"], counts["rows"], counts["fine"],
                      time.perf_counter() - started)
    summary.write(out)
    return summary
