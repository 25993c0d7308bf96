"""The mqd broker's wire: the record batch (disk, wire, Arrow), the request and answer shapes, the
HTTP client with its fetch connections, the parsed cluster metadata, and the producer.

The broker serves it, and the mqd broker source (mqd/sources/mqd_broker/), the producer and
``mqd produce`` speak it; the Kafka source uses none of it. Nothing is imported here: each module
is imported by its own name (``mqd.wire.format`` loads pyarrow, ``mqd.wire.client`` aiohttp).
"""
