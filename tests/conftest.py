"""Fixtures that start real servers, shared by all tests (each starts on first use, once per run)."""

pytest_plugins = ["fixtures_kafka", "fixtures_clickhouse", "fixtures_kube", "fixtures_jvm_ops", "fixtures_images",
                  "fixtures_security", "fixtures_cluster"]
