package io.glasspipe.spark;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.StatefulProcessorHandle;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Keys grouped in buckets with one event-time timer a bucket ({@link BucketDedupProcessor}, {@link
 * BucketJoinProcessor}): the grouping, a row's key, and the bucket's timer on a grid.
 *
 * <p>Why: Spark keeps timers in a RocksDB index ordered by time and finds the due ones by scanning it from its
 * start, where every timer already fired and deleted stays as a tombstone until RocksDB compacts it away. With a
 * timer a key, once keys expire each micro-batch steps over all keys expired since the last compaction
 * (docs/benchmarks-journal.md, "Timers a bucket"). A bucket's timer sits on a grid of a fraction of the window at or
 * after the earliest expiry of its keys, each bucket's grid offset by its number, so the buckets' timers fire spread
 * over a grid step. A key is read about {@code parts} times in its life (one more while its timer waits for the grid),
 * for a grid of {@code window / parts}: fewer parts read keys less often and keep them up to a longer step past their
 * window.
 */
final class KeyBuckets {
  /** Buckets of the key space; part of the state's layout (the state plans in runner.py and join.py name it). */
  static final int BUCKETS = 1024;

  private KeyBuckets() {}

  /** {@code df} grouped by the bucket of its key columns, {@code pmod(hash(keys), BUCKETS)}, rows kept whole. */
  static KeyValueGroupedDataset<Row, Row> groupByBucket(Dataset<Row> df, Column[] keyCols, String bucketColumn) {
    Column bucket = functions.pmod(functions.hash(keyCols), functions.lit(BUCKETS)).alias(bucketColumn);
    StructType bucketSchema = new StructType().add(bucketColumn, DataTypes.IntegerType, false);
    return df.groupBy(bucket).as(Encoders.row(bucketSchema), Encoders.row(df.schema()));
  }

  /** The grid step for a window: {@code 1 / parts} of it, at least 1 ms. */
  static long gridMs(long windowMs, int parts) {
    return Math.max(1L, windowMs / parts);
  }

  /** A row's key: its key columns' values, the map state's key. */
  static Row keyOf(Row row, int[] keyIndexes) {
    Object[] values = new Object[keyIndexes.length];
    for (int i = 0; i < keyIndexes.length; i++) {
      values[i] = row.get(keyIndexes[i]);
    }
    return RowFactory.create(values);
  }

  /** A bucket's timer for its earliest {@code expiry}: the bucket's grid point at or after it. */
  static long timerFor(Row bucket, long expiry, long gridMs) {
    long phase = Math.floorMod((long) bucket.getInt(0), (long) BUCKETS) * gridMs / BUCKETS;
    return phase + Math.floorDiv(expiry - phase + gridMs - 1, gridMs) * gridMs;
  }

  /**
   * Moves the bucket's one timer to cover a new {@code expiry}, if it is earlier than the timer. The timer is read
   * from Spark's timers by key (a short prefix scan): a value state of its own would be counted as a state row,
   * which should be the live keys.
   */
  static void keepTimerBefore(StatefulProcessorHandle handle, Row bucket, long expiry, long gridMs) {
    long wanted = timerFor(bucket, expiry, gridMs);
    scala.collection.Iterator<Object> timers = handle.listTimers();
    Long current = timers.hasNext() ? (Long) timers.next() : null;
    if (current == null || wanted < current) {
      if (current != null) {
        handle.deleteTimer(current);
      }
      handle.registerTimer(wanted);
    }
  }
}
