"""Once a second, what the whole machine does beside a benchmark: CPU (user, kernel, iowait, idle, in %), the CPU
of the ClickHouse, Kafka and Spark processes (cores over that second), of the Spark process's threads by kind
(its tasks, RocksDB's flushes and compactions, the state stores' maintenance: snapshot uploads, and the garbage
collector), what the Spark process read from storage
(MB: page-cache misses, its state's files among them), the disks' reads and writes (MB), the page cache (GB), and
ClickHouse's merges in progress (count, compressed bytes, longest elapsed seconds, rows read), one Python dict a
line. Run it beside bench/freshness.py to see what a slow micro-batch coincided with; it finds the servers by their
command lines. ``--by-minute`` sums a file's seconds by minute from a run's start (freshness.py's ``began``).

    python bench/machine_sampler.py /tmp/samples.txt &
    python bench/freshness.py --variant dedup-partition --rates 110000 --seconds 300 --keep-logs /tmp/logs
    python bench/machine_sampler.py --by-minute /tmp/samples.txt --since 1765000000
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import time
from pathlib import Path
from typing import Any

from clickhouse_driver import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from thread_cpu import process_cpu, thread_cpus, thread_group

PROCESSES = {"ch": r"clickhouse-server --config-file", "kafka": r"kafka\.Kafka|KafkaRaftServer",
             "spark": r"org\.apache\.spark\.deploy\.SparkSubmit"}
# the Spark process's kinds of thread sampled apart (thread_cpu's groups), each line's key -> the group's label start
SPARK_THREADS = {"spark_tasks": "Spark tasks", "spark_rocksdb": "RocksDB background",
                 "spark_maintenance": "other: state-store-mai", "spark_gc": "garbage collector"}


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


def storage_read_bytes(pid: int) -> int | None:
    """Bytes the process has caused to be read from storage (not those the page cache served); None once gone."""
    try:
        found = re.search(r"^read_bytes: (\d+)", Path(f"/proc/{pid}/io").read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def disk_sectors() -> tuple[int, int]:
    """Sectors read and written so far by the whole disks (not their partitions: those are counted in them)."""
    disks = {d.name for d in Path("/sys/block").iterdir() if not d.name.startswith(("loop", "ram", "dm-"))}
    read = written = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] in disks:
            read, written = read + int(f[5]), written + int(f[9])
    return read, written


def page_cache_gb() -> float:
    kb = re.search(r"^Cached:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return round(int(kb.group(1)) / 2**20, 2) if kb else 0.0


def spark_threads(pid: int, before: dict[int, float]) -> dict[str, float]:
    """CPU seconds each of SPARK_THREADS's kinds of thread of the process ``pid`` used since ``before`` (tid -> CPU
    seconds, updated; empty for a process not seen yet: its threads' totals start then). A thread born since counts
    from zero."""
    first = not before
    out = dict.fromkeys(SPARK_THREADS, 0.0)
    threads = thread_cpus(pid)
    for tid, (name, cpu) in threads.items():
        group = thread_group(name)
        kind = next((k for k, label in SPARK_THREADS.items() if group.startswith(label)), None)
        if kind is not None:
            out[kind] += cpu - before.get(tid, cpu if first else 0.0)
    before.clear()  # the live threads only: an ended thread's id is not kept for hours
    before.update((tid, cpu) for tid, (_, cpu) in threads.items())
    return {k: round(v, 2) for k, v in out.items()}


def clickhouse_client(cmd: str) -> Client | None:
    conf = re.search(r"--config-file=(\S+)", cmd)
    port = re.search(r"<tcp_port>(\d+)</tcp_port>", Path(conf.group(1)).read_text()) if conf else None
    return Client("127.0.0.1", port=int(port.group(1))) if port else None


def main(out_path: str) -> None:
    client: Client | None = None
    before: dict[str, float] = {}
    spark_before: dict[int, float] = {}  # the Spark process's threads: tid -> CPU seconds at the last sample
    pids: dict[str, tuple[int | None, str]] = {}
    last = machine_ticks()
    sectors = disk_sectors()
    with open(out_path, "w") as out:
        while True:
            time.sleep(1)
            for name, pattern in PROCESSES.items():  # looked up again only once gone (a benchmark's next server)
                pid = pids.get(name, (None, ""))[0]
                if pid is None or not Path(f"/proc/{pid}").exists():
                    pids[name] = find(pattern)
                    for counter in (name, f"{name}_read_mb"):  # a new process's counters start from zero
                        before.pop(counter, None)
                    if name == "spark":
                        spark_before.clear()
            if client is None and pids["ch"][0] is not None:
                client = clickhouse_client(pids["ch"][1])
            now = machine_ticks()
            d = [a - b for a, b in zip(now, last, strict=True)]
            last, total = now, max(sum(d), 1)
            row: dict[str, Any] = {"t": time.strftime("%H:%M:%S"), "epoch": round(time.time(), 1)}
            row |= {"user": round(100 * (d[0] + d[1]) / total), "sys": round(100 * d[2] / total),
                    "iowait": round(100 * d[4] / total), "idle": round(100 * d[3] / total)}
            for name, (pid, _cmd) in pids.items():
                if pid is not None and (seconds := process_cpu(pid)) is not None:
                    row[name] = round(seconds - before.get(name, seconds), 2)
                    before[name] = seconds
            now_sectors = disk_sectors()
            row["disk_read_mb"], row["disk_write_mb"] = (round((a - b) * 512 / 2**20, 1)
                                                         for a, b in zip(now_sectors, sectors, strict=True))
            sectors = now_sectors
            row["page_cache_gb"] = page_cache_gb()
            spark = pids["spark"][0]
            if spark is not None and (read := storage_read_bytes(spark)) is not None:
                mb = read / 2**20
                row["spark_read_mb"] = round(mb - before.get("spark_read_mb", mb), 1)
                before["spark_read_mb"] = mb
                row |= spark_threads(spark, spark_before)
            if client is not None:
                try:
                    row["merges"] = client.execute("SELECT count(), sum(total_size_bytes_compressed), max(elapsed), "
                                                   "sum(rows_read) FROM system.merges")[0]
                except Exception:  # the server went away (the benchmark ended): look for the next one
                    client = None
            out.write(f"{row}\n")
            out.flush()


SUMMED = ("spark", *SPARK_THREADS, "spark_read_mb", "disk_read_mb", "disk_write_mb", "iowait")


def by_minute(path: Path, since: float) -> dict[int, dict[str, float]]:
    """Each minute from ``since``: the sum of SUMMED's per-second figures (spark: CPU-s; iowait: %-seconds), and the
    page cache at the minute's end."""
    minutes: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = ast.literal_eval(line)
        if "epoch" not in row or row["epoch"] < since:
            continue
        m = minutes.setdefault(int((row["epoch"] - since) // 60), dict.fromkeys(SUMMED, 0.0))
        for key in SUMMED:
            m[key] += row.get(key, 0.0)
        m["page_cache_gb"] = row["page_cache_gb"]
    return minutes


def main_cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="the file the samples go to (or, with --by-minute, come from)")
    p.add_argument("--by-minute", action="store_true", help="sum the file's seconds by minute instead of sampling")
    p.add_argument("--since", type=float, default=0.0, help="with --by-minute: the epoch second minute 0 starts at")
    a = p.parse_args()
    if not a.by_minute:
        main(str(a.out))
        return
    print("minute  Spark cores  of which: tasks  RocksDB  maintenance    GC  Spark read MB/s  disk read MB/s  "
          "disk write MB/s  iowait %  page cache GB")
    for m, f in sorted(by_minute(a.out, a.since).items()):
        print(f"{m:6d}  {f['spark'] / 60:11.2f}  {f['spark_tasks'] / 60:15.2f}  {f['spark_rocksdb'] / 60:7.2f}  "
              f"{f['spark_maintenance'] / 60:11.2f}  {f['spark_gc'] / 60:4.2f}  {f['spark_read_mb'] / 60:15.1f}  "
              f"{f['disk_read_mb'] / 60:14.1f}  {f['disk_write_mb'] / 60:15.1f}  {f['iowait'] / 60:8.1f}  "
              f"{f['page_cache_gb']:13.2f}")


if __name__ == "__main__":
    main_cli()
