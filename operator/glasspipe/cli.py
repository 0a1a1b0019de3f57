"""``glasspipe``: validate and render GlassPipelines offline, print the CRD, run a pipeline locally."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

from glasspipe.api.crd import render_crd_reference, render_crd_yaml
from glasspipe.api.validation import SpecInvalid, validate_resource
from glasspipe.contract import DEFAULT_SPARK_IMAGE
from glasspipe.render import render_spark_applications

# Entry points of this group add a subcommand: each is a function given the CLI's subparsers (pyproject.toml).
COMMANDS_GROUP = "glasspipe.commands"


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


def add_plugged_commands(commands: Any) -> None:
    """The commands other packages plug in (entry points of group ``glasspipe.commands``): ``run`` comes from the
    job (glasspipe_job.local), which the operator never imports. One that cannot load still appears, and says why
    in one line when run, instead of the whole CLI failing."""
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            entry.load()(commands)
        except Exception as e:  # a broken plug-in must not take validate/render/crd with it
            p = commands.add_parser(entry.name, help=f"unavailable here: {e}")
            p.add_argument("args", nargs=argparse.REMAINDER)  # whatever was given: the one line says why
            p.set_defaults(func=_unavailable(entry.name, e))


def _unavailable(name: str, error: Exception) -> Callable[[argparse.Namespace], int]:
    def cmd(_: argparse.Namespace) -> int:
        print(f"glasspipe {name} is unavailable here: {error}", file=sys.stderr)
        return 2
    return cmd


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
    add_plugged_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
