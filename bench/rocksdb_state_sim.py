"""RocksDB settings screened on the dedup operator's state traffic, without Spark (bench/RocksDBStateSim.java).

Runs the simulation once per variant (RocksDB options as key=value words; "" is Spark's defaults) with the
RocksDB JNI jar that pyspark ships, one after the other, and prints each run's CPU: the loop's own thread (what
Spark's tasks would pay) and RocksDB's background threads (flushes and compactions). A minute a variant; what
looks cheaper here must still be measured on the pipeline (bench/freshness.py), since Spark's per-row work
around RocksDB is not in it.

    python bench/rocksdb_state_sim.py --seconds 180 --window 60 "" "wb=256" "trigger=8" "universal"
    python bench/rocksdb_state_sim.py --rate 45000 --window 120 --seconds 360 "" "segments=4"   # a layout by time
    python bench/rocksdb_state_sim.py --rate 45000 --window 120 --seconds 360 "scattered" "scattered segments=4"
    python bench/rocksdb_state_sim.py --rate 1250 --window 480 --seconds 1200 --snapshot 240 "" "buckets=1024 grid=120"
        # one of two state partitions at 10 000 events/s in 250 ms batches, a 2 m window: a step is a batch
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pyspark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from glasspipe_dev.paths import java_binary

SIM = Path(__file__).resolve().with_name("RocksDBStateSim.java")


def rocksdb_jar() -> Path:
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("rocksdbjni-*.jar"))
    if not jars:
        raise SystemExit("no rocksdbjni jar in pyspark's jars: run `bash dev/setup.sh`")
    return jars[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="*", default=[""], help='RocksDB options, e.g. "wb=256 trigger=8"; "" for none')
    p.add_argument("--rate", type=int, default=36_000, help="new keys a second (40 000 events/s less 10 %% repeats)")
    p.add_argument("--window", type=int, default=60, help="seconds a key lives")
    p.add_argument("--seconds", type=int, default=180, help="simulated seconds")
    p.add_argument("--snapshot", type=int, default=60, help="seconds between flushes (Spark's snapshots)")
    args = p.parse_args()
    jar = rocksdb_jar()
    for variant in args.variants:
        words = [f"rate={args.rate}", f"window={args.window}", f"seconds={args.seconds}",
                 f"snapshot={args.snapshot}", *variant.split()]
        out = subprocess.run([str(java_binary()), "-cp", str(jar), str(SIM), *words], capture_output=True,
                             text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(words)}: exit {out.returncode}\n{out.stderr[-2000:]}")
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
