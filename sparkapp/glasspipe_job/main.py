"""Entry point of the SparkApplication (``mainApplicationFile``): run one replica until stopped."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from pyspark.sql import SparkSession

from glasspipe.api.validation import SpecInvalid
from glasspipe.contract import CONFIG_ARGUMENT, JOB_METRICS_PORT
from glasspipe_job.config import JobConfig, UnsupportedPipeline, load_job_config
from glasspipe_job.connections import check_connections
from glasspipe_job.failure import report, report_exception
from glasspipe_job.replica_loop import run_pipeline
from glasspipe_job.session import local_session, spark_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glasspipe-job")
    parser.add_argument(CONFIG_ARGUMENT, dest="config_json", required=True,
                        help="the job config the operator renders (glasspipe.contract)")
    parser.add_argument("--metrics-port", type=int, default=JOB_METRICS_PORT)
    parser.add_argument("--local", action="store_true",
                        help="local Spark with the cached connector + JVM ops jars (e2e/spark_operator_standin.py)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_job_config(args.config_json)
    except SpecInvalid as e:
        report(f"invalid pipeline spec: {e}", ())
        return 2
    try:
        check_connections(config)  # a wrong Secret says so here, before a JVM starts or anything is read
        spark = _session(config, args.local)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # driver pod deleted: stop between micro-batches
        run_pipeline(spark, config, metrics_port=args.metrics_port, stop=stop)
    except Exception as e:  # whatever stops the replica: one line, without secrets, where Kubernetes shows it
        report_exception(e, config.secret_values())
        return 2 if isinstance(e, UnsupportedPipeline) else 1
    return 0


def _session(config: JobConfig, local: bool) -> SparkSession:
    app_name = f"glasspipe-{config.pipeline}-{config.replica}"
    if local:
        return local_session(app_name, config.spark_conf)
    return spark_session(app_name, config.spark_conf)


if __name__ == "__main__":
    sys.exit(main())
