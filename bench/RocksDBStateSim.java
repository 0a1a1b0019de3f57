import java.io.File;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;

import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.ColumnFamilyDescriptor;
import org.rocksdb.ColumnFamilyHandle;
import org.rocksdb.ColumnFamilyOptions;
import org.rocksdb.CompactionStyle;
import org.rocksdb.CompressionType;
import org.rocksdb.DBOptions;
import org.rocksdb.FlushOptions;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;
import org.rocksdb.Statistics;
import org.rocksdb.TickerType;
import org.rocksdb.WriteOptions;

/**
 * The dedup operator's RocksDB traffic without Spark, to screen RocksDB settings in a minute instead of a
 * five-minute pipeline run (run it with bench/rocksdb_state_sim.py). One RocksDB as Spark's state store opens
 * it (4 KB blocks, an 8 MB block cache, a Bloom filter, lz4, no WAL), three virtual column families in one key
 * space (a 2-byte id before each key, as Spark's transformWithState stores them): the value state, the timers by
 * key, the timers by time. Each simulated second: the timers below the watermark are read from the start of
 * the by-time index and deleted with their key's value (three deletes), then {@code rate} new keys each get
 * a read of the value (a miss), one value put and two timer puts, and one in nine of them a read of a recent
 * key (the repeats, a tenth of all events); a flush every {@code snapshot} seconds (Spark's snapshot). Keys are made in order, each after the
 * last, as bench/workload.py makes them (or scattered). It prints the CPU of the loop's thread and of RocksDB's background
 * threads (flushes: rocksdb:high, compactions: rocksdb:low). Spark's own per-row work is not in it: a setting
 * that moves RocksDB's cost between the two must still be measured on the pipeline (bench/freshness.py).
 *
 * <p>Arguments, key=value: rate, window (s), seconds, snapshot (s), trigger (level0 files that start a
 * compaction), wb (memtable MB), universal, dynamic=false, none (no compression), timeronly (no value state:
 * the timers by key are seeked for each new key instead), segments=N (not transformWithState's layout: no timers;
 * each key's first time goes into the newest of N + 1 column families, each {@code window / N} seconds long, a
 * key is looked up in all of them, newest first, and the oldest is dropped whole as a new one opens, so nothing
 * is ever deleted key by key: what an operator of glasspipe's own could keep), buckets=B (the default engine's
 * layout since plan dedup-buckets/1, io.glasspipe.spark.BucketDedupProcessor: keys grouped into B buckets, each a
 * map of its keys and one timer on a grid of grid=G seconds, window / 8 unless given; see runBuckets), scattered
 * (keys scattered over the key space instead of made in order). The printout splits the expiry's CPU: the scan
 * of the timers by time, which steps over the tombstones of every timer deleted since RocksDB last compacted.
 */
public final class RocksDBStateSim {
  private static final short VALUE = 1;
  private static final short TIMER_BY_KEY = 2;
  private static final short TIMER_BY_TIME = 3;
  private static final short MAP = 4;
  private static final short BUCKET_TIMER = 5;

  private RocksDBStateSim() {}

  /** A column family's key: id, then the grouping key as an UnsafeRow of one string, the timestamp before or after. */
  static byte[] key(short cf, String id, long ts, boolean tsFirst, boolean withTs) {
    byte[] k = id.getBytes();
    int rowLen = 16 + ((k.length + 7) / 8) * 8;
    ByteBuffer b = ByteBuffer.allocate(2 + rowLen + (withTs ? 8 : 0));
    b.putShort(cf);
    if (withTs && tsFirst) {
      b.putLong(ts ^ Long.MIN_VALUE);
    }
    b.putLong(0L).putLong(((long) 16 << 32) | k.length).put(k);
    b.position(2 + (withTs && tsFirst ? 8 : 0) + rowLen);
    if (withTs && !tsFirst) {
      b.putLong(ts ^ Long.MIN_VALUE);
    }
    return b.array();
  }

  /** Keys scattered over the key space (16 hex digits, as bench/workload.py --scattered-keys makes them). */
  private static boolean scattered = false;

  static String id(long n) {
    if (scattered) {
      String h = Long.toHexString(n * 0x9E3779B97F4A7C15L);
      return "s-40000-" + "0000000000000000".substring(h.length()) + h;
    }
    String d = Long.toString(n);
    return "s-40000-" + "000000000".substring(d.length()) + d;
  }

