"""Helpers shared by the test modules (no tests in here): ``harness`` (real broker clusters from
mqd.testing plus record helpers), ``consumer`` (consumer configs, producing, draining) and ``daemon``
(daemon configs, landing checks). pytest puts tests/ on sys.path (``pythonpath`` in pyproject.toml),
so a test imports them as ``support.<module>``; no test module imports another."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: config/, docs/, systemd/, bench/
