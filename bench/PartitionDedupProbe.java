package io.glasspipe.bench;

import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import io.glasspipe.spark.FirstOccurrence;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.ColumnFamilyDescriptor;
import org.rocksdb.ColumnFamilyHandle;
import org.rocksdb.ColumnFamilyOptions;
import org.rocksdb.CompressionType;
import org.rocksdb.DBOptions;
import org.rocksdb.FlushOptions;
import org.rocksdb.LRUCache;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksDBException;
import org.rocksdb.WriteOptions;

/**
 * A benchmark probe, not an operator: what deduplication costs in glasspipe's job when its state is kept the way
 * bench/RocksDBStateSim.java's {@code segments=N} layout keeps it, per Kafka partition in the first stage (no
 * shuffle, no sort, no {@code transformWithState}). Same signature as {@code WindowDedup.deduplicate}, so that
 * bench/partition_probe_run.py can put it in that one's place.
 *
 * <p>Each Kafka partition's task keeps a RocksDB of its own in this JVM (local mode: one executor), with a column
 * family per segment of {@code window / SEGMENTS} of event time holding key -> first event time; a row is looked up
 * in the live segments its window overlaps (bloom filters make a miss cheap), and a segment is dropped whole once
 * the newest event time of its partition is two windows past it. Exact only where the topic is partitioned by the
 * key (the benchmark's is: Kafka keys are the sms_id) and nothing fails: the state is not checkpointed (a flush of
 * every segment a minute and a changelog file a batch stand for a checkpoint's I/O), not versioned by batch (a
 * row finds its own entry by its offset, so a batch computed twice keeps the same rows, but a batch replayed
 * after a failure would not be undone), and late rows are not flagged (it sees no watermark). Rows of a key within a
 * batch are taken in offset order, not event-time order.
 */
public final class PartitionDedupProbe {
  private PartitionDedupProbe() {}

  static final int SEGMENTS = 4;
  private static final long FLUSH_EVERY_NS = 60_000_000_000L;
  private static final Map<String, PartitionState> STATES = new ConcurrentHashMap<>();

  /** Same arguments as {@code io.glasspipe.spark.WindowDedup#deduplicate}; the late column is always false. */
  public static Dataset<Row> deduplicate(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol) {
    if (partitionCol == null || offsetCol == null) {
      throw new IllegalArgumentException("the probe needs the Kafka partition and offset columns");
    }
    StructType schema = df.schema();
    StructType out = schema;
    if (flagCol != null) {
      out = out.add(flagCol, DataTypes.BooleanType, false);
    }
    if (lateCol != null) {
      out = out.add(lateCol, DataTypes.BooleanType, false);
    }
    int[] keyIndex = keys.stream().mapToInt(schema::fieldIndex).toArray();
    Probe probe = new Probe(UUID.randomUUID().toString(), keyIndex, schema.fieldIndex(eventTimeCol), windowMs,
        passthroughCol == null ? -1 : schema.fieldIndex(passthroughCol), schema.fieldIndex(partitionCol),
        schema.fieldIndex(offsetCol), flagCol != null, lateCol != null);
    return df.mapPartitions(probe, Encoders.row(out));
  }

  /** The task's function: rows of one Kafka partition, in offset order. */
  static final class Probe implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private final String run;
    private final int[] keyIndex;
    private final int eventTimeIndex;
    private final long windowMs;
    private final int passthroughIndex;
    private final int partitionIndex;
    private final int offsetIndex;
    private final boolean emitDropped;
    private final boolean lateColumn;

    Probe(String run, int[] keyIndex, int eventTimeIndex, long windowMs, int passthroughIndex, int partitionIndex,
        int offsetIndex, boolean emitDropped, boolean lateColumn) {
      this.run = run;
      this.keyIndex = keyIndex;
      this.eventTimeIndex = eventTimeIndex;
      this.windowMs = windowMs;
      this.passthroughIndex = passthroughIndex;
      this.partitionIndex = partitionIndex;
      this.offsetIndex = offsetIndex;
      this.emitDropped = emitDropped;
      this.lateColumn = lateColumn;
    }

    @Override
    public Iterator<Row> call(Iterator<Row> rows) {
      return new Iterator<Row>() {
        private PartitionState state;
        private Row next = advance();

        private Row advance() {
          while (rows.hasNext()) {
            Row row = rows.next();
            boolean duplicate = false;
            if (passthroughIndex < 0 || row.isNullAt(passthroughIndex) || !row.getBoolean(passthroughIndex)) {
              long t = FirstOccurrence.eventMillis(row.get(eventTimeIndex));
              if (t != Long.MIN_VALUE) {
                if (state == null) {
                  state = STATES.computeIfAbsent(run + "-" + row.getInt(partitionIndex),
                      name -> new PartitionState(name, windowMs));
                }
                duplicate = state.seen(key(row), t, row.getLong(offsetIndex));
              }
            }
            if (emitDropped) {
              return FirstOccurrence.withFlags(row, duplicate, lateColumn, false);
            }
            if (!duplicate) {
              return row;
            }
          }
          if (state != null) {
            state.endBatch();
          }
          return null;
        }

        @Override
        public boolean hasNext() {
          return next != null;
        }

        @Override
        public Row next() {
          Row r = next;
          next = advance();
          return r;
        }
      };
    }

