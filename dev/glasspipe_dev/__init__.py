"""Local real servers (Kafka, ClickHouse, Spark, Kubernetes API) for development and tests.

Installed by the scripts in ``dev/install``; started here on free loopback ports with data in
temporary folders. Nothing in this package is shipped in the operator image.
"""
