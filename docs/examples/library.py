"""Read a topic with mqd as a library: a consumer group of its own, explicit marks, quiet logs.

Against the README tour's broker: ``python docs/examples/library.py http://127.0.0.1:9400 events 1000``
reads 1000 records, commits what it read and prints one line. mqd logs nothing unless the application
configures logging (``logging.basicConfig(level=logging.INFO)``, or ``mqd.log.configure()``).
"""

import asyncio
import sys

from mqd.config import ConsumerConfig
from mqd.consumer import Consumer
from mqd.sources import open_source


async def read(bootstrap: str, topic: str, want: int) -> int:
    # A group of its own: the daemon's group ("mqd") would take partitions from a running daemon.
    config = ConsumerConfig(bootstrap=[bootstrap], topics=[topic], group="my-reader", consume_from="first")
    seen = 0
    # the source config.source names (the mqd broker here; "kafka" for a Kafka cluster).
    # auto_mark stays off: mark a batch once it is processed, so a crash re-reads instead of losing it
    async with Consumer(config, source=open_source(config)) as consumer:
        while seen < want:
            await consumer.wait_for_data(1.0)
            for batch in consumer.fetched_batches():  # pyarrow RecordBatches, zero-copy
                seen += batch.records.num_rows  # columns: offset, timestamp, key, value, headers
                consumer.mark_consumed(batch.tp, batch.next_offset)
        await consumer.commit()  # also every commit_interval, and on stop
    return seen


if __name__ == "__main__":
    bootstrap, topic, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(f"read {asyncio.run(read(bootstrap, topic, want))} records from {topic}")
