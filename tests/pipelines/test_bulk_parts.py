"""Parts of the output (``parts.write_part``) as Spark tasks write them: a second attempt
of a task replaces its part whole, and a failed one leaves no trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.synthetic_requests import random_requests
from ibe_pubsub.pipelines.inputs import parse_file
from ibe_pubsub.pipelines.layout import CREDENTIALS, REJECTED
from ibe_pubsub.pipelines.local_job import with_copies
from ibe_pubsub.pipelines.parts import Counts, write_part
from ibe_pubsub.pipelines.requests import Settings

SETTINGS = Settings(default_schema())


def _batches(count: int, seed: int) -> list[pa.RecordBatch]:
    """``count`` requests as the drivers hand them to ``write_part``, 10 per batch."""
    written = pa.BufferOutputStream()
    pq.write_table(random_requests(SETTINGS.schema, count, seed), written)
    parsed = pa.Table.from_batches(parse_file("parquet", "in.parquet",
                                              written.getvalue().to_pybytes()))
    return with_copies(parsed).to_batches(max_chunksize=10)


def _files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_a_retried_part_is_replaced_whole_and_a_failed_attempt_leaves_no_trace(tmp_path):
    first, second = _batches(30, seed=1), _batches(20, seed=2)
    counts = write_part(SETTINGS, first, tmp_path, 3)
    assert (counts.requests, counts.rejected) == (30, 0) and counts.rows > 30
    done = pq.read_table(tmp_path / CREDENTIALS)
    assert _files(tmp_path) == [f"{CREDENTIALS}/part-00003.parquet",
                                f"{REJECTED}/part-00003.parquet"]

    def failing() -> Iterator[pa.RecordBatch]:
        """A second attempt that dies after writing some rows (the control: they are on
        disk, under a hidden name, while the finished part is still the first one)."""
        yield from second[:2]
        [hidden] = (tmp_path / CREDENTIALS).glob(".part-00003.parquet.*.tmp")
        assert hidden.stat().st_size > 0
        assert pq.read_table(tmp_path / CREDENTIALS).equals(done)
        raise OSError("executor lost")

    with pytest.raises(OSError, match="executor lost"):
        write_part(SETTINGS, failing(), tmp_path, 3)
    assert _files(tmp_path) == [f"{CREDENTIALS}/part-00003.parquet",
                                f"{REJECTED}/part-00003.parquet"]
    assert pq.read_table(tmp_path / CREDENTIALS).equals(done)

    again = write_part(SETTINGS, second, tmp_path, 3)  # the retry: only its rows remain
    assert again.requests == 20 and again != counts
    assert pq.read_table(tmp_path / CREDENTIALS).num_rows == again.rows
    assert len(_files(tmp_path)) == 2
    assert write_part(SETTINGS, second, tmp_path, 0) + again == Counts(40, 0, 2 * again.rows,
                                                                       2 * again.fine)
