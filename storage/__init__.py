"""runnel's segment log engine: Kafka's on-disk partition format (see docs/storage.md)."""
