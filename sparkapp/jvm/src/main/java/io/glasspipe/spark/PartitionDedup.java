package io.glasspipe.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.lang.reflect.Field;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.RocksDB;
import org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore$;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.LongAccumulator;
import org.apache.spark.util.SerializableConfiguration;
import scala.Option;

/**
 * Event-time deduplication per Kafka partition, an expression in the first stage: no shuffle, no sort, no
 * {@code transformWithState}.
 * Exact only where every record of a key is in one Kafka partition (the producer keys records by the deduplication
 * key); the user says so with {@code deduplication.perKafkaPartition}.
 *
 * <p>Each Kafka partition has a store of Spark's own (the session's provider: RocksDB with changelog checkpointing,
 * under {@code stateRoot}, store partition = Kafka partition), so that a batch's task loads the version its batch
 * started from and commits the next: a batch replayed after a crash, or computed twice, starts from the same state
 * and keeps the same rows, and a restarted job (on any executor) loads the committed version. A Kafka partition
 * without records in a batch gets no task; the next task fills the versions it missed with empty commits.
 *
 * <p>The state is laid out by time: key (segment, key), the segment ({@code window / SEGMENTS} of event time) ordered
 * first, value (first event time, Kafka offset). The store's column family holds glasspipe's own bytes (an 8-byte
 * big-endian segment with its sign bit flipped, then the key), read and written through the store's {@link RocksDB}:
 * Spark's range-scan key encoder cost 14 % of the task's samples at 50 000 events/s (it builds a SQL conf for every
 * key it encodes), and only it may range-delete through the {@link StateStore} API. A row is a duplicate when an
 * accepted row of its key lies less than a window from it in event time; it is looked up in the segments its window
 * overlaps. Once the batch's watermark is a
 * window past a segment's end, no row that is not late can fall within a window of its rows: it goes in one range
 * deletion. Rows are taken in offset order (the first to arrive wins); a late row (event time below the batch's
 * watermark, which the driver hands the tasks as the local property {@link #WATERMARK_PROPERTY}; a warm-up row: as its
 * first writer judged it, {@link JudgedLate}) is flagged late without touching the state; rows with the pass-through
 * column true (dead letters) pass untouched.
 *
 * <p>It also counts what was read ({@link #rowCounts}): the job's plan has no {@code observe} of its own for such a
 * source, nor a watermark before this operator (the driver puts it after the output columns), so that Kafka record,
 * parse, checks, deduplication and output columns are one stage of generated code, with no row written in between.
 *
 * <p><b>After the shuffle by key</b> ({@code shufflePartitions} above 0, {@code deduplication.ownState}) the same
 * operator runs on any topic: the rows are hashed by key into that many partitions, each sorted by (event time,
 * Kafka partition, offset), an order a replayed batch repeats whatever order the shuffle delivered them in; then
 * the store partition is the shuffle partition, and a key's first time is kept with its Kafka partition and offset.
 * That leaves out {@code transformWithState}'s sort by key, its {@code Row}s, its timers and Spark's key encoders.
 * So it also deduplicates a join's side, behind that side's watermark (Spark's global watermark is still the
 * offset log's, the one the driver hands over), with a row at the watermark late as the join counts it.
 */
public final class PartitionDedup {
  private PartitionDedup() {}

  /** The local property holding the batch's watermark (epoch ms), set by the driver before the batch's job. */
  public static final String WATERMARK_PROPERTY = "glasspipe.batchWatermarkMs";
  static final String BATCH_ID = "streaming.sql.batchId"; // Spark's MicroBatchExecution.BATCH_ID_KEY
  // A new key is looked up in every segment its window overlaps (SEGMENTS + 1 of them): with 4, a 2 m window cost
  // 23 CPU-us an event against 13 for an 8 h one (docs/benchmarks-journal.md); halves keep up to two windows of keys.
  // The layout of a checkpointed state: a change needs a new glasspipe_job.runner.PARTITION_DEDUP_PLAN.
  static final int SEGMENTS = 2;
  static final long META_SEGMENT = Long.MIN_VALUE; // the partition's newest event time and oldest live segment
  static final String COLUMN_FAMILY = "firstSeen"; // a column family of its own: Spark's changelog v2 has deleteRange
  // What the column family holds, as Spark's schema metadata records it: bytes of glasspipe's own layout.
  static final StructType KEY = new StructType().add("segmentAndKey", DataTypes.BinaryType, false);
  static final StructType VALUE = new StructType().add("firstAndOffset", DataTypes.BinaryType, false);
  static final int SEGMENT_BYTES = 8;
  /** Per executor: the version each store was last committed at, so that a task finds its version without a listing. */
  static final Map<String, Long> COMMITTED = new ConcurrentHashMap<>();
  /** Per state root (one query's source): its row counts, accumulated on the driver as tasks finish. */
  static final Map<String, RowCounts> COUNTS = new ConcurrentHashMap<>();

