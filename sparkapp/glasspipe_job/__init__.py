"""The PySpark Structured Streaming job that a GlassPipeline SparkApplication runs."""
