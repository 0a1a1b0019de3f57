package io.glasspipe.bench;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import io.glasspipe.spark.DedupProcessor;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.RangeKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore$;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A benchmark probe, not an operator: bench/PartitionDedupProbe.java's state per Kafka partition, laid out by time,
 * but kept in <em>Spark's own state store</em> (the session's provider: RocksDB with changelog checkpointing) instead
 * of a RocksDB of its own. What that buys is what the first probe lacked: a version per batch (a task loads the
 * version its batch started from and commits the next, so a batch replayed after a crash, or computed twice, starts
 * from the same state and gives the same rows), and a checkpoint a restart reads (changelogs and snapshots under
 * {@code stateRoot}, uploaded by Spark's maintenance thread, loadable on any executor). What it costs is what this
 * probe measures.
 *
 * <p>One store per Kafka partition (the store's partition id is the Kafka partition), key (segment, key) with the
 * segment ({@code window / SEGMENTS} of event time) ordered first, value (first event time, Kafka offset). A row is
 * looked up in the segments its window overlaps, between the oldest live one and the newest; a segment two windows
 * behind the partition's newest event time goes in one {@code deleteRange} (a RocksDB range tombstone, in the
 * changelog too). The partition's newest event time and oldest live segment are kept in the store under a key of
 * their own, so that a replay computes the same expiry. Rows are taken in offset order; late rows are not flagged
 * (a task sees no watermark). Exact only where the topic is partitioned by the key. A Kafka partition without records
 * in a batch gets no task: the next task fills the missing versions with empty commits.
 */
public final class StateStoreDedupProbe {
  private StateStoreDedupProbe() {}

  static final int SEGMENTS = 4;
  static final String BATCH_ID = "streaming.sql.batchId"; // MicroBatchExecution.BATCH_ID_KEY
  static final long META_SEGMENT = Long.MIN_VALUE;
  static final StructType KEY = new StructType().add("segment", DataTypes.LongType, false)
      .add("key", DataTypes.BinaryType, false);
  static final StructType VALUE = new StructType().add("first", DataTypes.LongType, false)
      .add("offset", DataTypes.LongType, false);
  /** Per executor: the version each store was last committed at, so that a task finds its version without a listing. */
  static final Map<String, Long> COMMITTED = new ConcurrentHashMap<>();

  /** {@code io.glasspipe.spark.WindowDedup#deduplicate}'s arguments and where the stores keep their checkpoints. */
  public static Dataset<Row> deduplicate(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol, String stateRoot) {
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
    StateStoreConf storeConf = new StateStoreConf(df.sparkSession().sessionState().conf(),
        scala.collection.immutable.Map$.MODULE$.empty());
    Probe probe = new Probe(stateRoot, UUID.randomUUID(), storeConf,
        new SerializableConfiguration(df.sparkSession().sessionState().newHadoopConf()), keyIndex,
        schema.fieldIndex(eventTimeCol), windowMs, passthroughCol == null ? -1 : schema.fieldIndex(passthroughCol),
        schema.fieldIndex(partitionCol), schema.fieldIndex(offsetCol), flagCol != null, lateCol != null);
    return df.mapPartitions(probe, Encoders.row(out));
  }

  /** The task's function: rows of one Kafka partition and batch, in offset order. */
  static final class Probe implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private final String stateRoot;
    private final UUID runId;
    private final StateStoreConf storeConf;
    private final SerializableConfiguration hadoopConf;
    private final int[] keyIndex;
    private final int eventTimeIndex;
    private final long windowMs;
    private final int passthroughIndex;
    private final int partitionIndex;
    private final int offsetIndex;
    private final boolean emitDropped;
    private final boolean lateColumn;

    Probe(String stateRoot, UUID runId, StateStoreConf storeConf, SerializableConfiguration hadoopConf,
        int[] keyIndex, int eventTimeIndex, long windowMs, int passthroughIndex, int partitionIndex, int offsetIndex,
        boolean emitDropped, boolean lateColumn) {
      this.stateRoot = stateRoot;
      this.runId = runId;
      this.storeConf = storeConf;
      this.hadoopConf = hadoopConf;
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
              long t = DedupProcessor.eventMillis(row.get(eventTimeIndex));
              if (t != Long.MIN_VALUE) {
                if (state == null) {
                  state = new PartitionState(Probe.this, row.getInt(partitionIndex));
                }
                duplicate = state.seen(key(row), t, row.getLong(offsetIndex));
              }
            }
            if (emitDropped) {
              return DedupProcessor.withFlags(row, duplicate, lateColumn, false);
            }
            if (!duplicate) {
              return row;
            }
          }
          if (state != null) {
            state.commit();
            state = null;
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

  /** One Kafka partition's store for one task: loaded at the batch's version, committed at the end of its rows. */
  static final class PartitionState {
    private static final byte[] NO_KEY = new byte[0];
    private final Probe probe;
    private final long segmentMs;
    private final String cf = "firstSeen"; // a column family of its own: Spark's changelog v2, which has deleteRange
    private final UnsafeProjection keyRow = UnsafeProjection.create(KEY);
    private final UnsafeProjection valueRow = UnsafeProjection.create(VALUE);
    private final String storeKey;
    private final StateStore store;
    private long newest;
    private long oldest; // the oldest segment that may hold keys
    private final long startNewest;
    private final long startOldest;

    PartitionState(Probe probe, int partition) {
      this.probe = probe;
      this.segmentMs = Math.max(1, probe.windowMs / SEGMENTS);
      TaskContext task = TaskContext.get();
      String batch = task.getLocalProperty(BATCH_ID);
      if (batch == null) {
        throw new IllegalStateException("no " + BATCH_ID + " local property: the probe runs in a streaming batch");
      }
      long version = Long.parseLong(batch);
      storeKey = probe.stateRoot + "#" + partition;
      StateStoreProviderId id = StateStoreProviderId.apply(
          new StateStoreId(probe.stateRoot, 0L, partition, "default"), probe.runId);
      KeyStateEncoderSpec spec = RangeKeyScanStateEncoderSpec.apply(KEY,
          CollectionConverters.asScala(List.<Object>of(0)).toSeq());
      Long committed = COMMITTED.get(storeKey);
      // this executor committed the version before this batch's: load it; else (a gap, a replay, a store last
      // committed on another executor) the newest in the checkpoint at or below it: a later one is a failed batch's
      long from = committed != null && committed == version ? version : latestVersion(partition, version);
      StateStore s = open(id, spec, from);
      while (s.version() < version) { // the batches in which this partition had no records: empty versions
        long v = s.commit();
        s = open(id, spec, v);
      }
      store = s;
      store.createColFamilyIfAbsent(cf, KEY, VALUE, spec, false, false);
      task.addTaskCompletionListener(ctx -> {
        if (!store.hasCommitted()) {
          store.abort();
        }
      });
      UnsafeRow meta = store.get(key(META_SEGMENT, NO_KEY), cf);
      newest = meta == null ? Long.MIN_VALUE : meta.getLong(0);
      oldest = meta == null ? Long.MAX_VALUE : meta.getLong(1);
      startNewest = newest;
      startOldest = oldest;
    }

    private StateStore open(StateStoreProviderId id, KeyStateEncoderSpec spec, long version) {
      return StateStore$.MODULE$.get(id, KEY, VALUE, spec, version, Option.empty(), Option.empty(), true,
          probe.storeConf, probe.hadoopConf.value(), false);
    }

    /** The newest version at or below {@code version} in the store's checkpoint (0: none). */
    private long latestVersion(int partition, long version) {
      Path dir = new Path(new Path(new Path(probe.stateRoot), "0"), Integer.toString(partition));
      long latest = 0;
      try {
        FileSystem fs = dir.getFileSystem(probe.hadoopConf.value());
        if (!fs.exists(dir)) {
          return 0;
        }
        for (FileStatus f : fs.listStatus(dir)) {
          String name = f.getPath().getName();
          int dot = name.indexOf('.');
          if (dot > 0 && (name.endsWith(".changelog") || name.endsWith(".zip"))) {
            try {
              long v = Long.parseLong(name.substring(0, dot));
              if (v <= version && v > latest) {
                latest = v;
              }
            } catch (NumberFormatException e) {
              // another file of the store's
            }
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return latest;
    }

    private UnsafeRow key(long segment, byte[] key) {
      return keyRow.apply(new GenericInternalRow(new Object[] {segment, key}));
    }

    /**
     * True when a first occurrence of {@code key} lies within a window of {@code t}, other than the row at
     * {@code offset} itself; else records t (and the offset) as one.
     */
    boolean seen(byte[] key, long t, long offset) {
      long w = probe.windowMs;
      long lo = Math.max(Math.floorDiv(t - w, segmentMs), oldest == Long.MAX_VALUE ? Long.MAX_VALUE : oldest);
      long hi = Math.min(Math.floorDiv(t + w, segmentMs), Math.floorDiv(Math.max(t, newest), segmentMs));
      for (long s = lo; s <= hi; s++) {
        UnsafeRow got = store.get(key(s, key), cf);
        if (got != null) {
          long first = got.getLong(0);
          if (t > first - w && t < first + w) {
            return got.getLong(1) != offset;
          }
        }
      }
      long segment = Math.floorDiv(t, segmentMs);
      store.put(key(segment, key), valueRow.apply(new GenericInternalRow(new Object[] {t, offset})), cf);
      newest = Math.max(newest, t);
      oldest = Math.min(oldest, segment);
      return false;
    }

    /** The batch's end: segments two windows behind the newest event time deleted, the version committed. */
    void commit() {
      long expireBefore = Math.floorDiv(newest - 2 * probe.windowMs, segmentMs);
      if (oldest != Long.MAX_VALUE && oldest < expireBefore && newest != Long.MIN_VALUE) {
        store.deleteRange(key(META_SEGMENT + 1, NO_KEY).copy(), key(expireBefore, NO_KEY).copy(), cf);
        oldest = expireBefore;
      }
      if (newest != startNewest || oldest != startOldest) {
        store.put(key(META_SEGMENT, NO_KEY), valueRow.apply(new GenericInternalRow(new Object[] {newest, oldest})),
            cf);
      }
      COMMITTED.put(storeKey, store.commit());
    }
  }
}