  /**
   * What the tasks of the query deduplicating under {@code stateRoot} read so far in this driver, as the job's
   * {@code observe} counts it for other sources: {records in, dead, filtered, warm-up}; records in, dead and
   * filtered leave warm-up rows out. Zeros before the query's plan is made.
   */
  public static long[] rowCounts(String stateRoot) {
    RowCounts c = COUNTS.get(stateRoot);
    return c == null ? new long[4] : new long[] {c.in().value(), c.dead().value(), c.filtered().value(),
        c.warmup().value()};
  }

  /**
   * How many times the tasks of this driver found a key again in another Kafka partition within its window (after
   * the shuffle by key only: per Kafka partition a key's other partition is never seen), as {@link
   * WindowDedup#keysInTwoPartitions()} counts it for Spark's engine.
   */
  public static long keysInTwoPartitions() {
    return COUNTS.values().stream().mapToLong(c -> c.twoPartitions().value()).sum();
  }

  /** Spark accumulators, merged from each successful task on the driver. */
  record RowCounts(LongAccumulator in, LongAccumulator dead, LongAccumulator filtered, LongAccumulator warmup,
      LongAccumulator twoPartitions) implements Serializable {
    /**
     * One row: a row read again to rebuild the state counts apart (warm-up); any other counts in, and as filtered
     * (the source's filter drops it) or dead (a dead letter).
     */
    void count(boolean warmup, boolean filtered, boolean dead) {
      if (warmup) {
        warmup().add(1L);
        return;
      }
      in().add(1L);
      if (filtered) {
        filtered().add(1L);
      } else if (dead) {
        dead().add(1L);
      }
    }
  }

