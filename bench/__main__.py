"""``python -m bench``: the end-to-end pipeline benchmark (bench/pipeline.py, ``make bench``). A full run
(no ``--shape``, ``--smoke`` or ``--single``) then runs the typed-records decode benchmark
(bench/typed_decode.py, issue 30) as its own process, ``--quick`` passed on."""

import signal
import subprocess
import sys

from bench.pipeline import main

TYPED_DECODE_TIMEOUT = 3 * 3600.0  # seconds: its default run is ~30 min on a busy 2-core machine


def full_run(argv: list[str]) -> bool:
    """Every shape, not a partial or single-pass run."""
    partial = ("--smoke", "--single", "--shape")
    return not any(a == p or a.startswith(p + "=") for a in argv for p in partial)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup (cluster stop) on SIGTERM
    argv = sys.argv[1:]
    code = main()
    if full_run(argv):
        typed = [sys.executable, "-m", "bench.typed_decode", *(["--quick"] if "--quick" in argv else [])]
        try:
            code = subprocess.run(typed, check=False, timeout=TYPED_DECODE_TIMEOUT).returncode or code
        except subprocess.TimeoutExpired:
            print(f"bench.typed_decode: not done within {TYPED_DECODE_TIMEOUT:.0f} s", file=sys.stderr)
            code = code or 1
    raise SystemExit(code)