  private static long[] threadCpuMs(TreeMap<String, Long> byName) throws Exception {
    long all = 0;
    long rocks = 0;
    for (File d : new File("/proc/self/task").listFiles()) {
      String comm = new String(Files.readAllBytes(new File(d, "comm").toPath())).trim();
      String[] f = new String(Files.readAllBytes(new File(d, "stat").toPath())).split("\\) ")[1].split(" ");
      long ms = (Long.parseLong(f[11]) + Long.parseLong(f[12])) * 10L;
      all += ms;
      if (comm.startsWith("rocksdb")) {
        rocks += ms;
        byName.merge(comm, ms, Long::sum);
      }
    }
    return new long[] {all, rocks};
  }

  /** One run's line: keys, how they went, wall time, CPU of the loop and of RocksDB's threads, compactions. */
  private static void report(String[] args, long made, String gone, long startWall, long loopNs, long expiryNs,
      long scanNs, Statistics st) throws Exception {
    TreeMap<String, Long> byName = new TreeMap<>();
    long[] cpu = threadCpuMs(byName);
    System.out.printf("%s: %d keys made, %s in %.1f s; CPU s: the loop %.1f (expiry %.1f, of it the scan of the "
        + "timers by time %.1f), RocksDB's background %.1f %s, the process %.1f; compactions read %d MB and wrote "
        + "%d MB%n",
        String.join(" ", args), made, gone, (System.nanoTime() - startWall) / 1e9, loopNs / 1e9,
        expiryNs / 1e9, scanNs / 1e9, cpu[1] / 1e3, byName, cpu[0] / 1e3,
        st.getTickerCount(TickerType.COMPACT_READ_BYTES) >> 20,
        st.getTickerCount(TickerType.COMPACT_WRITE_BYTES) >> 20);
  }

  /** The segments=N layout (see the class comment): same keys, same repeats, same flushes, same printout. */
  private static void runSegments(File dir, ColumnFamilyOptions cf, int rate, int windowS, int seconds,
      int snapshotS, int segments, String[] args) throws Exception {
    DBOptions options = new DBOptions().setCreateIfMissing(true).setStatistics(new Statistics());
    List<ColumnFamilyHandle> handles = new ArrayList<>();
    WriteOptions write = new WriteOptions().setDisableWAL(true);
    ReadOptions read = new ReadOptions();
    FlushOptions flush = new FlushOptions().setWaitForFlush(true);
    byte[] value = new byte[24];
    ThreadMXBean bean = ManagementFactory.getThreadMXBean();
    int segmentS = Math.max(1, windowS / segments);
    long made = 0;
    long dropped = 0;
    long loopNs = 0;
    long expiryNs = 0;
    long startWall = System.nanoTime();
    try (RocksDB db = RocksDB.open(options, dir.getPath(),
        List.of(new ColumnFamilyDescriptor(RocksDB.DEFAULT_COLUMN_FAMILY, cf)), handles)) {
      ArrayDeque<ColumnFamilyHandle> live = new ArrayDeque<>(); // newest first
      for (int sec = 0; sec < seconds; sec++) {
        long t0 = bean.getCurrentThreadCpuTime();
        if (sec % segmentS == 0) {
          live.addFirst(db.createColumnFamily(new ColumnFamilyDescriptor(("s" + sec).getBytes(), cf)));
          if (live.size() > segments + 1) {
            ColumnFamilyHandle oldest = live.removeLast();
            db.dropColumnFamily(oldest);
            oldest.close();
            dropped += (long) rate * segmentS;
          }
        }
        expiryNs += bean.getCurrentThreadCpuTime() - t0;
        ColumnFamilyHandle newest = live.peekFirst();
        for (int i = 0; i < rate; i++) {
          byte[] k = key(VALUE, id(made++), 0, false, false);
          for (ColumnFamilyHandle h : live) {
            if (db.get(h, read, k) != null) {
              break;
            }
          }
          db.put(newest, write, k, value);
          if (i % 9 == 0 && made > 10) {
            byte[] recent = key(VALUE, id(made - 5), 0, false, false);
            for (ColumnFamilyHandle h : live) {
              if (db.get(h, read, recent) != null) {
                break;
              }
            }
          }
        }
        if ((sec + 1) % snapshotS == 0) {
          db.flush(flush, new ArrayList<>(live));
        }
        loopNs += bean.getCurrentThreadCpuTime() - t0;
      }
      report(args, made, dropped + " dropped with their segments", startWall, loopNs, expiryNs, 0, options.statistics());
      for (ColumnFamilyHandle h : live) {
        h.close();
      }
      for (ColumnFamilyHandle h : handles) {
        h.close();
      }
    }
  }