  /**
   * {@code df} with {@code flagCol} (duplicate) and {@code lateCol} (late) added, every row kept.
   *
   * <p>An expression in the first stage's generated code, not a {@code mapPartitions}: Spark's rows go to it as
   * they are (the key columns as text, the event time as microseconds), where a function of external {@code Row}s
   * turned every column of every row into Java objects and back (13 % of the task samples at 50 000/s). It is
   * nondeterministic, so that Spark evaluates it once a row, in the rows' order.
   *
   * @param stateRoot where the stores keep their checkpoints (a folder of the query's checkpoint)
   * @param filtered true for a row the source's filter drops (it has no event time), counted only (with
   *     {@code shufflePartitions}, counted and dropped before the shuffle: not in the result)
   * @param warmup true for a row read again to rebuild the state (counted apart); such a row is late only as the
   *     writer that read it first judged it ({@code judgedLate}, {@link JudgedLate})
   * @param shufflePartitions 0: per Kafka partition, in the first stage; else after the shuffle by key into that
   *     many partitions (a store each)
   * @param lateAtWatermark a row at the watermark is late too: before a join, which counts it so (a single source
   *     follows Spark's rule, late below it)
   */
  public static Dataset<Row> deduplicate(
      Dataset<Row> input, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol, String stateRoot,
      Column filtered, Column warmup, String judgedLate, int shufflePartitions, boolean lateAtWatermark) {
    if (keys == null || keys.isEmpty()) {
      throw new IllegalArgumentException("at least one key column is needed");
    }
    if (windowMs <= 0) {
      throw new IllegalArgumentException("windowMs must be positive, got " + windowMs);
    }
    if (flagCol == null || lateCol == null || partitionCol == null || offsetCol == null || stateRoot == null) {
      throw new IllegalArgumentException("flagCol, lateCol, partitionCol, offsetCol and stateRoot are all needed");
    }
    if (shufflePartitions < 0) {
      throw new IllegalArgumentException("shufflePartitions must be 0 (per Kafka partition) or more, got "
          + shufflePartitions);
    }
    SparkContext sc = input.sparkSession().sparkContext();
    RowCounts counts = new RowCounts(sc.longAccumulator("glasspipe records in"), sc.longAccumulator("glasspipe dead"),
        sc.longAccumulator("glasspipe filtered"), sc.longAccumulator("glasspipe warm-up"),
        sc.longAccumulator("glasspipe keys in two partitions"));
    Column isFiltered = functions.coalesce(filtered, functions.lit(false));
    Column isWarmup = functions.coalesce(warmup, functions.lit(false));
    boolean shuffled = shufflePartitions > 0;
    // Shuffled: the filter's rows are counted and dropped first, not moved and sorted only to be counted after.
    // Then a key's rows go to one task, in an order a replay repeats.
    Dataset<Row> df = !shuffled ? input
        : withoutFiltered(input, new FilteredCounter(counts), isFiltered, isWarmup)
            .repartition(shufflePartitions, keys.stream().map(input::col).toArray(Column[]::new))
            .sortWithinPartitions(input.col(eventTimeCol), input.col(partitionCol), input.col(offsetCol));
    StructType schema = df.schema();
    if (!schema.apply(eventTimeCol).dataType().equals(DataTypes.TimestampType)) {
      throw new IllegalArgumentException("event time column " + eventTimeCol + " must be TIMESTAMP");
    }
    String code = "_gp_partition_dedup";
    for (String added : new String[] {flagCol, lateCol, code}) {
      if (Arrays.asList(schema.fieldNames()).contains(added)) {
        throw new IllegalArgumentException("column " + added + " already exists");
      }
    }
    StateStoreConf storeConf = new StateStoreConf(df.sparkSession().sessionState().conf(),
        scala.collection.immutable.Map$.MODULE$.empty());
    // Broadcast, as Spark's file sources do: in the plan, every task read the whole Hadoop configuration again.
    Broadcast<SerializableConfiguration> hadoopConf = JavaSparkContext.fromSparkContext(sc)
        .broadcast(new SerializableConfiguration(df.sparkSession().sessionState().newHadoopConf()));
    COUNTS.put(stateRoot, counts);
    Flagger flagger = new Flagger(new Plan(stateRoot, UUID.randomUUID(), storeConf, hadoopConf, windowMs, counts,
        JudgedLate.parse(judgedLate), shuffled, lateAtWatermark));
    Column keyText = functions.struct(keys.stream().map(k -> df.col(k).cast(DataTypes.StringType))
        .toArray(Column[]::new));
    Column micros = functions.coalesce(functions.unix_micros(df.col(eventTimeCol)), functions.lit(Long.MIN_VALUE));
    Column passthrough = passthroughCol == null ? functions.lit(false)
        : functions.coalesce(df.col(passthroughCol), functions.lit(false));
    Column flags = GeneratedCalls.inRowOrder(flagger, "code", DataTypes.IntegerType, keyText, micros,
        df.col(partitionCol), df.col(offsetCol), passthrough, shuffled ? functions.lit(false) : isFiltered, isWarmup);
    Dataset<Row> coded = df.withColumn(code, flags);
    return coded.withColumn(flagCol, coded.col(code).equalTo(Flagger.DUPLICATE))
        .withColumn(lateCol, coded.col(code).equalTo(Flagger.LATE)).drop(code);
  }

  /**
   * {@code input} without the rows {@code counter} counts as filtered. Its verdict is a column first, and the filter
   * reads that column: a filter on the call itself is pushed below the projections that parse the JSON, its
   * condition then parsing every value again (a third more CPU in the tasks, with no filter in the spec); a
   * nondeterministic projection stops that push.
   */
  private static Dataset<Row> withoutFiltered(Dataset<Row> input, FilteredCounter counter, Column filtered,
      Column warmup) {
    String kept = "_gp_not_filtered";
    if (Arrays.asList(input.schema().fieldNames()).contains(kept)) {
      throw new IllegalArgumentException("column " + kept + " already exists");
    }
    Dataset<Row> flagged = input.withColumn(kept,
        GeneratedCalls.inRowOrder(counter, "kept", DataTypes.BooleanType, filtered, warmup));
    return flagged.filter(flagged.col(kept)).drop(kept);
  }

