package io.glasspipe.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.LongAccumulator;

/**
 * Entry point called from PySpark (py4j): event-time deduplication within a window, done by a
 * JVM-side {@link BucketDedupProcessor} in {@code transformWithState} so that no Python runs per key.
 *
 * <p>State: the keys grouped into a fixed number of buckets, each a map of its live keys (first accepted event
 * time) and one event-time timer, so evicting costs a few reads of each key in its life, neither a scan of all
 * live keys (as {@code dropDuplicatesWithinWatermark}) nor a timer a key, whose tombstones Spark's timer scan
 * steps over. The same before a join ({@link #flagLateBeforeJoin}), where a row at the watermark is late too.
 */
public final class WindowDedup {
  /** The grouping column of {@link BucketDedupProcessor}: the bucket of the key. */
  static final String BUCKET_COLUMN = "_gp_dedup_bucket";

  private WindowDedup() {}

  /** Counts keys seen in a second Kafka partition within their window (driver-side total). */
  private static volatile LongAccumulator keysInTwoPartitions;

  /** Keys seen in two partitions so far in this driver (0 before any deduplicate call). */
  public static long keysInTwoPartitions() {
    LongAccumulator acc = keysInTwoPartitions;
    return acc == null ? 0L : acc.value();
  }

  /**
   * Deduplicates {@code df} (which must already carry a watermark on {@code eventTimeCol}).
   *
   * @param keys key column names (any types Spark can group by)
   * @param eventTimeCol TimestampType column the window is measured on
   * @param windowMs window length in milliseconds (a later row with the same key and an event
   *     time before first + window is a duplicate)
   * @param flagCol if non-null, dropped rows are emitted too, with this boolean column set to
   *     true (kept rows have false), so the caller can count duplicates exactly per micro-batch;
   *     if null only kept rows are emitted, with the input schema unchanged
   * @param passthroughCol if non-null, a boolean column: rows where it is true bypass the state
   *     and are emitted as kept (records the caller routes elsewhere, e.g. dead letters)
   * @param partitionCol if non-null, an INT column with the Kafka partition: a key seen again in
   *     another partition within its window is counted ({@link #keysInTwoPartitions()})
   * @param offsetCol if non-null, a BIGINT column with the Kafka offset: with the partition, it breaks
   *     ties in event time so that replays keep the same rows
   */
  public static Dataset<Row> deduplicate(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol) {
    return deduplicate(df, keys, eventTimeCol, windowMs, flagCol, passthroughCol, partitionCol, offsetCol, null,
        null, "");
  }

  /**
   * As above; with {@code lateCol} non-null (and {@code flagCol} non-null), late rows are not dropped
   * by Spark but emitted with the boolean {@code lateCol} set to true, so the caller can dead-letter
   * them. Spark drops late rows by the input's watermark column before a stateful processor sees
   * them; so here the event time is copied into a column without the watermark mark (the watermark
   * itself is already tracked upstream) and {@code transformWithState} runs in event-time mode with no
   * marked column in or out; event-time mode passes the input's watermark on to an operator after it.
   * With {@code warmupCol} non-null, a BOOLEAN column: a row with it true (read again after a hand-over to rebuild
   * the state) is late only as the writer that read it first judged it ({@code judgedLate}, {@link JudgedLate}), so
   * it enters the state whatever the new writer's watermark ({@link FirstOccurrence}).
   */
  public static Dataset<Row> deduplicate(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol, String warmupCol,
      String judgedLate) {
    return build(df, keys, eventTimeCol, windowMs, flagCol, passthroughCol, partitionCol, offsetCol, lateCol, false,
        warmupCol, JudgedLate.parse(judgedLate));
  }

  /**
   * One side of a join with deduplication: late rows flagged in {@code lateCol} (not dropped) and
   * deduplicated as {@link #deduplicate} does ({@code flagCol} marks duplicates); rows with
   * {@code passthroughCol} true (dead rows) pass untouched. A row is late at or below the watermark
   * ({@code t <= watermark}, as the join counts it). No output column carries the watermark's mark, so
   * Spark drops no late row before the join either. (A side without deduplication needs no operator:
   * the join flags its late rows.) A row with {@code warmupCol} true is late only as its first writer judged it
   * ({@code judgedLate}, {@link FirstOccurrence}).
   */
  public static Dataset<Row> flagLateBeforeJoin(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol, String warmupCol,
      String judgedLate) {
    if (lateCol == null) {
      throw new IllegalArgumentException("flagLateBeforeJoin needs lateCol");
    }
    return build(df, keys, eventTimeCol, windowMs, flagCol, passthroughCol, partitionCol, offsetCol, lateCol, true,
        warmupCol, JudgedLate.parse(judgedLate));
  }