  /**
   * The timers by time below {@code before}, read from the start of their index as Spark's getExpiredTimers does:
   * over the tombstone of every timer deleted since RocksDB last compacted.
   */
  static List<byte[]> dueTimers(RocksDB db, long before) {
    List<byte[]> due = new ArrayList<>();
    try (RocksIterator it = db.newIterator()) {
      for (it.seek(new byte[] {0, (byte) TIMER_BY_TIME}); it.isValid(); it.next()) {
        byte[] k = it.key();
        if (k[0] != 0 || k[1] != TIMER_BY_TIME || (ByteBuffer.wrap(k, 2, 8).getLong() ^ Long.MIN_VALUE) >= before) {
          break;
        }
        due.add(k);
      }
    }
    return due;
  }

  /** A grouping key of one int (a bucket) as Spark encodes it: an UnsafeRow's null bits and its 8-byte slot. */
  static byte[] bucketRow(int bucket) {
    return ByteBuffer.allocate(16).putLong(0L).putLong(bucket).array();
  }

  static byte[] withPrefix(short cf, byte[]... parts) {
    int n = 2;
    for (byte[] p : parts) {
      n += p.length;
    }
    ByteBuffer b = ByteBuffer.allocate(n).putShort(cf);
    for (byte[] p : parts) {
      b.put(p);
    }
    return b.array();
  }

  /** A bucket's grid point at or after {@code expiry}, its grid offset by its share of a step (as the processor). */
  static long gridAt(long bucket, long expiry, long gridMs, int buckets) {
    long phase = bucket * gridMs / buckets;
    return phase + Math.floorDiv(expiry - phase + gridMs - 1, gridMs) * gridMs;
  }

  static byte[] tsBytes(long ts) {
    return ByteBuffer.allocate(8).putLong(ts ^ Long.MIN_VALUE).array();
  }

