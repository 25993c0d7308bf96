"""One OpenBLAS thread in the commands that move records: numpy's thread pool costs CPU it never uses.

numpy's wheels load OpenBLAS when numpy is imported, and OpenBLAS starts a thread per core there,
which spin-wait before they sleep: on the 2-core machine ``import numpy`` costs 0.12 CPU-s instead
of 0.07, and a whole ``mqd run --burst`` of 1,000 records 0.50 CPU-s instead of 0.39 (issue 34's
fixed cost), the spinning taking a core from the imports beside it. mqd calls no BLAS routine: its
arrays are offsets, lengths and masks, never a matrix product.

So the commands that move records (``mqd run``, ``mqd broker``, ``mqd produce``) set
``OPENBLAS_NUM_THREADS=1`` before numpy loads, unless the user chose a count (any of the variables
OpenBLAS reads). Other commands are left alone: ``mqd spark`` hosts Spark, whose Python workers
get their thread counts from Spark; an application that imports mqd decides for itself.
"""

from __future__ import annotations

import os
import sys

from mqd.log import is_mqd_command

__all__ = ["RECORD_COMMANDS", "THREAD_VARIABLES", "one_thread_in_record_commands"]

RECORD_COMMANDS = frozenset({"run", "broker", "produce"})
# what OpenBLAS reads for its thread count, first found wins
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_thread_in_record_commands() -> bool:
    """Set ``OPENBLAS_NUM_THREADS=1`` when this process is a record-moving mqd command that numpy has
    not loaded in yet and the user set no thread count; True when it was set."""
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if not is_mqd_command() or command not in RECORD_COMMANDS or "numpy" in sys.modules:
        return False
    if any(name in os.environ for name in THREAD_VARIABLES):
        return False
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    return True
