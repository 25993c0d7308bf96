"""aiokafka imported lean in the mqd command (mqd/sources/kafka/aiokafka_import.py): run as a script
named ``mqd`` (what the command is), the Kafka source imports with aiokafka's client, connection and
protocol modules but not its producer or consumer; a name only aiokafka's ``__init__`` defines still
works at its first access (the ``__init__`` then runs, once), and the version the client names
itself with is the package's own. Outside the command, aiokafka imports whole, as it always did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import mqd.sources.kafka.source
import aiokafka.client
lean = sorted(m for m in ("aiokafka.consumer", "aiokafka.producer") if m in sys.modules)
version = aiokafka.__version__
from aiokafka import partitioner  # a submodule not imported yet, by name: no __init__ for it
lean_after_submodule = sorted(m for m in ("aiokafka.consumer", "aiokafka.producer") if m in sys.modules)
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
import aiokafka
print(json.dumps({
    "before": lean,
    "after_submodule": lean_after_submodule,
    "submodule": partitioner.__name__,
    "after": sorted(m for m in ("aiokafka.consumer", "aiokafka.producer") if m in sys.modules),
    "consumer": AIOKafkaConsumer.__module__,
    "same_producer": aiokafka.AIOKafkaProducer is AIOKafkaProducer,
    "version": version,
    "client_id": aiokafka.client.AIOKafkaClient.__init__.__kwdefaults__["client_id"],
}))
"""


def _probe(script: Path) -> dict[str, object]:
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_mqd_command_imports_aiokafka_without_its_producer_and_consumer(tmp_path: Path) -> None:
    import aiokafka

    got = _probe(tmp_path / "mqd")  # sys.argv[0] is "mqd": the command
    assert got["before"] == []
    assert got["after_submodule"] == [] and got["submodule"] == "aiokafka.partitioner"
    assert got["after"] == ["aiokafka.consumer", "aiokafka.producer"]
    assert got["consumer"] == "aiokafka.consumer.consumer"
    assert got["same_producer"] is True
    assert got["version"] == aiokafka.__version__
    assert got["client_id"] == "aiokafka-" + aiokafka.__version__


def test_elsewhere_aiokafka_imports_whole(tmp_path: Path) -> None:
    got = _probe(tmp_path / "app.py")
    assert got["before"] == ["aiokafka.consumer", "aiokafka.producer"]
