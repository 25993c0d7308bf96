"""``python -m bench``: the end-to-end pipeline benchmark (bench/pipeline.py, ``make bench``)."""

import signal
import sys

from bench.pipeline import main

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup (cluster stop) on SIGTERM
    raise SystemExit(main())