  /**
   * Before the shuffle by key: counts the rows the source's filter drops ({@link RowCounts#count}), and keeps the
   * others.
   */
  public static final class FilteredCounter implements Serializable {
    private static final long serialVersionUID = 1L;
    private final RowCounts counts;

    FilteredCounter(RowCounts counts) {
      this.counts = counts;
    }

    public boolean kept(boolean filtered, boolean warmup) {
      if (!filtered) {
        return true;
      }
      counts.count(warmup, true, false);
      return false;
    }
  }

  /** What every task needs: fixed when the query's plan is made. */
  record Plan(String stateRoot, UUID runId, StateStoreConf storeConf, Broadcast<SerializableConfiguration> hadoopConf,
      long windowMs, RowCounts counts, JudgedLate judgedLate, boolean shuffled, boolean lateAtWatermark)
      implements Serializable {
    Configuration hadoop() {
      return hadoopConf.value().value();
    }
  }

  /**
   * The expression's target, one copy a task (Spark deserializes the plan for each): the rows of one Kafka partition
   * and batch, in offset order. The partition's store is loaded at its first row and committed when the task ends
   * well (aborted when it fails).
   */
  public static final class Flagger implements Serializable {
    private static final long serialVersionUID = 1L;
    static final int KEPT = 0;
    static final int DUPLICATE = 1;
    static final int LATE = 2;
    private final Plan plan;
    private transient PartitionState state;
    private transient long watermark;
    private transient long lateBefore; // the watermark, or past it where a row at it is late (lateAtWatermark)
    private transient boolean started;

    Flagger(Plan plan) {
      this.plan = plan;
    }

    /**
     * {@link #KEPT}, {@link #DUPLICATE} or {@link #LATE}: one row, in its Kafka partition's offset order, counted
     * ({@link #rowCounts}).
     */
    public int code(InternalRow keyText, long micros, int partition, long offset, boolean passthrough,
        boolean filtered, boolean warmup) {
      plan.counts().count(warmup, filtered, passthrough);
      if (passthrough || micros == Long.MIN_VALUE) { // a dead letter; no event time: no place in any window
        return KEPT;
      }
      if (!started) {
        watermark = batchWatermark();
        lateBefore = plan.lateAtWatermark() ? watermark + 1 : watermark;
        started = true;
      }
      long t = Math.floorDiv(micros, 1000L);
      if (warmup ? plan.judgedLate().wasLate(partition, offset, t)
          : t < lateBefore) {
        return LATE;
      }
      int store = plan.shuffled() ? TaskContext.getPartitionId() : partition;
      if (state == null) {
        PartitionState opened = new PartitionState(plan, store); // aborts its store unless committed
        TaskContext.get().addTaskCompletionListener(ctx -> { // Spark runs these last registered first
          if (!ctx.isFailed() && !ctx.isInterrupted()) {
            opened.commit(watermark);
          }
        });
        state = opened;
      } else if (state.partition != store) {
        throw new IllegalStateException("deduplication per Kafka partition saw Kafka partitions " + state.partition
            + " and " + partition + " in one task: a Kafka partition's records must not be split or merged "
            + "(no kafka minPartitions or maxRecordsPerPartition)");
      }
      return state.seen(key(keyText), t, partition, offset) ? DUPLICATE : KEPT;
    }

    private static long batchWatermark() {
      String text = TaskContext.get().getLocalProperty(WATERMARK_PROPERTY);
      if (text == null) {
        throw new IllegalStateException("no " + WATERMARK_PROPERTY + " local property: the driver sets it before a "
            + "batch's job (glasspipe_job.batch_writer)");
      }
      return Long.parseLong(text);
    }

