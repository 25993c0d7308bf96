"""``kafka-consumer-groups --describe`` and ``mqd status`` agree about an mqd daemon's consumer group
on real Apache Kafka (issue 28): the same partitions, committed offsets, log ends and lag.

The daemon is ``mqd start`` (its own process, cluster mode, Kafka's group protocol, a static
member); ``mqd status --json`` is the CLI reading its admin endpoint. The describe is Apache Kafka's
own Java Admin client doing what the tool does (tests/support/kafka_admin.py: describeConsumerGroups,
listConsumerGroupOffsets, listOffsets latest; lag = log end - committed): the kafka-tools jar is not
among the broker's jars, and aiokafka's admin would be a second client implementation checking the
first.

Apache Kafka only: Tansu's describe is wrong, as issue 28 found (negative lag). Measured with the
same Java describe on Tansu 0.6, a librdkafka consumer having committed 20 on two partitions of 20
records each: log end 1 and lag -19 per partition (Tansu answers ListOffsets "latest" with the last
batch's base offset + 1, not the log end; the Kafka source confirms log ends with a Fetch for that
reason, ``KafkaSource._confirm_ends``), no members listed for a Stable group, type Consumer for a
classic group, and a member id where the assignor's name belongs."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import mqd
from support.consumer import FAST
from support.kafka import Produced, landed_rows, produce
from support.kafka_admin import GroupDescriber, GroupDescription, java_can_run_sources
from support.servers import serving

from mqd.testing.configfiles import to_toml
from mqd.testing.kafka_cluster import KafkaCluster
from mqd.waiting import wait_until_sync

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.skipif(
    not java_can_run_sources(), reason="needs a JDK (java and javac) for Kafka's Admin"
)

TOPIC = "described"
GROUP = "landing-described"
CLIENT_ID = "mqd-describe"
INSTANCE = "describe-a"
PARTITIONS = 4
BACKLOG = {p: 10 * (p + 1) for p in range(PARTITIONS)}  # 10, 20, 30, 40


@pytest.fixture(scope="module")
def kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One Apache Kafka broker for the module; its log is printed when a test failed."""
    with serving(request, KafkaCluster(tmp_path_factory.mktemp("kafka"))) as cluster:
        yield cluster


def write_config(tmp_path: Path, kafka: KafkaCluster) -> Path:
    """The daemon's config file: Kafka source, cluster mode with a static member, landing files cut
    0.3 s after their first record, log ends polled every 0.3 s, admin endpoint on a free port."""
    data: dict[str, Any] = {
        "consumer": {
            **FAST,
            "source": "kafka",
            "bootstrap": [kafka.bootstrap],
            "topics": [TOPIC],
            "mode": "cluster",
            "group": GROUP,
            "client_id": CLIENT_ID,
            "consume_from": "first",
            "log_end_interval": 0.3,
        },
        "consumer.kafka": {"group_instance_id": INSTANCE, "static_membership": True},
        "landing": {"dir": str(tmp_path / "landing"), "max_age": 0.3},
        "admin": {"port": 0},
        "log": {"level": "info", "format": "json"},
        "daemon": {
            "state_dir": str(tmp_path / "state"),
            "pid_file": str(tmp_path / "state" / "mqd.pid"),
            "log_file": str(tmp_path / "state" / "mqd.log"),
            "shutdown_timeout": 10.0,
        },
    }
    path = tmp_path / "mqd.toml"
    path.write_text(to_toml(data))
    return path


def start(cfg: Path) -> int:
    res = mqd("start", "-c", str(cfg))
    log = cfg.parent / "state" / "mqd.log"
    assert res.returncode == 0, res.stderr + (log.read_text() if log.exists() else "")
    return int((cfg.parent / "state" / "mqd.pid").read_text())


