"""glasspipe: Kafka -> ClickHouse pipelines with dedup and temporal joins, run on Spark by a Kubernetes operator."""