    /**
     * {@link #SEGMENT_BYTES} bytes for the segment, then the key columns, each as a null marker or its length and
     * UTF-8 text: no two keys encode alike.
     */
    private static byte[] key(InternalRow keyText) {
      int n = keyText.numFields();
      int size = SEGMENT_BYTES;
      for (int i = 0; i < n; i++) {
        size += keyText.isNullAt(i) ? 1 : 5 + keyText.getUTF8String(i).numBytes();
      }
      ByteBuffer b = ByteBuffer.allocate(size).position(SEGMENT_BYTES);
      for (int i = 0; i < n; i++) {
        if (keyText.isNullAt(i)) {
          b.put((byte) 0);
        } else {
          UTF8String text = keyText.getUTF8String(i);
          b.put((byte) 1).putInt(text.numBytes());
          text.writeTo(b);
        }
      }
      return b.array();
    }
  }

  /** One Kafka partition's store for one task: loaded at the batch's version, committed after its last row. */
  static final class PartitionState {
    private static final Field STORE_PROVIDER = storeProviderField();
    final int partition;
    private final Plan plan;
    private final long segmentMs;
    private final String storeKey;
    private final StateStore store;
    private final RocksDB db;
    private long newest;
    private long oldest; // the oldest segment that may hold keys (Long.MAX_VALUE: none)
    private final long startNewest;
    private final long startOldest;

    PartitionState(Plan plan, int partition) {
      this.plan = plan;
      this.partition = partition;
      this.segmentMs = Math.max(1, plan.windowMs() / SEGMENTS);
      TaskContext task = TaskContext.get();
      String batch = task.getLocalProperty(BATCH_ID);
      if (batch == null) {
        throw new IllegalStateException("no " + BATCH_ID + " local property: deduplication per Kafka partition runs "
            + "in a streaming query's micro-batch");
      }
      long version = Long.parseLong(batch);
      storeKey = plan.runId() + "#" + plan.stateRoot() + "#" + partition; // a query started anew starts afresh
      StateStoreProviderId id = StateStoreProviderId.apply(
          new StateStoreId(plan.stateRoot(), 0L, partition, "default"), plan.runId());
      KeyStateEncoderSpec spec = NoPrefixKeyStateEncoderSpec.apply(KEY);
      // This executor committed the version this batch starts from: load it. Else (a gap, a replay, a store last
      // committed on another executor) the newest in the checkpoint at or below it: a later one is a failed batch's.
      Long committed = COMMITTED.get(storeKey);
      long from = committed != null && committed == version ? version : latestVersion(partition, version);
      StateStore s = open(id, spec, from);
      while (s.version() < version) { // batches in which this partition had no records: empty versions
        s = open(id, spec, s.commit());
      }
      store = s;
      task.addTaskCompletionListener(ctx -> {
        if (!store.hasCommitted()) {
          store.abort();
        }
      });
      store.createColFamilyIfAbsent(COLUMN_FAMILY, KEY, VALUE, spec, false, false);
      db = rocksDb(store);
      byte[] meta = db.get(segmentKey(META_SEGMENT), COLUMN_FAMILY);
      newest = meta == null ? Long.MIN_VALUE : readLong(meta, 0);
      oldest = meta == null ? Long.MAX_VALUE : readLong(meta, 8);
      startNewest = newest;
      startOldest = oldest;
    }

    private StateStore open(StateStoreProviderId id, KeyStateEncoderSpec spec, long version) {
      return StateStore$.MODULE$.get(id, KEY, VALUE, spec, version, Option.empty(), Option.empty(), true,
          plan.storeConf(), plan.hadoop(), false);
    }

    /** The newest version at or below {@code version} in the store's checkpoint (0: none). */
    private long latestVersion(int partition, long version) {
      Path dir = new Path(new Path(new Path(plan.stateRoot()), "0"), Integer.toString(partition));
      long latest = 0;
      try {
        FileSystem fs = dir.getFileSystem(plan.hadoop());
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
              // another of the store's files
            }
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return latest;
    }

