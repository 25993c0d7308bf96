"""mqd's benchmarks, run from the project root with ``python -m``:

- ``python -m bench`` (``make bench``): the whole pipeline against a Kafka-compatible alternative
  (bench/pipeline.py);
- ``python -m bench.broker_bench``: one broker node's produce and fetch throughput;
- ``python -m bench.memab``: interleaved A/B runs of code trees (records/s and peak RSS).

See bench/README.md. Nothing here is part of the mqd wheel.
"""
