"""The daemon process (issue 32): the `Daemon` (consumer → sink → commit on one loop) and the
`Runner` around it (signals, pid file, watchdog, reload, the admin endpoint), their typed states and
snapshot, the reset records the daemon's start hook applies, and sd_notify. (The heap trim the
broker and the landing use too is a primitive on the top floor, `mqd/memory_trim.py`.)

Nothing is imported here: the CLI imports `mqd.process.runner` for its pid-file helpers alone,
without loading the daemon.
"""
