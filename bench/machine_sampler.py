"""Once a second, what the whole machine does beside a benchmark: CPU (user, kernel, iowait, idle, in %), the CPU
of the ClickHouse, Kafka and Spark processes (cores over that second) and ClickHouse's merges in progress (count,
compressed bytes, longest elapsed seconds, rows read), one Python dict a line. Run it beside bench/freshness.py
to see what a slow micro-batch coincided with; it finds the servers by their command lines.

    python bench/machine_sampler.py /tmp/samples.txt &
    python bench/freshness.py --variant dedup-partition --rates 110000 --seconds 300 --keep-logs /tmp/logs
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from clickhouse_driver import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from thread_cpu import process_cpu

PROCESSES = {"ch": r"clickhouse-server --config-file", "kafka": r"kafka\.Kafka|KafkaRaftServer",
             "spark": r"org\.apache\.spark\.deploy\.SparkSubmit"}


def find(pattern: str) -> tuple[int | None, str]:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if re.search(pattern, cmd):
                return int(p.name), cmd
    return None, ""


def machine_ticks() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def clickhouse_client(cmd: str) -> Client | None:
    conf = re.search(r"--config-file=(\S+)", cmd)
    port = re.search(r"<tcp_port>(\d+)</tcp_port>", Path(conf.group(1)).read_text()) if conf else None
    return Client("127.0.0.1", port=int(port.group(1))) if port else None


def main(out_path: str) -> None:
    client: Client | None = None
    before: dict[str, float] = {}
    pids: dict[str, tuple[int | None, str]] = {}
    last = machine_ticks()
    with open(out_path, "w") as out:
        while True:
            time.sleep(1)
            for name, pattern in PROCESSES.items():  # looked up again only once gone (a benchmark's next server)
                pid = pids.get(name, (None, ""))[0]
                if pid is None or not Path(f"/proc/{pid}").exists():
                    pids[name] = find(pattern)
                    before.pop(name, None)
            if client is None and pids["ch"][0] is not None:
                client = clickhouse_client(pids["ch"][1])
            now = machine_ticks()
            d = [a - b for a, b in zip(now, last, strict=True)]
            last, total = now, max(sum(d), 1)
            row: dict[str, Any] = {"t": time.strftime("%H:%M:%S"), "user": round(100 * (d[0] + d[1]) / total),
                                   "sys": round(100 * d[2] / total), "iowait": round(100 * d[4] / total),
                                   "idle": round(100 * d[3] / total)}
            for name, (pid, _cmd) in pids.items():
                if pid is not None and (seconds := process_cpu(pid)) is not None:
                    row[name] = round(seconds - before.get(name, seconds), 2)
                    before[name] = seconds
            if client is not None:
                try:
                    row["merges"] = client.execute("SELECT count(), sum(total_size_bytes_compressed), max(elapsed), "
                                                   "sum(rows_read) FROM system.merges")[0]
                except Exception:  # the server went away (the benchmark ended): look for the next one
                    client = None
            out.write(f"{row}\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
