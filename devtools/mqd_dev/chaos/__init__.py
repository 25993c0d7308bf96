"""Fault injection against real processes (``make chaos`` = ``python -m mqd_dev.chaos --rounds 20``).

- ``proxy``: a seeded TCP proxy in front of each broker node (slow, reset, truncated, corrupted, hung)
- ``procs``: broker nodes behind their proxies and ``mqd run`` daemons as child processes
- ``disk``: landing directory full / read-only for root (tmpfs + read-only bind mount)
- ``load``: the steady produce load (acks=all), which writes every acknowledgement to the ledger
- ``ledger``: the producer's ledger of acknowledged records (topic, partition, offset, payload id)
- ``node_data``: broker data faults: master data-dir loss, damaged closed segments, a recreated topic
- ``lock_freeze``: a daemon frozen while it holds a landing lock (found through /proc/locks)
- ``publish_kill``: a fresh daemon killed after its first fetch, before its first publication
- ``s3_landing``: ``--landing s3``: SeaweedFS with two gateways, the gateway faults, the store's view
- ``check``: ledger vs landing files and Spark table (by payload id), ledger vs broker log, replicas
- ``runner``: the seeded rounds, recovery times, the end check and the summary
"""