  /**
   * The buckets=B layout: transformWithState grouped by a bucket of the key (B of them) instead of the key. Each
   * bucket keeps a map state (key -> first time) and one event-time timer, on a grid of {@code grid} seconds at or
   * after its earliest expiry; when it fires, the bucket's map is read whole, the expired keys are deleted and the
   * timer is set again for the earliest left. So a timer (and its tombstones) per bucket and grid step, not per
   * key, at the price of reading each live key about window / grid times before it expires.
   */
  private static void runBuckets(File dir, ColumnFamilyOptions cf, int rate, int windowS, int seconds,
      int snapshotS, int buckets, int gridS, String[] args) throws Exception {
    Options options = new Options(new DBOptions().setCreateIfMissing(true).setStatistics(new Statistics()), cf);
    WriteOptions write = new WriteOptions().setDisableWAL(true);
    ReadOptions read = new ReadOptions();
    FlushOptions flush = new FlushOptions().setWaitForFlush(true);
    byte[] empty = new byte[0];
    ThreadMXBean bean = ManagementFactory.getThreadMXBean();
    long gridMs = gridS * 1000L;
    long windowMs = windowS * 1000L;
    long made = 0;
    long expired = 0;
    long read_ = 0;
    long fired = 0;
    long loopNs = 0;
    long expiryNs = 0;
    long scanNs = 0;
    long startWall = System.nanoTime();
    try (RocksDB db = RocksDB.open(options, dir.getPath())) {
      for (int sec = 0; sec < seconds; sec++) {
        long t0 = bean.getCurrentThreadCpuTime();
        long now = sec * 1000L;
        long watermark = now;
        List<byte[]> due = dueTimers(db, watermark + 1);
        scanNs += bean.getCurrentThreadCpuTime() - t0;
        for (byte[] k : due) {
          fired++;
          long ts = ByteBuffer.wrap(k, 2, 8).getLong() ^ Long.MIN_VALUE;
          byte[] row = java.util.Arrays.copyOfRange(k, 10, 26);
          byte[] prefix = withPrefix(MAP, row);
          long earliest = Long.MAX_VALUE;
          List<byte[]> gone = new ArrayList<>();
          try (RocksIterator it = db.newIterator()) {
            for (it.seek(prefix); it.isValid(); it.next()) {
              byte[] mk = it.key();
              if (mk.length < prefix.length || !java.util.Arrays.equals(mk, 0, prefix.length, prefix, 0, prefix.length)) {
                break;
              }
              read_++;
              long first = ByteBuffer.wrap(it.value()).getLong();
              if (first + windowMs <= watermark) {
                gone.add(mk);
              } else {
                earliest = Math.min(earliest, first + windowMs);
              }
            }
          }
          for (byte[] mk : gone) {
            db.delete(write, mk);
            expired++;
          }
          db.get(read, withPrefix(TIMER_BY_KEY, row, tsBytes(ts))); // deleteTimer: exists
          db.delete(write, k);
          db.delete(write, withPrefix(TIMER_BY_KEY, row, tsBytes(ts)));
          if (earliest == Long.MAX_VALUE) {
            db.delete(write, withPrefix(BUCKET_TIMER, row));
          } else {
            long at = gridAt(ByteBuffer.wrap(row, 8, 8).getLong(), earliest, gridMs, buckets);
            db.get(read, withPrefix(TIMER_BY_KEY, row, tsBytes(at))); // registerTimer: exists
            db.put(write, withPrefix(TIMER_BY_KEY, row, tsBytes(at)), empty);
            db.put(write, withPrefix(TIMER_BY_TIME, tsBytes(at), row), empty);
            db.put(write, withPrefix(BUCKET_TIMER, row), ByteBuffer.allocate(8).putLong(at).array());
          }
        }
        expiryNs += bean.getCurrentThreadCpuTime() - t0;
        for (int i = 0; i < rate; i++) {
          String id = id(made++);
          int bucket = Math.floorMod(id.hashCode(), buckets);
          byte[] row = bucketRow(bucket);
          byte[] mk = withPrefix(MAP, row, key(VALUE, id, 0, false, false));
          db.get(read, mk);
          db.put(write, mk, ByteBuffer.allocate(24).putLong(now).array());
          if (db.get(read, withPrefix(BUCKET_TIMER, row)) == null) {
            long at = gridAt(bucket, now + windowMs, gridMs, buckets);
            db.get(read, withPrefix(TIMER_BY_KEY, row, tsBytes(at)));
            db.put(write, withPrefix(TIMER_BY_KEY, row, tsBytes(at)), empty);
            db.put(write, withPrefix(TIMER_BY_TIME, tsBytes(at), row), empty);
            db.put(write, withPrefix(BUCKET_TIMER, row), ByteBuffer.allocate(8).putLong(at).array());
          }
          if (i % 9 == 0 && made > 10) {
            String recent = id(made - 5);
            db.get(read, withPrefix(MAP, bucketRow(Math.floorMod(recent.hashCode(), buckets)),
                key(VALUE, recent, 0, false, false)));
          }
        }
        if ((sec + 1) % snapshotS == 0) {
          db.flush(flush);
        }
        loopNs += bean.getCurrentThreadCpuTime() - t0;
      }
      report(args, made, expired + " expired (" + fired + " bucket timers fired, " + read_ + " keys read by them)",
          startWall, loopNs, expiryNs, scanNs, options.statistics());
    }
  }

