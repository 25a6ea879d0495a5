"""Where a bulk job reads and writes: input format by extension, output directories, summary.

Both decomposition drivers write the same layout, which ``bulk issue`` reads:
``DIR/credentials`` and ``DIR/rejected`` (Parquet) and ``DIR/summary.json``; the
Spark driver also keeps Spark's own console output in ``DIR/spark.log``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ibe_pubsub.pipelines.exceptions import PipelinesError

FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json",
           ".parquet": "parquet"}
CREDENTIALS = "credentials"
REJECTED = "rejected"
SUMMARY = "summary.json"
SPARK_LOG = "spark.log"


class LayoutError(PipelinesError, ValueError):
    """An input or output path that a bulk job cannot use."""


def data_files(directory: Path) -> list[Path]:
    """The data files of a directory written by Spark or by hand, in name order."""
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith(("_", ".")))


def input_format(path: Path) -> str:
    """"csv", "json" (JSON lines) or "parquet", from the file's (or directory's files') suffix."""
    if not path.exists():
        raise LayoutError(f"input {path} does not exist")
    suffixes = {p.suffix.lower() for p in data_files(path)} if path.is_dir() else \
        {path.suffix.lower()}
    if len(suffixes) != 1 or next(iter(suffixes)) not in FORMATS:
        raise LayoutError(f"cannot tell the format of {path} from its extension "
                          f"({', '.join(sorted(suffixes)) or 'no files'}); "
                          f"use one of {', '.join(FORMATS)}")
    return FORMATS[suffixes.pop()]


def prepare_output(out: Path, overwrite: bool) -> None:
    """Refuse to mix two runs' outputs; with ``overwrite`` remove the previous one."""
    previous = [out / name for name in (CREDENTIALS, REJECTED, SUMMARY) if (out / name).exists()]
    if previous and not overwrite:
        raise LayoutError(f"{out} already holds a bulk decomposition; pass --overwrite "
                          "or choose another directory")
    for path in previous:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    out.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class Summary:
    """The counts of one decomposition run; requests = accepted + rejected."""

    engine: str
    schema_id: str
    requests: int
    accepted: int
    rejected: int
    credential_rows: int
    fine_rows: int
    seconds: float

    def write(self, out: Path) -> None:
        (out / SUMMARY).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, out: Path) -> Summary:
        try:
            return cls(**json.loads((out / SUMMARY).read_text()))
        except FileNotFoundError as exc:
            raise LayoutError(f"{out} has no {SUMMARY}; run `bulk decompose` first") from exc
        except (ValueError, TypeError) as exc:
            raise LayoutError(f"{out / SUMMARY} is not a bulk decomposition summary") from exc

    def line(self) -> str:
        return (f"{self.requests} requests: {self.accepted} accepted "
                f"({self.credential_rows} credential rows, {self.fine_rows} fine), "
                f"{self.rejected} rejected, {self.seconds:.1f} s ({self.engine})")
