"""The Spark driver of bulk decomposition: DataFrame API around two Arrow-batch functions.

Input files are read as bytes and parsed in Python workers by the parser of the
single-process driver (``inputs``); duplicates are counted with a window over
``identity``, whose shuffle also spreads the requests over ``--partitions`` tasks.
Each task decomposes its partition in a Python worker through ``mapInArrow`` and writes
it there as one part of each output (``parts``, the writer of the single-process
driver), so the credential rows never pass through Spark's JVM: the workers hand back
one row of counts per task, and the driver collects their sum.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ibe_pubsub.pipelines.batches import COPIES
from ibe_pubsub.pipelines.inputs import PARSED, parse_files, request_files
from ibe_pubsub.pipelines.layout import Summary, prepare_output
from ibe_pubsub.pipelines.parts import COUNTS, Counts, write_part
from ibe_pubsub.pipelines.requests import Settings

COALESCE_PARTITIONS = "spark.sql.adaptive.coalescePartitions.enabled"


def read_requests(spark: SparkSession, path: Path) -> DataFrame:
    """Every request of the input (``inputs.PARSED``): each file's bytes go through the
    parser the single-process driver uses too."""
    found = request_files(path)
    files = spark.read.format("binaryFile").load([str(f.absolute()) for f in found.files])
    return files.select("path", "content").mapInArrow(partial(parse_files, found.fmt),
                                                      from_arrow_schema(PARSED))


def write_partition(settings: Settings, out: str,
                    batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: this task's requests -> its part of the output, named
    after its partition (a retry rewrites the same part); yields the part's counts."""
    yield write_part(settings, batches, Path(out), TaskContext.get().partitionId()).batch()


def decompose_frame(requests: DataFrame, settings: Settings, out: Path) -> DataFrame:
    """Requests -> the output under ``out``, as a frame of one ``parts.COUNTS`` row per task."""
    copies = F.count(F.lit(1)).over(Window.partitionBy("identity"))
    return requests.withColumn(COPIES, copies).mapInArrow(
        partial(write_partition, settings, str(out.absolute())), from_arrow_schema(COUNTS))


def run_spark(spark: SparkSession, settings: Settings, input_path: Path, out: Path,
              overwrite: bool = False) -> Summary:
    """Decompose ``input_path`` into the bulk output layout under ``out`` with Spark."""
    started = time.perf_counter()
    requests = read_requests(spark, input_path)
    prepare_output(out, overwrite)
    # One task per shuffle partition (--partitions): the work of a task is ~35 credential
    # rows per request, which the shuffled requests' bytes, by which Spark would merge
    # small partitions, do not show.
    spark.conf.set(COALESCE_PARTITIONS, "false")
    totals = decompose_frame(requests, settings, out).agg(
        *(F.sum(name).alias(name) for name in COUNTS.names)).collect()[0]
    counts = Counts(**{name: totals[name] or 0 for name in COUNTS.names})
    if not counts.requests:  # no task may have run: an empty part keeps both outputs readable
        write_part(settings, [], out, 0)
    summary = counts.summary("spark", settings, time.perf_counter() - started)
    summary.write(out)
    return summary