    private byte[] key(Row row) {
      StringBuilder b = new StringBuilder();
      for (int i : keyIndex) {
        b.append(row.isNullAt(i) ? "\u0000" : row.get(i).toString()).append('\u0001');
      }
      return b.toString().getBytes(StandardCharsets.UTF_8);
    }

  }

  /** One Kafka partition's state: a RocksDB with a column family per segment of event time. */
  static final class PartitionState {
    static {
      RocksDB.loadLibrary(); // before any RocksDB object, the options in the fields below too
    }

    private final long windowMs;
    private final long segmentMs;
    private final File dir;
    private final RocksDB db;
    private final ColumnFamilyOptions cf;
    private final WriteOptions write = new WriteOptions().setDisableWAL(true);
    private final ReadOptions read = new ReadOptions();
    private final NavigableMap<Long, ColumnFamilyHandle> segments = new TreeMap<>();
    private final byte[] value = new byte[16];
    private OutputStream changelog;
    private long newest = Long.MIN_VALUE;
    private long lastFlush = System.nanoTime();

    PartitionState(String name, long windowMs) {
      this.windowMs = windowMs;
      this.segmentMs = Math.max(1, windowMs / SEGMENTS);
      BlockBasedTableConfig table = new BlockBasedTableConfig();
      table.setBlockSize(4096);
      table.setBlockCache(new LRUCache(8L << 20));
      table.setFilterPolicy(new BloomFilter());
      table.setFormatVersion(5);
      cf = new ColumnFamilyOptions().setTableFormatConfig(table).setCompressionType(CompressionType.LZ4_COMPRESSION)
          .setLevelCompactionDynamicLevelBytes(true);
      try {
        dir = Files.createTempDirectory("glasspipe-partition-probe-" + name).toFile();
        // a run leaves a few GB of SST files: gone with the JVM (a SIGTERM runs the hooks; a SIGKILL does not)
        Runtime.getRuntime().addShutdownHook(new Thread(() -> delete(dir)));
        List<ColumnFamilyHandle> handles = new ArrayList<>();
        db = RocksDB.open(new DBOptions().setCreateIfMissing(true), dir.getPath(),
            List.of(new ColumnFamilyDescriptor(RocksDB.DEFAULT_COLUMN_FAMILY, cf)), handles);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      } catch (RocksDBException e) {
        throw new IllegalStateException(e);
      }
    }

    /**
     * True when a first occurrence of {@code key} lies within a window of {@code t}, other than the row at
     * {@code offset} itself; else records t (and the offset) as one. The job may compute a batch more than once
     * (an action per part), even in two tasks at a time: a row then finds its own entry and is kept again.
     */
    synchronized boolean seen(byte[] key, long t, long offset) {
      try {
        for (Map.Entry<Long, ColumnFamilyHandle> s
            : segments.subMap(Math.floorDiv(t - windowMs, segmentMs), true,
                Math.floorDiv(t + windowMs, segmentMs), true).entrySet()) {
          byte[] got = db.get(s.getValue(), read, key);
          if (got != null) {
            long first = decode(got, 0);
            if (t > first - windowMs && t < first + windowMs) {
              return decode(got, 8) != offset;
            }
          }
        }
        long index = Math.floorDiv(t, segmentMs);
        ColumnFamilyHandle h = segments.get(index);
        if (h == null) {
          h = db.createColumnFamily(new ColumnFamilyDescriptor(("s" + index).getBytes(StandardCharsets.UTF_8), cf));
          segments.put(index, h);
        }
        encode(t, 0);
        encode(offset, 8);
        db.put(h, write, key, value);
        log(key);
        newest = Math.max(newest, t);
        return false;
      } catch (RocksDBException e) {
        throw new IllegalStateException(e);
      }
    }

    private void log(byte[] key) {
      try {
        if (changelog == null) {
          changelog = new BufferedOutputStream(new FileOutputStream(new File(dir, "changelog")), 1 << 16);
        }
        changelog.write(key.length);
        changelog.write(key);
        changelog.write(value);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    /** A batch's end: its changelog closed, a flush a minute, segments two windows behind the newest dropped. */
    synchronized void endBatch() {
      try {
        if (changelog != null) {
          changelog.close();
          changelog = null;
        }
        while (!segments.isEmpty() && (segments.firstKey() + 1) * segmentMs + 2 * windowMs <= newest) {
          ColumnFamilyHandle h = segments.pollFirstEntry().getValue();
          db.dropColumnFamily(h);
          h.close();
        }
        if (System.nanoTime() - lastFlush > FLUSH_EVERY_NS) {
          db.flush(new FlushOptions().setWaitForFlush(true), new ArrayList<>(segments.values()));
          lastFlush = System.nanoTime();
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      } catch (RocksDBException e) {
        throw new IllegalStateException(e);
      }
    }

    private static void delete(File f) {
      File[] children = f.listFiles();
      if (children != null) {
        for (File c : children) {
          delete(c);
        }
      }
      if (!f.delete()) {
        System.err.println("could not delete " + f);
      }
    }

    private void encode(long v, int at) {
      for (int i = at + 7; i >= at; i--) {
        value[i] = (byte) v;
        v >>>= 8;
      }
    }

    private static long decode(byte[] b, int at) {
      long v = 0;
      for (int i = at; i < at + 8; i++) {
        v = (v << 8) | (b[i] & 0xFF);
      }
      return v;
    }
  }
}
