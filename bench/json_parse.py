"""The job's JSON readers on the harness's records, without Spark or Kafka (bench/JsonParseBench.java): CPU-ns a
record of the reader the job uses (``PlainJson.read``: ``AsciiJson`` from the bytes first) against the Jackson
parser alone (``PlainJson.readWithJackson``), in one JVM, rounds alternating; both must give the same rows.

    python bench/json_parse.py --records 1000000 --rounds 9
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparkapp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import Workload

from glasspipe.api import models
from glasspipe_dev.paths import java_binary
from glasspipe_job.jvm import jvm_ops_jar
from glasspipe_job.transform import CORRUPT, payload_schema

BENCH = Path(__file__).resolve().with_name("JsonParseBench.java")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sms-dedup.yaml"


def sms_schema_json() -> str:
    """The JSON schema the job reads the harness's records with: examples/sms-dedup.yaml's fields and ``seq``."""
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["sources"][0]["schema"]["fields"].append({"name": "seq", "type": "long", "nullable": False})
    spec = models.GlassPipelineSpec.model_validate(doc["spec"])
    return payload_schema(spec.sources[0]).json()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    workload = Workload()
    now = time.time()
    jars = Path(pyspark.__file__).parent / "jars"
    with tempfile.TemporaryDirectory(prefix="gp-json-") as d:
        records = Path(d) / "records.bin"
        with records.open("wb") as out:
            for i in range(args.records):
                _, value, _ = workload.event(now + i / 100_000)
                out.write(struct.pack(">i", len(value)) + value)
        run = subprocess.run([str(java_binary()), "-Xmx2g", "-cp", f"{jars}/*:{jvm_ops_jar()}", str(BENCH),
                              str(records), sms_schema_json(), CORRUPT, str(args.rounds)],
                             capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"exit {run.returncode}\n{run.stderr[-3000:]}")
    print(run.stdout.strip())


if __name__ == "__main__":
    main()
