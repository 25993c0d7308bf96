"""Helpers shared by the test modules (no tests in here): ``harness`` (real broker clusters from
mqd.testing plus record helpers), ``consumer`` (consumer configs, producing, draining) and ``daemon``
(daemon configs, landing checks). pytest puts tests/ on sys.path (``pythonpath`` in pyproject.toml),
so a test imports them as ``support.<module>``; no test module imports another."""
