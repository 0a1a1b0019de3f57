"""``glasspipe run FILE``: the same job in local Spark, for development and the README demo.

The job plugs this command into the ``glasspipe`` CLI through the ``glasspipe.commands`` entry points
(pyproject.toml), so that the operator's CLI never imports the job: the job depends on the operator's API, not
the other way round. Only running it needs pyspark (the ``spark`` extra)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from glasspipe.api.validation import SpecInvalid


def apply_overrides(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    spec = doc["spec"]
    if args.bootstrap_servers:
        for s in spec["sources"]:
            s["kafka"]["bootstrapServers"] = args.bootstrap_servers
        if spec.get("deadLetter", {}).get("bootstrapServers"):
            spec["deadLetter"]["bootstrapServers"] = args.bootstrap_servers
    if args.clickhouse:
        spec["sink"]["clickhouse"]["hosts"] = [args.clickhouse]
    if args.checkpoint:
        spec["checkpoint"]["location"] = Path(args.checkpoint).resolve().as_uri()
    return doc


def stop_on_ctrl_c(stop: threading.Event) -> None:
    """The first Ctrl-C stops between micro-batches, as SIGTERM does; a second one stops at once."""
    if stop.is_set():
        raise KeyboardInterrupt
    stop.set()
    print("glasspipe run: stopping after the micro-batch in flight (Ctrl-C again to stop now)", file=sys.stderr,
          flush=True)


def add_run_command(commands: Any) -> None:
    """The ``run`` subcommand and its options, added to the CLI's subparsers (an ``argparse`` subparsers action)."""
    p = commands.add_parser("run", help="run a pipeline in local Spark (development)")
    p.add_argument("file")
    p.add_argument("--bootstrap-servers", help="override every Kafka bootstrapServers")
    p.add_argument("--clickhouse", help="override sink hosts with host:port")
    p.add_argument("--checkpoint", help="override checkpoint.location with a local folder")
    p.add_argument("--replica", type=int, default=0)
    p.add_argument("--replicas", type=int, help="override spec.replicas")
    p.add_argument("--available-now", action="store_true", help="process what is in the topics, then stop")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: none)")
    p.add_argument("--secrets-dir", help="folder with the Secrets the spec references, as DIR/<secret>/<key> files "
                   "(what a pod gets from the kubelet); see docs/security.md")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """``glasspipe run``: the exit code; one line, not a traceback, when pyspark is missing or on a second Ctrl-C."""
    try:
        return run_local(args)
    except ImportError as e:
        print(f"glasspipe run needs the Spark extra: pip install 'glasspipe[spark]' ({e})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops between micro-batches)
        print("glasspipe run: stopped at once; the next run writes the micro-batch in flight again, exactly once",
              file=sys.stderr)
        return 130


def run_local(args: argparse.Namespace) -> int:
    from glasspipe_job.config import UnsupportedPipeline, config_from_resource, load_job_config
    from glasspipe_job.connections import check_connections
    from glasspipe_job.failure import report_exception
    from glasspipe_job.replica_loop import run_pipeline
    from glasspipe_job.session import local_session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        doc = apply_overrides(yaml.safe_load(Path(args.file).read_text()), args)
        config = load_job_config(config_from_resource(doc, args.replica, args.replicas))
    except SpecInvalid as e:
        print(f"{args.file}: invalid: {e}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        print(f"{args.file}: cannot read a GlassPipeline from it: {e}", file=sys.stderr)
        return 2
    if getattr(args, "secrets_dir", None):
        from glasspipe_job.local_secrets import LocalSecretMissing, load_local_secrets

        try:
            load_local_secrets(config.spec, Path(args.secrets_dir))
        except LocalSecretMissing as e:
            print(f"{args.file}: {e}", file=sys.stderr)
            return 2
    try:
        check_connections(config)  # a wrong Secret says so in seconds, before the JVM starts
        spark = local_session(f"glasspipe-{config.pipeline}-{config.replica}", config.spark_conf)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a clean stop between micro-batches
        signal.signal(signal.SIGINT, lambda *_: stop_on_ctrl_c(stop))
        metrics = run_pipeline(spark, config, available_now=args.available_now, metrics_port=args.metrics_port,
                               stop=stop)
    except Exception as e:  # one line, without secrets, as a driver pod reports it
        report_exception(e, config.secret_values())
        return 2 if isinstance(e, UnsupportedPipeline) else 1
    from glasspipe_job.metrics import drain_listener_events

    drain_listener_events(spark)
    t = metrics.totals
    print(f"glasspipe run: {t.batches} batches; records in {t.records_in}, filtered {t.filtered}, "
          f"duplicates dropped {t.duplicates}, late dropped {t.late}, dead-lettered {t.dead_lettered} "
          f"{dict(sorted(t.per_reason.items()))}, rows written {t.rows_written}, warm-up rows {t.warmup}, "
          f"keys in two partitions {t.keys_in_two_partitions}")
    return 0
