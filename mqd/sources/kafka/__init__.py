"""Kafka-protocol clusters (Apache Kafka, Redpanda, Tansu) as a consumer source: aiokafka's client for
connections, version negotiation, metadata, TLS and SASL; mqd's own node-grouped fetch, RecordBatch v2
decoding (record_batch, records_kernel) and offset lookups."""
