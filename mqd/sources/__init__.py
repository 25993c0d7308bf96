"""Sources: implementations of the consumer engine's source seam (mqd.consumer.source.Source)."""
