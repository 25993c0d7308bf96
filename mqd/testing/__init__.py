"""mqd.testing: real mqd brokers for your own tests (supported API).

Like ``aiohttp.test_utils`` or Kafka's embedded cluster: :class:`LocalCluster` starts a broker
cluster of real ``mqd broker`` processes on free 127.0.0.1 ports, with its config files, data and
logs in a directory you give it, and stops them again. Point a :class:`mqd.wire.producer.Producer`, a
consumer or an ``mqd run`` daemon at ``cluster.bootstrap`` (or ``cluster.urls``)::

    import asyncio
    import tempfile
    from pathlib import Path

    from mqd.wire.producer import Producer
    from mqd.testing import LocalCluster


    async def produce(bootstrap: str) -> int:
        async with Producer(bootstrap) as producer:
            result = await producer.send_batch("events", 0, [b"a", b"b", b"c"])
        return result.count


    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), topics={"events": 2}) as cluster:
        assert asyncio.run(produce(cluster.bootstrap)) == 3

In a pytest suite, make a fixture of it (``tmp_path`` as the root, ``cluster.stop()`` at teardown,
``cluster.dump_logs()`` to print the node logs when a test failed). Nodes can be stopped, killed,
frozen (SIGSTOP) and restarted to test failover: see :class:`LocalCluster`.

:class:`KafkaCluster` does the same with real Apache Kafka brokers (KRaft mode, jars from Maven
Central, see :mod:`mqd.testing.kafka_cluster`), for code that reads a Kafka-protocol cluster.
:class:`SchemaRegistry` starts a real schema registry speaking Confluent's API (Apicurio Registry,
assembled by Maven from Maven Central once into mqd's cache, see :mod:`mqd.testing.schema_registry`)
for typed records.

The pieces underneath are public too: :class:`ManagedProcess` (one child process with its log:
start, wait until ready, signal, stop with a SIGKILL deadline; sync and async) and the config file
writers in :mod:`mqd.testing.configfiles`.

:class:`HostRig` runs the whole production shape on one Linux machine, each part on a network host
of its own (a network namespace on a shared bridge, :class:`HostNetwork`): three Apache Kafka
brokers, three ``mqd run`` daemons in one group, SeaweedFS for S3, a Spark master and workers; it
cuts, delays, freezes and kills by host (root needed: :func:`missing_requirements` says what is
missing, so a suite can skip with the reason). See :mod:`mqd.testing.hosts`.
"""

from mqd.testing.cluster import (
    DEFAULT_NODE_SETTINGS,
    LocalCluster,
    NodeProcess,
    broker_argv,
    free_port,
    get_json,
    group_names,
)
from mqd.testing.configfiles import (
    NodeAddress,
    cluster_toml,
    daemon_section,
    fast_consumer_timings,
    merge_settings,
    node_toml,
    replica_credentials,
    to_toml,
)
from mqd.testing.hosts import HostRig
from mqd.testing.hosts_net import HostNetwork, NetHost, missing_requirements
from mqd.testing.kafka_cluster import KAFKA_VERSION, KafkaCluster, KafkaSecurity
from mqd.testing.process import START_TIMEOUT, STOP_TIMEOUT, ManagedProcess, ProcessError
from mqd.testing.schema_registry import SchemaRegistry

__all__ = [
    "DEFAULT_NODE_SETTINGS",
    "KAFKA_VERSION",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "HostNetwork",
    "HostRig",
    "KafkaCluster",
    "KafkaSecurity",
    "LocalCluster",
    "ManagedProcess",
    "NetHost",
    "NodeAddress",
    "NodeProcess",
    "ProcessError",
    "SchemaRegistry",
    "broker_argv",
    "cluster_toml",
    "daemon_section",
    "fast_consumer_timings",
    "free_port",
    "get_json",
    "group_names",
    "merge_settings",
    "missing_requirements",
    "node_toml",
    "replica_credentials",
    "to_toml",
]
