"""The README's main job: a real pipeline end to end on local servers.

Starts Kafka and ClickHouse, produces the SMS-status events of examples/sms-dedup.yaml (with their
duplicates) plus a generated stream with a known share of duplicates and a few broken records, runs
``glasspipe run`` on the example in local Spark, and prints what landed in ClickHouse.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import produce

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sms-dedup.yaml"
TOPIC, DLQ = "sms-status", "sms-status-dlq"


def sms_events(generated: int, dup_share: float, seed: int = 7) -> tuple[list[tuple[str, bytes]], set[str]]:
    """(key, value) records: a hand-written story plus a generated stream; and the expected sms_ids."""
    t0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

    def ev(sms_id: str, status: str, at: datetime, provider: str = "twilio") -> tuple[str, bytes]:
        doc = {"sms_id": sms_id, "status": status, "phone": "+4915100000" + sms_id[-2:],
               "meta": {"provider": provider}, "sent_at": at.isoformat()}
        return sms_id, json.dumps(doc).encode()

    story = [
        ev("sms-001", "delivered", t0),
        ev("sms-001", "delivered", t0 + timedelta(seconds=3)),   # producer retry: dropped
        ev("sms-002", "failed", t0 + timedelta(seconds=5), "vonage"),
        ev("sms-003", "delivered", t0 + timedelta(seconds=8)),
        ev("sms-002", "failed", t0 + timedelta(seconds=40), "vonage"),  # gateway resend: dropped
        ev("sms-003", "delivered", t0 + timedelta(minutes=4)),  # still inside 5 minutes: dropped
    ]
    expected = {"sms-001", "sms-002", "sms-003"}
    rng = random.Random(seed)
    records = list(story)
    base = t0 + timedelta(minutes=1)
    uniques = int(generated * (1 - dup_share))
    for i in range(uniques):
        sms_id = f"gen-{i:07d}"
        at = base + timedelta(milliseconds=10 * i)
        records.append(ev(sms_id, rng.choice(["queued", "sent", "delivered", "failed"]), at))
        expected.add(sms_id)
    for _ in range(generated - uniques):  # repeats of earlier ids, a few seconds later
        i = rng.randrange(uniques)
        records.append(ev(f"gen-{i:07d}", "delivered", base + timedelta(milliseconds=10 * i, seconds=2)))
    records.append(("bad-1", b"{not json"))
    records.append(("bad-2", json.dumps({"status": "sent", "sent_at": t0.isoformat()}).encode()))  # no sms_id
    return records, expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000, help="generated events (besides the story)")
    parser.add_argument("--duplicates", type=float, default=0.2, help="share of generated events that repeat")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="glasspipe-demo-") as tmp, KafkaServer() as kafka, \
            ClickHouseServer() as ch:
        kafka.create_topic(TOPIC, 4)
        kafka.create_topic(DLQ, 1)
        records, expected = sms_events(args.events, args.duplicates)
        produce(kafka.bootstrap, TOPIC, [(key.encode(), value) for key, value in records])
        print(f"produced {len(records)} events to {TOPIC} (4 partitions), {len(expected)} distinct sms_id")
        started = time.monotonic()
        cmd = [sys.executable, "-m", "glasspipe.cli", "run", str(EXAMPLE), "--available-now",
               "--bootstrap-servers", kafka.bootstrap, "--clickhouse", f"127.0.0.1:{ch.port}",
               "--checkpoint", f"{tmp}/checkpoint"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        summary = [line for line in done.stdout.splitlines() if line.startswith("glasspipe run:")]
        if done.returncode != 0 or not summary:
            print(done.stdout[-3000:], done.stderr[-6000:], sep="\n", file=sys.stderr)
            print(f"glasspipe run failed with exit code {done.returncode}", file=sys.stderr)
            return 1
        print(summary[0], f"({time.monotonic() - started:.1f} s including Spark start-up)")
        client = ch.client()
        rows, distinct = client.execute("SELECT count(), uniqExact(sms_id) FROM default.sms_status")[0]
        print(f"ClickHouse default.sms_status: {rows} rows, {distinct} distinct sms_id "
              f"(expected {len(expected)}): "
              f"{'exactly one row per sms_id' if rows == distinct == len(expected) else 'MISMATCH'}")
        print("the story's rows (first occurrence kept):")
        for row in client.execute("SELECT sms_id, status, provider, sent_at FROM default.sms_status "
                                  "WHERE sms_id LIKE 'sms-%' ORDER BY sms_id"):
            print("  ", *row)
        by_status = client.execute("SELECT status, count() FROM default.sms_status GROUP BY status ORDER BY status")
        print("rows by status:", dict(by_status))
        ok = rows == distinct == len(expected)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
