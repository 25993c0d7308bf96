"""Where the records' memory lives: every mqd command runs Arrow on its jemalloc pool, with one
arena for every thread, unless the operator chose otherwise, and the Kafka decoder's arena is an
allocation of Arrow's default pool (with the landing's encoder, out of glibc's heap), returned to
it with the last view of its records."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from support.fake_kafka import values

from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.record_batch import decode_partition
from mqd.topic_partition import TopicPartition

KERNELS = [False, *([True] if records_kernel.COMPILED else [])]


def pool_of_a_command(env: dict[str, str]) -> str:
    code = "import mqd.operator.cli, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_commands_run_arrow_on_jemalloc_and_the_operator_s_choice_wins() -> None:
    """Importing the CLI (as every command does before pyarrow) picks jemalloc; an operator's
    ARROW_DEFAULT_MEMORY_POOL stays."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow has no jemalloc")
    assert pool_of_a_command(env) == "jemalloc"
    assert pool_of_a_command({**env, "ARROW_DEFAULT_MEMORY_POOL": "system"}) == "system"


def jemalloc_narenas(env: dict[str, str]) -> str:
    """The arena count Arrow's jemalloc ran with in a process that imported the CLI first (jemalloc
    prints its options at exit when told to)."""
    code = (
        "import os, mqd.operator.cli\n"
        "os.environ['JE_ARROW_MALLOC_CONF'] += ',stats_print:true'\n"
        "import pyarrow as pa\n"
        "pa.allocate_buffer(1 << 20)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip().startswith("opt.narenas:")]
    return line.split(":", 1)[1].strip()


def test_jemalloc_runs_one_arena_and_the_operator_s_options_win() -> None:
    """The event loop and the landing threads share one jemalloc arena (their freed pages serve
    each other); an operator's JE_ARROW_MALLOC_CONF stays."""
    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow has no jemalloc")
    env = {
        k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "JE_ARROW_MALLOC_CONF")
    }
    assert jemalloc_narenas(env) == "1"
    assert jemalloc_narenas({**env, "JE_ARROW_MALLOC_CONF": "narenas:3"}) == "3"


@pytest.mark.parametrize("compiled", KERNELS)
def test_decoded_records_are_an_allocation_of_arrows_pool(compiled: bool) -> None:
    """Decoding 2,000 records of 1 KiB grows the default pool by at least their bytes, and
    dropping the records gives them back."""
    pool = pa.default_memory_pool()
    data = values(0, *[b"%01024d" % i for i in range(2000)])
    before = pool.bytes_allocated()
    decoded = decode_partition(data, 0, True, tp=TopicPartition("t", 0), compiled=compiled)
    (batch,) = decoded.batches
    assert batch.records.num_rows == 2000
    assert pool.bytes_allocated() - before >= 2000 * 1024
    del decoded, batch
    gc.collect()
    assert pool.bytes_allocated() - before < 2000 * 1024
