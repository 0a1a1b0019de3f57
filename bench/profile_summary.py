"""Where a profiled `glasspipe run` spent its time: py-spy's collapsed stacks (driver Python, wall time,
idle included) and Java Flight Recorder execution samples (JVM, on-CPU), each grouped into the job's
phases. Prints seconds (py-spy) or samples and shares (JFR) per phase; files come from bench/bulk.py.
A join's recording (``jcmd <driver pid> JFR.start settings=profile`` during bench/join_state.py) goes to
--join-jfr, which groups its task samples by part of the join's plan.

    python bench/profile_summary.py --pyspy /tmp/prof/bulk-this-123.txt --jfr /tmp/jfr/hotspot-pid-1.jfr
    python bench/profile_summary.py --join-jfr /tmp/jfr/join.jfr
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
from pathlib import Path

# (phase, any of these substrings in a frame): for JFR the innermost frame that any phase marks decides (jfr_phase);
# for py-spy, the first phase that marks any of the stack's frames.
PYSPY_PHASES = [
    ("Spark start-up (JVM launch, session)", ("spark_session", "launch_gateway")),
    ("stream set-up (plan, hand-over, checkpoint)", ("start_pipeline", "prepare_handover", "output_stream")),
    ("batch: Spark computes and collects it (toArrow)", ("batch_writer.py:88", "batch_writer.py:89",
                                                         "batch_writer.py:90", "toArrow")),
    ("batch: offset log read", ("offset_log", "CheckpointFiles")),
    ("batch: sink conversion (Arrow -> driver values, order)", ("clickhouse/values.py", "_converted")),
    ("batch: ClickHouse I/O (ledger, chunks)", ("clickhouse_driver", "clickhouse/ledger.py", "clickhouse/sink.py")),
    ("batch: Kafka offset commit", ("kafka_offsets.py",)),
    ("batch: dead letters", ("DeadLetters",)),
    ("batch: metrics, key-partitioning check", ("observe_commit", "_check_key_partitioning", "freshness.py")),
    ("batch: filtering in Arrow (status, warm-up)", ("BatchWriter.__call__",)),
    ("waiting for the query (awaitTermination)", ("run_pipeline",)),
    ("progress listener", ("onQueryProgress",)),
]

STACK_DEPTH = 1024  # frames a JFR sample keeps (bench/freshness.py --jfr records with it) and this script reads
JFR_PHASES = [
    ("class loading (first use of Spark/Kafka classes)", ("ClassLoader", "ZipFile", "URLClassPath", "JarFile")),
    ("code generation (Janino compiling plans)", ("janino", "CodeGenerator", "codehaus")),
    ("Kafka fetch", ("kafka010", "org/apache/kafka")),
    ("JSON parsing (from_json, the ops jar's parsers)", ("JacksonParser", "jackson", "JsonToStructs", "json/",
                                                         "spark/AsciiJson", "spark/PlainJson", "spark/JsonValues",
                                                         "spark/IsoTimestamps")),
    ("dedup state (transformWithState, per Kafka partition, RocksDB)", ("DedupProcessor", "transformwithstate",
                                                                        "PartitionDedup", "rocksdb", "RocksDB",
                                                                        "StateStore")),
    ("shuffle", ("shuffle", "Shuffle")),
    ("Arrow conversion for toArrow", ("arrow", "Arrow")),
    ("other generated code (projections, filters)", ("GeneratedClass",)),
    ("query planning and optimisation", ("catalyst/optimizer", "catalyst/analysis", "QueryExecution",
                                         "IncrementalExecution", "catalyst/rules")),
    ("streaming engine (offsets, commit logs, progress)", ("execution/streaming",)),
]


# A join's task samples (bench/join_state.py): the first of these parts found anywhere on the stack, in this order, so
# that a sample inside the join's processor counts there and not under the stage below it. Spark runs tasks on threads
# named "Executor task launch worker ..." while busy and "Executor task idle worker ..." between tasks; JFR may keep
# either name for a sample.
JOIN_PARTS = [
    ("the join's timers", ("JoinProcessor.handleExpiredTimer",)),
    ("the timers' upkeep", ("KeyBuckets.keepTimerBefore",)),
    ("the join's input rows", ("JoinProcessor.handleInputRows",)),
    ("transformWithState around the processor", ("TransformWithStateExec",)),
    ("Kafka reader", ("kafka010",)),
    ("JSON parse", ("spark/PlainJson", "spark/AsciiJson", "spark/JsonValues")),
    ("the rest of the first stage, up to the shuffle write", ("ShuffleWriter",)),
    ("Arrow for the sink", ("ArrowBatches",)),
]
ROW_ENCODING = ("ExpressionEncoder", "SpecificUnsafeProjection", "UnsafeRowWriter")  # rows into and out of UnsafeRow


def jfr_stacks(path: Path, event: str) -> list[tuple[str, list[str]]]:
    """Each ``event`` sample of the recording: its thread's name and its frames, innermost first."""
    jfr = shutil.which("jfr") or str(Path(sys.prefix).parent / "bin" / "jfr")
    # jfr print keeps 5 frames of a stack unless told: too few to reach a Spark operator's frame
    out = subprocess.run([jfr, "print", "--json", "--stack-depth", str(STACK_DEPTH), "--events", event, str(path)],
                         capture_output=True, text=True, check=True).stdout
    stacks = []
    for e in json.loads(out)["recording"]["events"]:
        thread = (e["values"].get("sampledThread") or {}).get("javaName") or ""
        frames = (e["values"].get("stackTrace") or {}).get("frames") or []
        stacks.append((thread, [f["method"]["type"]["name"] + "." + f["method"]["name"] for f in frames]))
    return stacks