  private static Dataset<Row> build(
      Dataset<Row> df, List<String> keys, String eventTimeCol, long windowMs, String flagCol,
      String passthroughCol, String partitionCol, String offsetCol, String lateCol, boolean beforeJoin,
      String warmupCol, JudgedLate judgedLate) {
    if (lateCol != null) {
      if (flagCol == null) {
        throw new IllegalArgumentException("lateCol needs flagCol");
      }
      df = df.withColumn(eventTimeCol, functions.timestamp_micros(functions.unix_micros(functions.col(eventTimeCol))));
    }
    if (keys == null || keys.isEmpty()) {
      throw new IllegalArgumentException("at least one key column is needed");
    }
    if (windowMs <= 0) {
      throw new IllegalArgumentException("windowMs must be positive, got " + windowMs);
    }
    StructType schema = df.schema();
    int etIndex = schema.fieldIndex(eventTimeCol);
    if (!schema.fields()[etIndex].dataType().equals(DataTypes.TimestampType)) {
      throw new IllegalArgumentException(
          "event time column " + eventTimeCol + " must be TIMESTAMP, got "
              + schema.fields()[etIndex].dataType().simpleString());
    }
    List<StructField> keyFields = new ArrayList<>();
    Column[] keyCols = new Column[keys.size()];
    int[] keyIndexes = new int[keys.size()];
    for (int i = 0; i < keys.size(); i++) {
      keyIndexes[i] = schema.fieldIndex(keys.get(i));
      keyFields.add(schema.fields()[keyIndexes[i]]);
      keyCols[i] = functions.col(keys.get(i));
    }
    StructType keySchema = new StructType(keyFields.toArray(new StructField[0]));
    StructType outSchema = schema;
    if (flagCol != null) {
      if (Arrays.asList(schema.fieldNames()).contains(flagCol)) {
        throw new IllegalArgumentException("flag column " + flagCol + " already exists");
      }
      outSchema = schema.add(flagCol, DataTypes.BooleanType, false);
    }
    if (lateCol != null) {
      if (Arrays.asList(schema.fieldNames()).contains(lateCol)) {
        throw new IllegalArgumentException("late column " + lateCol + " already exists");
      }
      outSchema = outSchema.add(lateCol, DataTypes.BooleanType, false);
    }
    int passthroughIndex = -1;
    if (passthroughCol != null) {
      passthroughIndex = schema.fieldIndex(passthroughCol);
      if (!schema.fields()[passthroughIndex].dataType().equals(DataTypes.BooleanType)) {
        throw new IllegalArgumentException("passthrough column " + passthroughCol + " must be BOOLEAN");
      }
    }
    int partitionIndex = partitionCol == null ? -1 : schema.fieldIndex(partitionCol);
    int offsetIndex = offsetCol == null ? -1 : schema.fieldIndex(offsetCol);
    int warmupIndex = warmupCol == null ? -1 : schema.fieldIndex(warmupCol);
    if (keysInTwoPartitions == null) {
      keysInTwoPartitions = df.sparkSession().sparkContext().longAccumulator("glasspipe.keysInTwoPartitions");
    }
    BucketDedupProcessor processor = new BucketDedupProcessor(keyIndexes, keySchema, etIndex, windowMs,
        flagCol != null, passthroughIndex, partitionIndex, offsetIndex, keysInTwoPartitions, lateCol != null,
        beforeJoin, warmupIndex, judgedLate);
    KeyValueGroupedDataset<Row, Row> grouped = KeyBuckets.groupByBucket(df, keyCols, BUCKET_COLUMN);
    if (lateCol != null) {
      // No output column carries the watermark's mark: the watermark still reaches a join after this
      // (event-time mode passes the input's on), and Spark adds no check of emitted event times, a
      // predicate holding the batch's watermark that was compiled anew every batch.
      return grouped.transformWithState(processor, TimeMode.EventTime(), OutputMode.Append(), Encoders.row(outSchema));
    }
    return grouped.transformWithState(processor, eventTimeCol, OutputMode.Append(), Encoders.row(outSchema));
  }
}
