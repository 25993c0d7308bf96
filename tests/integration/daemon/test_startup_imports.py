"""Start-up order of `mqd run` (issue 16): the first fetch goes out before the daemon pays for what
that fetch does not need. pyarrow and numpy (decoding, landing) and the admin endpoint are imported
after it; the start position, read from the landing's claim chains, needs neither.

No timing is asserted: the daemon runs as its own process with a ``sitecustomize`` on PYTHONPATH
that wraps stderr and, when the ``first fetch sent`` line is written, writes down which of the
watched modules ``sys.modules`` holds at that moment; an import hook writes down who imported each
watched module first (the failure message names the culprit)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.cli import mqd, produce, write_config
from support.daemon import assert_exactly_once
from support.harness import Cluster
from support.kafka import landed_rows
from support.kafka import produce as produce_kafka
from support.kafka import tansu as tansu  # the fixture

from mqd.testing import to_toml
from mqd.testing.configfiles import daemon_section
from mqd.testing.tansu import Tansu

# imported only once the first fetch is on the wire: decoding and landing (pyarrow, numpy); the mqd
# broker's client is not aiohttp
DEFERRED = ("pyarrow", "numpy")
# not imported by then, and maybe never: what only an invalid config's error message needs
OFF_THE_START_PATH = ("difflib",)
# never imported by a burst nobody asks for its status (issue 34): the admin endpoint, built at its
# first connection (mqd/operator/admin_listener.py: aiohttp.web, the status page), and the process
# figures of /status
ONLY_FOR_STATUS = ("mqd.operator.admin", "aiohttp", "psutil")
# never imported by a burst: Arrow's compute functions (~50 ms), where numpy over the timestamp
# buffers finds a file's bounds (mqd/landing/layout.py)
NOT_FOR_LANDING = ("pyarrow.compute",)
# never imported by a burst: numpy's masked arrays, which pa.array() of a numpy array imports to
# look for one (~15 ms); the decoder and the landing build such columns over the array's buffer
# (mqd/records.py fixed_width_array)
NOT_FOR_COLUMNS = ("numpy.ma",)
# never imported by the command logging JSON: rich is for console tracebacks and `mqd top`, and
# structlog imported it with itself (~0.1 CPU-s) until the command hid it (mqd/log.py, issue 34)
NOT_FOR_JSON_LOGS = ("rich",)
# never imported by the Kafka source: aiokafka's own clients, which its package's __init__ imports
# (~50 ms) and the command skips (mqd/sources/kafka/aiokafka_import.py, issue 34)
AIOKAFKA_CLIENTS = ("aiokafka.consumer", "aiokafka.producer")
# never imported by a burst: prometheus_client's HTTP servers, WSGI/ASGI apps and push gateway, which
# its package's __init__ imports (~14 ms) and the command skips (mqd/package_without_init.py); the
# admin endpoint imports its text format at the first scrape
METRICS_SERVERS = ("prometheus_client.exposition", "http.server")
# never imported by a burst into a new landing: delta-rs (~30 ms), which created the landing table
# until mqd wrote its version 0 itself (mqd/landing/delta_log.py); its checkpoints still use it
NOT_FOR_A_NEW_TABLE = ("deltalake",)
# never imported by a daemon whose addresses are literals: the idna codec (stringprep's tables, ~17
# ms), which socket.getaddrinfo loaded for the admin endpoint's str host (admin_listener.py)
NOT_FOR_ADDRESSES = ("encodings.idna",)
# config models whose validators `mqd run` does not build (pydantic's defer_build): the broker's
BROKER_MODELS = (
    "ClusterConfig",
    "BrokerConfig",
    "BrokerGroupSpec",
    "TopicSpec",
    "StorageConfig",
    "BrokerLimits",
)

_HOOK = '''
import atexit
import gc
import json
import os
import sys
import traceback

_OUT = os.environ["STARTUP_IMPORTS_FILE"]
_WATCHED = set(os.environ["STARTUP_IMPORTS_WATCHED"].split(","))
_MODELS = os.environ["STARTUP_MODELS_WATCHED"].split(",")


def _write(entry):
    with open(_OUT, "a") as f:
        f.write(json.dumps(entry) + "\\n")


class _Who:
    """Writes down the mqd frames that look for a watched module first (an import or a find_spec);
    finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name in _WATCHED and name not in sys.modules:
            stack = [f"{f.filename}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                     if "/mqd/" in f.filename and "/sitecustomize" not in f.filename]
            _write({"imported": name, "by": stack[-6:]})
        return None


class _Stderr:
    """stderr as given, plus a look at sys.modules when the first fetch is logged."""

    def __init__(self, stream):
        self._stream = stream
        self._seen = False

    def write(self, text):
        if not self._seen and "first fetch sent" in text:
            self._seen = True
            _write({"first_fetch": sorted(m for m in _WATCHED if m in sys.modules)})
            config = sys.modules["mqd.config"]
            _write({"built": sorted(n for n in _MODELS if getattr(config, n).__pydantic_complete__)})
            _write({"gc_enabled": gc.isenabled()})
            loader = sys.modules.get("pydantic.plugin._loader")
            _write({"plugins_searched": loader is not None and loader._plugins is not None})
            _write({"frozen_at_first_fetch": gc.get_freeze_count()})
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


sys.meta_path.insert(0, _Who())
atexit.register(lambda: _write({"frozen_at_exit": gc.get_freeze_count()}))
# what was imported, not only looked for (importlib.util.find_spec asks the finders too)
atexit.register(lambda: _write({"modules_at_exit": sorted(m for m in _WATCHED if m in sys.modules)}))
sys.stderr = _Stderr(sys.stderr)
'''


def _run_watched(tmp_path: Path, cfg: Path, watched: tuple[str, ...]) -> list[dict[str, Any]]:
    """``mqd run --burst`` of ``cfg`` with the hook watching ``watched``; what the hook wrote."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)
    out = tmp_path / "imports.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p),
        "STARTUP_IMPORTS_FILE": str(out),
        "STARTUP_IMPORTS_WATCHED": ",".join(watched),
        "STARTUP_MODELS_WATCHED": ",".join((*BROKER_MODELS, "MqdConfig")),
    }
    res = mqd("run", "--config", str(cfg), "--burst", timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    at_first_fetch = [e["first_fetch"] for e in entries if "first_fetch" in e]
    assert len(at_first_fetch) == 1, f"no 'first fetch sent' line seen: {res.stderr[-2000:]}"
    who = {e["imported"]: e["by"] for e in entries if "imported" in e}
    assert at_first_fetch[0] == [], {m: who.get(m) for m in at_first_fetch[0]}
    return entries


def _imported(entries: list[dict[str, Any]]) -> set[str]:
    (at_exit,) = [e["modules_at_exit"] for e in entries if "modules_at_exit" in e]
    return set(at_exit)


def test_first_fetch_is_sent_before_pyarrow_numpy_and_admin_are_imported(
    tmp_path: Path, cluster_factory: Callable[..., Cluster]
) -> None:
    """`mqd run --burst` (admin endpoint on, JSON logs) logs ``first fetch sent`` while none of
    pyarrow, numpy and difflib is in ``sys.modules`` (nor ever the admin endpoint's aiohttp and
    psutil, which only a request to it needs, nor rich, which JSON logs do not, nor
    pyarrow.compute and numpy.ma, nor prometheus_client's HTTP servers, nor delta-rs for the new
    landing table, nor the idna codec for the admin endpoint's address) and none of the broker's
    config models is built, pydantic looked for no plugins, the garbage collector is on again with
    the start-up's objects frozen (gc.freeze: no full collection walks them again; the warm-up's
    are frozen once the landing encoded), imports pyarrow and numpy afterwards, and lands every
    record exactly once: the deferral changes when the cost is paid, not what the daemon does."""
    cluster = cluster_factory(topics={"events": 2})
    cfg = write_config(tmp_path, cluster)
    produce(cluster, 2000)

    never = (
        *ONLY_FOR_STATUS,
        *NOT_FOR_JSON_LOGS,
        *NOT_FOR_LANDING,
        *NOT_FOR_COLUMNS,
        *METRICS_SERVERS,
        *NOT_FOR_A_NEW_TABLE,
        *NOT_FOR_ADDRESSES,
    )
    entries = _run_watched(tmp_path, cfg, (*DEFERRED, *OFF_THE_START_PATH, *never))
    assert_exactly_once(tmp_path, partitions=2, per_partition=1000)
    assert not set(never) & _imported(entries), entries
    (built,) = [e["built"] for e in entries if "built" in e]
    assert built == ["MqdConfig"], built  # the daemon's own model is built: the check sees builds
    # pydantic did not read every installed distribution's entry points for plugins (~10 ms)
    assert [e["plugins_searched"] for e in entries if "plugins_searched" in e] == [False]
    # the collector, paused while start-up imports, runs again
    assert [e["gc_enabled"] for e in entries if "gc_enabled" in e] == [True]
    # and never walks the start-up's objects again, nor, once the landing encoded, the warm-up's
    (at_first_fetch,) = [e["frozen_at_first_fetch"] for e in entries if "frozen_at_first_fetch" in e]
    (at_exit,) = [e["frozen_at_exit"] for e in entries if "frozen_at_exit" in e]
    assert 0 < at_first_fetch < at_exit, (at_first_fetch, at_exit)
    # the hook sees the imports (else the first assertion proves nothing): they came after
    assert set(DEFERRED) <= _imported(entries), entries


def test_the_kafka_source_starts_without_the_mqd_brokers_http_client(tmp_path: Path, tansu: Tansu) -> None:
    """With ``consumer.source = "kafka"`` nothing imports aiohttp or the mqd broker's client
    (mqd.wire.client): the daemon no longer builds that client, its source does (issue 34:
    aiohttp's import alone was ~0.2 CPU-s of the Kafka source's start), and the admin endpoint, on
    here, is built only if something connects to it; nor aiokafka's producer and consumer, which its
    package's own import brought (~50 ms: mqd/sources/kafka/aiokafka_import.py), nor
    prometheus_client's HTTP servers (mqd/package_without_init.py); every record lands."""
    produce_kafka(tansu.bootstrap, [(p, None, b"v%d" % i, []) for p in range(2) for i in range(500)])
    cfg = tmp_path / "mqd.toml"
    cfg.write_text(
        to_toml(
            {
                "consumer": {
                    "source": "kafka",
                    "mode": "broadcast",
                    "bootstrap": [tansu.bootstrap],
                    "topics": ["events"],
                    "consume_from": "first",
                    "offset_file": str(tmp_path / "state" / "offsets.json"),
                },
                "landing": {"dir": str(tmp_path / "landing"), "max_age": 0.3},
                "admin": {"port": 0},
                "log": {"level": "info", "format": "json"},
                "daemon": daemon_section(tmp_path / "state"),
            }
        )
    )
    never = (
        "aiohttp",
        "mqd.operator.admin",
        "mqd.wire.client",
        *AIOKAFKA_CLIENTS,
        *METRICS_SERVERS,
        *NOT_FOR_A_NEW_TABLE,
        *NOT_FOR_ADDRESSES,
    )
    entries = _run_watched(tmp_path, cfg, (*DEFERRED, *never))
    assert {p: len(rows) for p, rows in landed_rows(tmp_path / "landing").items()} == {0: 500, 1: 500}
    assert not set(never) & _imported(entries), entries
    assert set(DEFERRED) <= _imported(entries), entries  # the hook saw imports
