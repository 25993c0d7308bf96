"""The daemon process (issue 32): the `Daemon` (consumer → sink → commit on one loop) and the
`Runner` around it (signals, pid file, watchdog, reload, the admin endpoint), their typed states and
snapshot, the reset records the daemon's start hook applies, sd_notify and the heap trim.

Nothing is imported here: the CLI imports `mqd.process.runner` for its pid-file helpers alone, and
the broker and the landing import `mqd.process.memory_trim`, without loading the daemon.
"""
