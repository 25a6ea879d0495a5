"""Benchmarks and experiments: the code behind ``ibe-pubsub bench`` and ``demo``, which
start key servers and peers, drive the simulator and write JSON and PNG reports.

Plots need matplotlib, from the ``bench`` extra (``pip install 'ibe-pubsub[bench]'``)."""