    /** The store's RocksDB, whose byte-level calls write the changelog as the store's own do. */
    private static RocksDB rocksDb(StateStore store) {
      if (!(store instanceof RocksDBStateStoreProvider.RocksDBStateStore rocks)) {
        throw new IllegalStateException("deduplication per Kafka partition needs Spark's RocksDB state store "
            + "(spark.sql.streaming.stateStore.providerClass), got " + store.getClass().getName());
      }
      try { // the store's provider, a field javac does not see (Scala's synthetic $outer)
        return ((RocksDBStateStoreProvider) STORE_PROVIDER.get(rocks)).rocksDB();
      } catch (IllegalAccessException e) {
        throw new IllegalStateException("Spark's RocksDB state store hides its provider", e);
      }
    }

    private static Field storeProviderField() {
      try {
        return RocksDBStateStoreProvider.RocksDBStateStore.class.getField("$outer");
      } catch (NoSuchFieldException e) {
        throw new IllegalStateException("this Spark's RocksDB state store has no $outer provider field", e);
      }
    }

    /** {@code key} with its first {@link #SEGMENT_BYTES} set to {@code segment}, ordered as bytes compare. */
    private static byte[] withSegment(byte[] key, long segment) {
      ByteBuffer.wrap(key).putLong(0, segment ^ Long.MIN_VALUE); // big-endian, sign bit flipped
      return key;
    }

    private static byte[] segmentKey(long segment) {
      return withSegment(new byte[SEGMENT_BYTES], segment);
    }

    private static byte[] twoLongs(long a, long b) {
      return ByteBuffer.allocate(16).putLong(a).putLong(b).array();
    }

    private static long readLong(byte[] bytes, int at) {
      return ByteBuffer.wrap(bytes).getLong(at);
    }

    /**
     * True when an accepted row of {@code key} lies within a window of {@code t}, other than the row at {@code offset}
     * itself; else records t (and the offset) as one. {@code key} starts with {@link #SEGMENT_BYTES} this overwrites.
     */
    boolean seen(byte[] key, long t, int kafkaPartition, long offset) {
      long w = plan.windowMs();
      if (oldest != Long.MAX_VALUE) {
        long lo = Math.max(Math.floorDiv(t - w, segmentMs), oldest);
        long hi = Math.min(Math.floorDiv(t + w, segmentMs), Math.floorDiv(Math.max(t, newest), segmentMs));
        for (long s = lo; s <= hi; s++) {
          byte[] got = db.get(withSegment(key, s), COLUMN_FAMILY);
          if (got != null) {
            long first = readLong(got, 0);
            if (t > first - w && t < first + w) {
              if (!plan.shuffled()) {
                return readLong(got, 8) != offset;
              }
              long firstPartition = readLong(got, 16);
              if (readLong(got, 8) == offset && firstPartition == kafkaPartition) {
                return false; // the row itself
              }
              if (firstPartition != kafkaPartition) {
                plan.counts().twoPartitions().add(1L);
              }
              return true;
            }
          }
        }
      }
      long segment = Math.floorDiv(t, segmentMs);
      byte[] value = plan.shuffled() ? ByteBuffer.allocate(24).putLong(t).putLong(offset).putLong(kafkaPartition)
          .array() : twoLongs(t, offset);
      db.put(withSegment(key, segment), value, COLUMN_FAMILY, false, false, false);
      newest = Math.max(newest, t);
      oldest = Math.min(oldest, segment);
      return false;
    }

    /**
     * The batch's end: segments whose end is a window or more below the watermark deleted (a row that is not late
     * has t >= watermark, so it lies a window or more after all of their rows), the version committed.
     */
    void commit(long watermark) {
      long expireBefore = Math.floorDiv(watermark - plan.windowMs(), segmentMs); // segments below it end by then
      if (oldest != Long.MAX_VALUE && oldest < expireBefore) {
        db.deleteRange(segmentKey(META_SEGMENT + 1), segmentKey(expireBefore), COLUMN_FAMILY, false, false);
        oldest = expireBefore;
      }
      if (newest != startNewest || oldest != startOldest) {
        db.put(segmentKey(META_SEGMENT), twoLongs(newest, oldest), COLUMN_FAMILY, false, false, false);
      }
      COMMITTED.put(storeKey, store.commit());
    }
  }
}
