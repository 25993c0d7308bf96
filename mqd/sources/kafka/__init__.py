"""Kafka-protocol clusters (Apache Kafka, Redpanda, Tansu) as a consumer source: aiokafka's client for
connections, version negotiation, metadata, TLS and SASL; mqd's own node-grouped fetch, RecordBatch v2
decoding (record_batch, records_kernel) and offset lookups."""

from mqd.sources.kafka.aiokafka_import import register_lean

register_lean()  # before any module here imports aiokafka (aiokafka_import.py)
