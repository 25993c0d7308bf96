"""Kafka admin operations run through Apache Kafka's own Java Admin client
(``org.apache.kafka.clients.admin.Admin``, in the kafka-clients jar of the cached broker classpath)
as small Java programs (need a JDK's compiler). The kafka-tools classes (kafka-reassign-partitions,
kafka-consumer-groups) are not among the broker's jars; these call the same Admin methods:

- :func:`reassign_partition`: ``Admin.alterPartitionReassignments`` (confluent-kafka 2.16 has no
  binding), a single-file program (JEP 330: ``java Program.java``);
- :class:`GroupDescriber`: ``kafka-consumer-groups --describe`` (state, members, committed offsets,
  log ends, lag), compiled once per workdir since a test asks several times."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mqd.testing.kafka_cluster import kafka_classpath

REASSIGN_JAVA = """\
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartition;

public class Reassign {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        List<Integer> replicas = new ArrayList<>();
        for (int i = 3; i < args.length; i++) replicas.add(Integer.parseInt(args[i]));
        TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
        try (Admin admin = Admin.create(props)) {
            admin.alterPartitionReassignments(
                Map.of(tp, Optional.of(new NewPartitionReassignment(replicas)))).all().get();
        }
    }
}
"""


def java_can_run_sources() -> bool:
    """A JDK (javac beside java): a JRE cannot launch a source file."""
    return shutil.which("java") is not None and shutil.which("javac") is not None


def reassign_partition(
    bootstrap: str, topic: str, partition: int, replicas: Sequence[int], workdir: Path, timeout: float = 60.0
) -> None:
    """Start moving ``topic``/``partition`` onto ``replicas`` (the first is the preferred leader).
    Returns once the controller accepted it; the move itself goes on in the cluster."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "Reassign.java"
    source.write_text(REASSIGN_JAVA)
    classpath = ":".join(map(str, kafka_classpath()))
    cmd = ["java", "-cp", classpath, str(source), bootstrap, topic, str(partition), *map(str, replicas)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"reassignment failed ({done.returncode}): {done.stderr[-2000:]}")


DESCRIBE_JAVA = """\
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;

// kafka-consumer-groups --describe --members --offsets, as JSON: the same three Admin calls
public class DescribeGroup {
    static String q(String s) {
        return s == null ? "null" : "\\"" + s.replace("\\\\", "\\\\\\\\").replace("\\"", "\\\\\\"") + "\\"";
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        String group = args[1];
        try (Admin admin = Admin.create(props)) {
            ConsumerGroupDescription d =
                admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
            Map<TopicPartition, OffsetAndMetadata> committed =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            Set<TopicPartition> tps = new HashSet<>(committed.keySet());
            for (MemberDescription m : d.members()) tps.addAll(m.assignment().topicPartitions());
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (TopicPartition tp : tps) latest.put(tp, OffsetSpec.latest());
            Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> ends =
                latest.isEmpty() ? Map.of() : admin.listOffsets(latest).all().get();
            StringBuilder out = new StringBuilder();
            out.append("{\\"group\\": ").append(q(d.groupId()))
               .append(", \\"state\\": ").append(q(d.groupState().toString()))
               .append(", \\"type\\": ").append(q(d.type().toString()))
               .append(", \\"protocol\\": ").append(q(d.partitionAssignor()))
               .append(", \\"coordinator\\": ").append(d.coordinator() == null ? -1 : d.coordinator().id())
               .append(", \\"members\\": [");
            String sep = "";
            for (MemberDescription m : d.members()) {
                out.append(sep).append("{\\"member_id\\": ").append(q(m.consumerId()))
                   .append(", \\"client_id\\": ").append(q(m.clientId()))
                   .append(", \\"host\\": ").append(q(m.host()))
                   .append(", \\"instance_id\\": ").append(q(m.groupInstanceId().orElse(null)))
                   .append(", \\"assignment\\": [");
                String s2 = "";
                for (TopicPartition tp : m.assignment().topicPartitions()) {
                    out.append(s2).append("[").append(q(tp.topic())).append(", ")
                       .append(tp.partition()).append("]");
                    s2 = ", ";
                }
                out.append("]}");
                sep = ", ";
            }
            out.append("], \\"offsets\\": [");
            sep = "";
            for (TopicPartition tp : tps) {
                OffsetAndMetadata c = committed.get(tp);
                long end = ends.get(tp).offset();
                out.append(sep).append("{\\"topic\\": ").append(q(tp.topic()))
                   .append(", \\"partition\\": ").append(tp.partition())
                   .append(", \\"committed\\": ").append(c == null ? "null" : Long.toString(c.offset()))
                   .append(", \\"log_end\\": ").append(end)
                   .append(", \\"lag\\": ").append(c == null ? "null" : Long.toString(end - c.offset()))
                   .append("}");
                sep = ", ";
            }
            out.append("]}");
            System.out.println(out);
        }
    }
}
"""


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    assignment: frozenset[tuple[str, int]]


