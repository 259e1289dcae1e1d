"""The benchmarks behind ``millstream bench`` (see docs/performance.md).

One module per concern: :mod:`bench.generator` (seeded input data and exact
oracles), :mod:`bench.jobs` (the computations workers run), :mod:`bench.latency`
(the paced injector and the arrival-time collector), :mod:`bench.workloads`
(W1, W2, recovery, watermark lag, memory on a real local cluster),
:mod:`bench.profile` (cProfile of the in-process record path),
:mod:`bench.spark_peer` (the same workloads on Spark Structured Streaming) and
:mod:`bench.report` (JSON and Markdown under ``bench/results/``).
"""