def join_parts(stacks: list[list[str]]) -> collections.Counter[str]:
    return collections.Counter(next((name for name, marks in JOIN_PARTS if any(m in f for f in frames for m in marks)),
                                    "other") for frames in stacks)


def join_jfr_summary(path: Path) -> None:
    """A join's task threads: Java samples by part of the plan, with the share that encodes rows; then the native
    method samples (RocksDB's JNI code) by part, which JFR takes apart from the Java ones."""
    java, native = ([frames for thread, frames in jfr_stacks(path, event) if thread.startswith("Executor task")]
                    for event in ("jdk.ExecutionSample", "jdk.NativeMethodSample"))
    encoding = sum(any(m in f for f in frames for m in ROW_ENCODING) for frames in java)
    print(f"JFR {path.name}, the task threads: {len(java)} Java samples, "
          f"{100 * encoding / max(len(java), 1):.1f} % of them turning rows into or out of UnsafeRow")
    for stacks, kind in ((java, "Java"), (native, "native method")):
        print(f"  {len(stacks)} {kind} samples by part:")
        for name, count in join_parts(stacks).most_common():
            print(f"  {count:6d} {100 * count / max(len(stacks), 1):5.1f} %  {name}")


def pyspy_summary(path: Path, rate: float) -> None:
    per_phase: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if any(x in stack for x in ("FinalizerWorker", "serve_forever", "CallbackServer.run")):
            continue  # py4j's and the metrics server's idle threads
        phase = next((name for name, marks in PYSPY_PHASES if any(m in stack for m in marks)), None)
        if phase is None:
            phase = "other: " + (frames[-1].split(" (")[0] if frames else "?")
        per_phase[phase] += int(n)
    print(f"py-spy {path.name} (seconds of wall time per thread, summed over the driver's threads):")
    for phase, count in per_phase.most_common(14):
        print(f"  {count / rate:7.1f} s  {phase}")


def jfr_phase(frames: list[str]) -> str | None:
    """The phase of a sample's stack (innermost frame first): the first frame that any phase marks, and of the
    phases marking that frame the first in JFR_PHASES. A deep stack has many phases' frames below the one the CPU
    was in (every task runs under Spark's executor, every stateful stage under its state store)."""
    for frame in frames:
        for name, marks in JFR_PHASES:
            if any(m in frame for m in marks):
                return name
    return None


def jfr_summary(path: Path, top: int = 0) -> None:
    per_phase: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for _, frames in jfr_stacks(path, "jdk.ExecutionSample"):
        if frames:
            leaves[frames[0]] += 1  # the innermost frame: where the CPU was
        per_phase[jfr_phase(frames) or "other"] += 1
    total = sum(per_phase.values())
    print(f"JFR {path.name}: {total} on-CPU samples (~{total / 100:.0f} CPU-s at 10 ms per sample and thread):")
    for phase, n in per_phase.most_common():
        print(f"  {n:6d} {100 * n / total:5.1f} %  {phase}")
    if top:
        print(f"  the {top} innermost frames with most samples:")
        for frame, n in leaves.most_common(top):
            print(f"  {n:6d} {100 * n / total:5.1f} %  {frame}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pyspy", type=Path, nargs="*", default=[])
    p.add_argument("--rate", type=float, default=50, help="py-spy's sampling rate (bench/bulk.py uses 50/s)")
    p.add_argument("--jfr", type=Path, nargs="*", default=[])
    p.add_argument("--top", type=int, default=0, help="also list the JFR's N innermost frames with most samples")
    p.add_argument("--join-jfr", type=Path, nargs="*", default=[],
                   help="a recording of bench/join_state.py's driver: its task samples by part of the join's plan")
    args = p.parse_args()
    for f in args.pyspy:
        pyspy_summary(f, args.rate)
    for f in args.jfr:
        jfr_summary(f, args.top)
    for f in args.join_jfr:
        join_jfr_summary(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
