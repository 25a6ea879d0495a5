"""The Spark driver of bulk decomposition: DataFrame API around two Arrow-batch functions.

Input files are read as bytes and parsed in Python workers by the parser of the
single-process driver (``inputs``), duplicates are counted with a window over
``identity`` (which also co-locates each identity's rows), the decomposition runs
in Python workers through ``mapInArrow``, and the decomposed rows are cached once
(on disk: they are about 35 times as many as the requests, and a partition of them
buffered in the JVM's heap does not fit a 2 GB driver) and written as two Parquet
outputs. Nothing is collected to the driver except four
counts. The session itself comes from ``session``.
"""

from __future__ import annotations

import time
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
    decompose_batches,
)
from pipelines.inputs import PARSED, parse_files, request_files
from pipelines.layout import CREDENTIALS, REJECTED, Summary, prepare_output
from pipelines.requests import Settings


def read_requests(spark: SparkSession, path: Path) -> DataFrame:
    """Every request of the input (``inputs.PARSED``): each file's bytes go through the
    parser the single-process driver uses too."""
    found = request_files(path)
    files = spark.read.format("binaryFile").load([str(f.absolute()) for f in found.files])
    return files.select("path", "content").mapInArrow(partial(parse_files, found.fmt),
                                                      from_arrow_schema(PARSED))


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
    decomposed = decompose_frame(requests, settings).persist(StorageLevel.DISK_ONLY)
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
