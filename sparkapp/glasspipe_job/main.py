"""Entry point of the SparkApplication (``mainApplicationFile``): run one replica until stopped."""

from __future__ import annotations

import argparse
import logging
import sys

from pyspark.sql import SparkSession

from glasspipe.api.validation import SpecInvalid
from glasspipe_job.config import load_job_config
from glasspipe_job.runner import UnsupportedPipeline, session_conf, start_pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glasspipe-job")
    parser.add_argument("--config-json", required=True, help="rendered by the operator (glasspipe.render)")
    parser.add_argument("--metrics-port", type=int, default=9108)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_job_config(args.config_json)
    except SpecInvalid as e:
        print(f"glasspipe: invalid pipeline spec: {e}", file=sys.stderr)
        return 2
    builder = SparkSession.builder.appName(f"glasspipe-{config.pipeline}-{config.replica}")
    for k, v in session_conf(config).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    try:
        running = start_pipeline(spark, config, metrics_port=args.metrics_port)
    except UnsupportedPipeline as e:
        print(f"glasspipe: {e}", file=sys.stderr)
        return 2
    try:
        running.query.awaitTermination()
    finally:
        running.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