@dataclass(frozen=True)
class GroupOffset:
    committed: int | None
    log_end: int
    lag: int | None  # log end minus committed, as kafka-consumer-groups computes it


@dataclass(frozen=True)
class GroupDescription:
    """What ``kafka-consumer-groups --describe`` shows of a group (its three Admin calls)."""

    group: str
    state: str  # Kafka's GroupState as it prints: Stable, Empty, PreparingRebalance, ...
    type: str  # CLASSIC or CONSUMER
    protocol: str  # the assignor's name (mqd's "mqd-<strategy>")
    coordinator: int
    members: tuple[GroupMember, ...]
    offsets: dict[tuple[str, int], GroupOffset]  # per (topic, partition): committed or assigned


class GroupDescriber:
    """``describe(group)``: Apache Kafka's own Admin client (kafka-clients of the cached broker
    classpath) run as a small Java program, compiled once into ``workdir``, doing what
    kafka-consumer-groups' ``--describe`` does: describeConsumerGroups (state, members with client id,
    host, instance id and assignment), listConsumerGroupOffsets (committed offsets) and
    listOffsets(latest) (log ends; read_uncommitted, the tool's default); lag = log end - committed."""

    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self._classpath = ":".join(map(str, kafka_classpath()))

    def _compiled(self, timeout: float) -> Path:
        classes = self.workdir / "classes"
        if not (classes / "DescribeGroup.class").is_file():
            classes.mkdir(parents=True, exist_ok=True)
            source = self.workdir / "DescribeGroup.java"
            source.write_text(DESCRIBE_JAVA)
            cmd = ["javac", "-nowarn", "-cp", self._classpath, "-d", str(classes), str(source)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"javac DescribeGroup failed ({done.returncode}): {done.stderr[-2000:]}")
        return classes

    def describe(self, group: str, timeout: float = 60.0) -> GroupDescription:
        classes = self._compiled(timeout)
        cmd = [
            "java",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            "-cp",
            f"{classes}:{self._classpath}",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dlog4j2.level=WARN",
            "DescribeGroup",
            self.bootstrap,
            group,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith('{"group"')), None)
        if done.returncode != 0 or line is None:
            raise RuntimeError(f"describe {group} failed ({done.returncode}): {done.stderr[-2000:]}")
        raw = json.loads(line)
        return GroupDescription(
            group=raw["group"],
            state=raw["state"],
            type=raw["type"],
            protocol=raw["protocol"],
            coordinator=raw["coordinator"],
            members=tuple(
                GroupMember(
                    m["member_id"],
                    m["client_id"],
                    m["host"],
                    m["instance_id"],
                    frozenset((t, p) for t, p in m["assignment"]),
                )
                for m in raw["members"]
            ),
            offsets={
                (o["topic"], o["partition"]): GroupOffset(o["committed"], o["log_end"], o["lag"])
                for o in raw["offsets"]
            },
        )
