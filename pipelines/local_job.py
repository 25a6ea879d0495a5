"""The single-process driver: the same batch decomposition as the Spark job, in a plain loop.

For small enrolments without a JVM, as the reference the Spark job is tested
against, and as the baseline of ``bench bulk``. All requests go into part 0 of the
output (``parts``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc

from ibe_pubsub.pipelines.batches import COPIES
from ibe_pubsub.pipelines.inputs import BATCH_ROWS, PARSED, parse_file, request_files
from ibe_pubsub.pipelines.layout import LayoutError, Summary, prepare_output
from ibe_pubsub.pipelines.parts import write_part
from ibe_pubsub.pipelines.progress import Progress
from ibe_pubsub.pipelines.requests import Settings


def read_requests(path: Path) -> pa.Table:
    """Every request of the input (``inputs.PARSED``), read by the parser Spark runs too."""
    found = request_files(path)
    try:
        return pa.Table.from_batches([batch for file in found.files
                                      for batch in parse_file(found.fmt, file.name,
                                                              file.read_bytes())], schema=PARSED)
    except (pa.ArrowInvalid, OSError) as exc:
        raise LayoutError(f"cannot read {path}: {exc}") from exc


def with_copies(table: pa.Table) -> pa.Table:
    """Append how many requests name each row's identity (duplicates get rejected)."""
    identities = table.column("identity")
    counts = pc.value_counts(identities)
    where = pc.index_in(identities, counts.field("values"), skip_nulls=False)
    return table.append_column(COPIES, counts.field("counts").take(where).cast(pa.int64()))


def run_local(settings: Settings, input_path: Path, out: Path, overwrite: bool = False,
              stream: TextIO | None = None) -> Summary:
    """Decompose ``input_path`` into the bulk output layout under ``out``, in this process.

    Progress goes to ``stream`` (default stderr)."""
    started = time.perf_counter()
    requests = with_copies(read_requests(input_path))
    prepare_output(out, overwrite)
    progress = Progress(requests.num_rows, "requests", stream)
    try:
        counts = write_part(settings, requests.to_batches(max_chunksize=BATCH_ROWS), out, 0,
                            progress.advance)
    finally:
        progress.close()
    summary = counts.summary("python", settings, time.perf_counter() - started)
    summary.write(out)
    return summary