  public static void main(String[] args) throws Exception {
    RocksDB.loadLibrary();
    int rate = 36_000;
    int windowS = 60;
    int seconds = 180;
    int snapshotS = 60;
    int trigger = 4;
    long wbMB = 0;
    boolean universal = false;
    boolean dynamic = true;
    boolean timerOnly = false;
    int segments = 0;
    int buckets = 0;
    int gridS = 0;
    CompressionType compression = CompressionType.LZ4_COMPRESSION;
    for (String arg : args) {
      String[] kv = arg.split("=", 2);
      switch (kv[0]) {
        case "rate": rate = Integer.parseInt(kv[1]); break;
        case "window": windowS = Integer.parseInt(kv[1]); break;
        case "seconds": seconds = Integer.parseInt(kv[1]); break;
        case "snapshot": snapshotS = Integer.parseInt(kv[1]); break;
        case "trigger": trigger = Integer.parseInt(kv[1]); break;
        case "wb": wbMB = Long.parseLong(kv[1]); break;
        case "universal": universal = true; break;
        case "dynamic": dynamic = Boolean.parseBoolean(kv[1]); break;
        case "none": compression = CompressionType.NO_COMPRESSION; break;
        case "timeronly": timerOnly = true; break;
        case "segments": segments = Integer.parseInt(kv[1]); break;
        case "scattered": scattered = true; break;
        case "buckets": buckets = Integer.parseInt(kv[1]); break;
        case "grid": gridS = Integer.parseInt(kv[1]); break;
        default: throw new IllegalArgumentException("unknown argument " + arg);
      }
    }
    File dir = Files.createTempDirectory("rocksdb-state-sim").toFile();
    BlockBasedTableConfig table = new BlockBasedTableConfig();
    table.setBlockSize(4096);
    table.setBlockCache(new LRUCache(8L << 20));
    table.setFilterPolicy(new BloomFilter());
    table.setFormatVersion(5);
    ColumnFamilyOptions cf = new ColumnFamilyOptions().setTableFormatConfig(table).setCompressionType(compression)
        .setLevel0FileNumCompactionTrigger(trigger).setLevelCompactionDynamicLevelBytes(dynamic);
    if (wbMB > 0) {
      cf.setWriteBufferSize(wbMB << 20);
    }
    if (universal) {
      cf.setCompactionStyle(CompactionStyle.UNIVERSAL);
    }
    if (segments > 0) {
      runSegments(dir, cf, rate, windowS, seconds, snapshotS, segments, args);
      return;
    }
    if (buckets > 0) {
      runBuckets(dir, cf, rate, windowS, seconds, snapshotS, buckets, gridS > 0 ? gridS : Math.max(1, windowS / 8),
          args);
      return;
    }
    Options options = new Options(new DBOptions().setCreateIfMissing(true).setStatistics(new Statistics()), cf);
    WriteOptions write = new WriteOptions().setDisableWAL(true);
    ReadOptions read = new ReadOptions();
    FlushOptions flush = new FlushOptions().setWaitForFlush(true);
    byte[] value = new byte[24];
    byte[] empty = new byte[0];
    ThreadMXBean bean = ManagementFactory.getThreadMXBean();
    long made = 0;
    long expired = 0;
    long loopNs = 0;
    long expiryNs = 0;
    long scanNs = 0;
    long startWall = System.nanoTime();
    try (RocksDB db = RocksDB.open(options, dir.getPath())) {
      for (int sec = 0; sec < seconds; sec++) {
        long t0 = bean.getCurrentThreadCpuTime();
        long now = sec * 1000L;
        long watermark = now; // the timers set a window ago are due
        List<byte[]> due = dueTimers(db, watermark);
        scanNs += bean.getCurrentThreadCpuTime() - t0;
        for (byte[] k : due) {
          long ts = ByteBuffer.wrap(k, 2, 8).getLong() ^ Long.MIN_VALUE;
          String id = id(expired++);
          db.delete(write, k);
          db.delete(write, key(TIMER_BY_KEY, id, ts, false, true));
          if (!timerOnly) {
            db.delete(write, key(VALUE, id, 0, false, false));
          }
        }
        expiryNs += bean.getCurrentThreadCpuTime() - t0;
        for (int i = 0; i < rate; i++) {
          String id = id(made++);
          long ts = now + windowS * 1000L;
          if (timerOnly) {
            try (RocksIterator it = db.newIterator()) {
              it.seek(key(TIMER_BY_KEY, id, 0, false, false));
              it.isValid();
            }
          } else {
            db.get(read, key(VALUE, id, 0, false, false));
            db.put(write, key(VALUE, id, 0, false, false), value);
          }
          db.put(write, key(TIMER_BY_KEY, id, ts, false, true), empty);
          db.put(write, key(TIMER_BY_TIME, id, ts, true, true), empty);
          if (i % 9 == 0 && made > 10 && !timerOnly) {
            db.get(read, key(VALUE, id(made - 5), 0, false, false));
          }
        }
        if ((sec + 1) % snapshotS == 0) {
          db.flush(flush);
        }
        loopNs += bean.getCurrentThreadCpuTime() - t0;
      }
      report(args, made, expired + " expired", startWall, loopNs, expiryNs, scanNs, options.statistics());
    }
  }
}
