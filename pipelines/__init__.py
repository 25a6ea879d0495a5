"""Bulk enrolment: decompose many enrolment requests on Spark, then issue their keys.

``bulk decompose`` (``spark_job`` or, without a JVM, ``local_job``) reads its
input with one parser (``inputs``), applies one batch function (``batches``: each
distinct predicate read column-wise by ``predicate_columns`` and decomposed with
``numeric_batch``, anything else by the per-request reference
``requests``) and writes
``DIR/credentials``, ``DIR/rejected`` and ``DIR/summary.json`` (``layout``); the
Spark session comes from ``session``. ``bulk issue`` (``issue``) streams those
credentials to the key server in deterministic chunks (``chunks``) and keeps its
resumable state and the key bundles in KEYDIR (``keydir``).
"""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "exceptions": ("PipelinesError",),
    "inputs": ("BATCH_ROWS", "request_files"),
    "issue": ("IssueError", "IssueOptions", "issue_bulk"),
    "keydir": ("KeyDirError",),
    "layout": ("LayoutError", "SPARK_LOG", "Summary", "prepare_output"),
    "local_job": ("run_local",),
    "rejections": ("first", "write_csv"),
    "requests": ("Settings",),
    "session": ("SparkStartError", "connect_session", "spark_session"),
    "spark_job": ("run_spark",),
    "stage_progress": ("StageProgress",),
})
