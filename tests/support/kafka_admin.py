"""Kafka admin operations confluent-kafka 2.16 lacks, run through Apache Kafka's own Java Admin client
(``org.apache.kafka.clients.admin.Admin``, in the kafka-clients jar of the cached broker classpath)
as a single-file Java program (JEP 330: ``java Program.java``, needs a JDK's compiler). The
kafka-reassign-partitions tool's class (kafka-tools) is not among the broker's jars; it calls the
same ``Admin.alterPartitionReassignments``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
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
