"""``glasspipe-operator``: run the kopf operator with a liveness endpoint and Prometheus metrics."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glasspipe-operator", description=__doc__)
    p.add_argument("-n", "--namespace", action="append", default=[],
                   help="namespace to serve (repeatable); default: all namespaces")
    p.add_argument("--peering", default=os.environ.get("GLASSPIPE_PEERING", ""),
                   help="kopf peering object name for leader election among replicas; default: standalone")
    p.add_argument("--bind-address", default=os.environ.get("GLASSPIPE_BIND_ADDRESS", "0.0.0.0"),
                   help="address of the liveness and metrics endpoints")
    p.add_argument("--liveness-port", type=int, default=int(os.environ.get("GLASSPIPE_LIVENESS_PORT", "8081")),
                   help="port of GET /healthz (0: off)")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("GLASSPIPE_METRICS_PORT", "8080")),
                   help="port of the Prometheus /metrics endpoint (0: off)")
    p.add_argument("--reconcile-interval", type=float, default=None,
                   help="seconds between periodic reconciliations of each pipeline (default 10)")
    p.add_argument("--freshness-interval", type=float, default=None,
                   help="seconds between reads of each pipeline's driver metrics into its status (default 30; "
                        "0: off)")
    p.add_argument("--spark-image", default=None,
                   help="Spark image of pipelines whose spec.spark.image is not set (default glasspipe/spark:0.1.0)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reconcile_interval is not None:
        # Read by the handlers module when it registers the timer, so set it before the import below.
        os.environ["GLASSPIPE_RECONCILE_INTERVAL"] = str(args.reconcile_interval)
    if args.spark_image:
        os.environ["GLASSPIPE_SPARK_IMAGE"] = args.spark_image
    if args.freshness_interval is not None:
        os.environ["GLASSPIPE_FRESHNESS_INTERVAL"] = str(args.freshness_interval)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiohttp.access", "kubernetes.client.rest", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.verbose:
        # kopf logs every timer run and handler success per object at INFO: keep only problems.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    import kopf
    from prometheus_client import start_http_server

    import glasspipe.controller.handlers  # noqa: F401 - registers the handlers

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
    liveness = f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None
    kopf.run(
        standalone=not args.peering,
        peering_name=args.peering or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