def stop(cfg: Path, pid: int) -> None:
    if mqd("stop", "-c", str(cfg)).returncode != 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def admin_status(cfg: Path) -> dict[str, Any]:
    """GET /status of the running daemon (what ``mqd status --json`` prints); {} while it does not
    answer. Polled in waits: cheaper than a CLI process per poll."""
    try:
        info = json.loads((cfg.parent / "state" / "admin.json").read_text())
        with urllib.request.urlopen(f"{info['url']}/status", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except (OSError, ValueError, KeyError):
        return {}


def partitions(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The status's assignment entries by partition."""
    entries = status.get("consumer", {}).get("assignment", {}).values()
    return {e["partition"]: e for e in entries if e["topic"] == TOPIC}


def cli_status(cfg: Path, exit_codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """``mqd status -c <cfg> --json`` as a user runs it (exit 0: healthy; 4: a partition stuck)."""
    res = mqd("status", "-c", str(cfg), "--json")
    assert res.returncode in exit_codes, res.stdout + res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def settled(cfg: Path, ends: dict[int, int], landed: dict[int, int]) -> bool:
    """Every partition owned, its log end polled at ``ends[p]``, landed and committed at
    ``landed[p]`` (the commit follows the landing within commit_interval)."""
    parts = partitions(admin_status(cfg))
    return sorted(parts) == list(range(PARTITIONS)) and all(
        (e["log_end"], e["landed"], e["committed"]) == (ends[p], landed[p], landed[p])
        for p, e in parts.items()
    )


def assert_agree(described: GroupDescription, status: dict[str, Any], lag: dict[int, int]) -> None:
    """The describe's offsets and mqd status's assignment name the same partitions with the same
    committed offset (= what landed), log end and lag, and the lag is ``lag``."""
    parts = partitions(status)
    assert (
        sorted(described.offsets)
        == [(TOPIC, p) for p in range(PARTITIONS)]
        == [(TOPIC, p) for p in sorted(parts)]
    )
    for p, e in parts.items():
        d = described.offsets[TOPIC, p]
        assert (d.committed, d.log_end, d.lag) == (e["committed"], e["log_end"], e["lag"]), (p, d, e)
        assert e["landed"] == e["committed"] and d.lag == lag[p], (p, d, e)


def assert_member(described: GroupDescription, status: dict[str, Any]) -> None:
    """The daemon is the group's one member, owning every partition: its client id, host and
    instance id as the describe shows them are those of mqd status's consumer."""
    consumer = status["consumer"]
    assert described.state == "Stable" and described.type == "Classic", described
    assert described.protocol == f"mqd-{consumer['allocation']}" and consumer["group"] == GROUP
    (member,) = described.members
    assert member.client_id == consumer["member_id"] == CLIENT_ID
    assert member.instance_id == INSTANCE and consumer["members"] == [INSTANCE]
    assert member.host == "/127.0.0.1" and member.member_id.startswith(INSTANCE)
    assert (
        member.assignment
        == {(TOPIC, p) for p in partitions(status)}
        == {(TOPIC, p) for p in range(PARTITIONS)}
    )
    assert str(described.coordinator) == consumer["coordinator"]


def test_describe_and_mqd_status_agree_on_the_group_its_offsets_and_lag(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    """A backlog of 10/20/30/40 records on 4 partitions lands and is committed: the describe shows
    the group Stable with the daemon (client id, host, instance id) owning all 4, committed offsets
    equal to what the Parquet files hold, lag 0, and ``mqd status --json`` shows the same partitions,
    committed = landed offsets, log ends and lag. Partitions 1 and 3 paused and 7 and 5 records
    produced to them (4 to the running partition 0): both show lag 7 and 5 there, 0 elsewhere. The
    daemon stopped and 3 more records produced to partition 0: the describe's lag is exactly the
    produced-but-unlanded count (3, 7, 0, 5) and ``mqd status`` says not running (exit 3). Started
    again it lands everything once; both show lag 0 again."""
    kafka.create_topic(TOPIC, PARTITIONS)
    backlog: list[Produced] = [
        (p, None, b"%d-%d" % (p, i), []) for p in range(PARTITIONS) for i in range(BACKLOG[p])
    ]
    produce(kafka.bootstrap, backlog, topic=TOPIC)
    ends = dict(BACKLOG)
    describer = GroupDescriber(kafka.bootstrap, tmp_path / "java")
    cfg = write_config(tmp_path, kafka)
    pid = start(cfg)
    try:
        wait_until_sync(lambda: settled(cfg, ends, ends), 30, "the backlog landed and committed")
        described = describer.describe(GROUP)
        status = cli_status(cfg)
        assert_member(described, status)
        assert_agree(described, status, {p: 0 for p in range(PARTITIONS)})
        landed = landed_rows(tmp_path / "landing")
        assert {p: len(landed[p]) for p in range(PARTITIONS)} == {
            p: o.committed for (_t, p), o in described.offsets.items()
        }

        # lag > 0 while it runs: two partitions paused, records produced to them
        res = mqd("pause", "-c", str(cfg), f"{TOPIC}:1", f"{TOPIC}:3")
        assert res.returncode == 0, res.stdout + res.stderr
        more: list[Produced] = [(1, None, b"1-more-%d" % i, []) for i in range(7)]
        more += [(3, None, b"3-more-%d" % i, []) for i in range(5)]
        more += [(0, None, b"0-more-%d" % i, []) for i in range(4)]
        produce(kafka.bootstrap, more, topic=TOPIC)
        landed_at = dict(ends)
        ends = {0: ends[0] + 4, 1: ends[1] + 7, 2: ends[2], 3: ends[3] + 5}
        landed_at[0] = ends[0]
        wait_until_sync(
            lambda: settled(cfg, ends, landed_at), 30, "partition 0 landed, 1 and 3 paused with lag"
        )
        described = describer.describe(GROUP)
        # a paused partition is "stuck" (exit 4) when its log end grew over stuck_intervals polls
        # without landing: whether it did depends on how the produce fell between the polls
        status = cli_status(cfg, (0, 4))
        assert set(status["consumer"]["totals"]["stuck"]) <= {f"{TOPIC}/1", f"{TOPIC}/3"}, status
        assert_member(described, status)
        assert_agree(described, status, {0: 0, 1: 7, 2: 0, 3: 5})
        assert [e["paused"] for _p, e in sorted(partitions(status).items())] == [False, True, False, True]
    finally:
        stop(cfg, pid)

    # lag > 0 while it is stopped: the committed offsets stay, the log ends move on
    produce(kafka.bootstrap, [(0, None, b"0-stopped-%d" % i, []) for i in range(3)], topic=TOPIC)
    ends[0] += 3
    described = describer.describe(GROUP)
    assert {p: (o.committed, o.log_end, o.lag) for (_t, p), o in described.offsets.items()} == {
        0: (ends[0] - 3, ends[0], 3),
        1: (ends[1] - 7, ends[1], 7),
        2: (ends[2], ends[2], 0),
        3: (ends[3] - 5, ends[3], 5),
    }
    assert mqd("status", "-c", str(cfg)).returncode == 3  # not running

    pid = start(cfg)
    try:
        wait_until_sync(lambda: settled(cfg, ends, ends), 30, "everything landed after the restart")
        described = describer.describe(GROUP)
        status = cli_status(cfg)
        assert_member(described, status)
        assert_agree(described, status, {p: 0 for p in range(PARTITIONS)})
    finally:
        stop(cfg, pid)
    landed = landed_rows(tmp_path / "landing")
    for p in range(PARTITIONS):
        assert sorted(o for o, *_ in landed[p]) == list(range(ends[p])), f"partition {p}: lost or duplicated"
