"""Benchmarks and experiments: the code behind ``ibe-pubsub bench`` and ``demo``, which
start key servers and peers, drive the simulator and write JSON and PNG reports.

Plots need matplotlib, from the ``bench`` extra (``pip install 'ibe-pubsub[bench]'``)."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "bench_bulk": ("run_bulk_bench",),
    "bench_crypto": ("run_crypto_bench",),
    "bench_e2e": ("WARMUP_RATE", "run_e2e_bench"),
    "bench_keyserver": ("BenchSettings", "run_bench"),
    "bench_monitoring": ("plot_monitoring", "run_monitoring_bench"),
    "bench_overlay": ("Bench",),
    "bench_replicas": ("run_replica_bench",),
    "bench_threshold": ("run_threshold_bench",),
    "bench_streams": ("GOALS", "run_streams_bench"),
    "bench_transport": ("run_transport_bench",),
    "delays": ("Setting",),
    "demo": ("DemoError", "run_demo"),
    "exactness": ("exactness",),
    "exceptions": ("BenchRunError", "BenchSettingsError", "EvaluationError"),
    "plotting": ("PlotsUnavailable", "pyplot"),
    "postgres": ("PostgresUnavailable", "fresh_database", "postgres_cluster"),
    "soak": ("SoakSettings", "run_soak", "soak_network"),
    "soak_oracle": ("plot_soak",),
    "sizes": ("DEFAULT_EXPERIMENTS", "DROPPER_KINDS", "EXACTNESS_SCHEMAS", "EXPERIMENTS",
              "Sizes"),
    "trees": ("draw_run",),
})
