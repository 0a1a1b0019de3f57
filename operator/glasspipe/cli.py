"""``glasspipe``: validate and render GlassPipelines offline, print the CRD, run a pipeline locally."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from glasspipe.api.crd import render_crd_reference, render_crd_yaml
from glasspipe.api.validation import SpecInvalid, validate_resource
from glasspipe.contract import DEFAULT_SPARK_IMAGE
from glasspipe.render import render_spark_applications


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: what a person reads and kubectl applies."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _load_documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise SpecInvalid([]) from e
    return docs


def _report(path: str, err: SpecInvalid) -> None:
    print(f"{path}: invalid", file=sys.stderr)
    for problem in err.problems:
        print(f"  - {problem}", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            docs = _load_documents(path)
        except (OSError, SpecInvalid) as e:
            print(f"{path}: cannot read: {e.__cause__ or e}", file=sys.stderr)
            status = 1
            continue
        for doc in docs:
            name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc, dict) else "?"
            try:
                validate_resource(doc if isinstance(doc, dict) else {})
            except SpecInvalid as e:
                _report(f"{path} ({name})", e)
                status = 1
            else:
                print(f"{path} ({name}): valid")
    return status


def _with_defaults(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return meta.get("namespace", "default"), meta["name"], meta.get("uid", "00000000-0000-0000-0000-000000000000")


def cmd_render(args: argparse.Namespace) -> int:
    try:
        docs = _load_documents(args.file)
    except (OSError, SpecInvalid) as e:
        print(f"{args.file}: cannot read: {e.__cause__ or e}", file=sys.stderr)
        return 1
    out = []
    for doc in docs:
        try:
            spec, _ = validate_resource(doc)
        except SpecInvalid as e:
            _report(args.file, e)
            return 1
        namespace, name, uid = _with_defaults(doc)
        out.extend(render_spark_applications(args.namespace or namespace, name, uid, spec, args.spark_image))
    sys.stdout.write(yaml.dump_all(out, Dumper=_PlainDumper, sort_keys=False, width=120))
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(render_crd_reference() if args.reference else render_crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        from glasspipe_job.local import run_local  # imports pyspark: only this command needs it
    except ImportError as e:
        print(f"glasspipe run needs the Spark extra: pip install 'glasspipe[spark]' ({e})", file=sys.stderr)
        return 2
    try:
        return run_local(args)
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops between micro-batches)
        print("glasspipe run: stopped at once; the next run writes the micro-batch in flight again, exactly once",
              file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glasspipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check GlassPipeline files as the operator would")
    p.add_argument("files", nargs="+", help="YAML files ('-' for stdin)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("render", help="print the SparkApplications the operator would create")
    p.add_argument("file")
    p.add_argument("--namespace", help="namespace to render into (default: metadata.namespace or 'default')")
    p.add_argument("--spark-image", default=DEFAULT_SPARK_IMAGE,
                   help="the operator's --spark-image: the image of pipelines that name none (default %(default)s)")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("crd", help="print the GlassPipeline CustomResourceDefinition")
    p.add_argument("--reference", action="store_true", help="print the Markdown field reference instead")
    p.set_defaults(func=cmd_crd)
    p = sub.add_parser("run", help="run a pipeline in local Spark (development)")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
