"""Fault injection against real processes (``make chaos`` = ``python -m mqd_dev.chaos --rounds 20``).

- ``proxy``: a seeded TCP proxy in front of each broker node (slow, reset, truncated, corrupted, hung)
- ``procs``: broker nodes behind their proxies and ``mqd run`` daemons as child processes
- ``disk``: landing directory full / read-only for root (tmpfs + read-only bind mount)
- ``load``: the steady produce load and its ledger of acknowledged records
- ``check``: broker log vs acknowledgements, landing files and Spark table vs log, replicas vs master
- ``runner``: the seeded rounds, recovery times, the end check and the summary
"""
