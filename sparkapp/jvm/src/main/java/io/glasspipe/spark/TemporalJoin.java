package io.glasspipe.spark;

import java.util.List;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Entry point called from PySpark (py4j): a temporal join of two sides by key within an event-time
 * window ({@link JoinPairing}), done in {@code transformWithState} with event-time timers, so that eviction
 * costs the expired rows instead of a scan of the whole join state (Spark's stream-stream join, state format
 * v2, scans every micro-batch). Keys are grouped in buckets with a timer a bucket ({@link BucketJoinProcessor}); a
 * left join also sets a timer at the exact expiry of each left row that found no match on arrival.
 */
public final class TemporalJoin {
  /** The grouping column of {@link BucketJoinProcessor}: the bucket of the key. */
  static final String BUCKET_COLUMN = "_gp_join_bucket";

  /** The side column's values ({@code glasspipe_job.jvm.JOIN_LEFT} and so on). */
  public static final int LEFT = JoinPairing.LEFT;
  public static final int RIGHT = JoinPairing.RIGHT;
  public static final int JOINED = JoinPairing.JOINED;

  private TemporalJoin() {}

  private static int index(StructType schema, String name, DataType type) {
    int i = schema.fieldIndex(name);
    DataType actual = schema.fields()[i].dataType();
    if (type != null && !actual.equals(type)) {
      throw new IllegalArgumentException(
          "join column " + name + " must be " + type.simpleString() + ", got " + actual.simpleString());
    }
    return i;
  }

  private static StructType structOf(StructType schema, int i) {
    DataType type = schema.fields()[i].dataType();
    if (!(type instanceof StructType)) {
      throw new IllegalArgumentException(
          "join column " + schema.fields()[i].name() + " must be a struct, got " + type.simpleString());
    }
    return (StructType) type;
  }

  /**
   * A kept record in the join state ({@link JoinPairing#decode}): what the join reads again, the event time and the
   * warm-up flag, then in a left join whether the record matched, and the side's fields as their bytes
   * ({@link PackedRows}). Not the record's Kafka partition and offset, which only order a batch's fresh records (an
   * inner join dropped them with join plan {@code +join-buckets/2}: 7.6 % more pairs a second,
   * docs/benchmarks-journal.md; a left join with {@code +packed-rows/1}).
   */
  private static StructType entrySchema(boolean leftOuter) {
    StructType entry = new StructType()
        .add("t", DataTypes.TimestampType, false)
        .add("w", DataTypes.BooleanType, false);
    if (leftOuter) {
      entry = entry.add("m", DataTypes.BooleanType, false);
    }
    return entry.add("v", DataTypes.BinaryType, true);
  }

  /**
   * Joins the two sides unioned in {@code df}. The query must define an event-time watermark upstream,
   * and {@code eventTimeCol} must not carry its mark: Spark would drop late rows before this operator
   * sees them. {@code df} has these columns:
   *
   * @param keys the join key columns (the grouping); rows with a NULL key match nothing
   * @param sideCol INT: {@link #LEFT} or {@link #RIGHT}
   * @param eventTimeCol TIMESTAMP: the event time (not read on rows that pass through)
   * @param lateCol BOOLEAN: true (flagged by a side's {@link WindowDedup#flagLateBeforeJoin}) or NULL and
   *     at or below the watermark: the row passes through at once, late flag true, and never enters state
   * @param warmupCol BOOLEAN: warm-up rows (see handover.py); a joined row is warm-up if both rows are
   * @param partitionCol INT Kafka partition, {@code offsetCol} BIGINT offset: order rows of a batch
   * @param kafkaTimeCol TIMESTAMP: the record's Kafka timestamp, or {@code null} for no such column; a joined row
   *     gets the later of its two rows' that arrived in its batch (kept rows do not keep it), an unmatched left row
   *     emitted when its window closes NULL: the end-to-end latency of what a batch's records made
   * @param leftCol STRUCT of the left side's fields (NULL on right rows), {@code rightCol} likewise; both go through
   *     the operator and its state as their bytes, so the caller must start a new state when either type changes
   * @param windowMs the join window: {@code |t_left - t_right| <= window} matches
   * @param leftOuter emit a left row that matched nothing, right side NULL, when its window closes
   * @param closedLeft after a hand-over, how far the earlier writers closed the left side's windows per Kafka
   *     partition ({@link ClosedWindows}; empty: none): a warm-up left row they closed is dropped
   * @param judgedLeft after a hand-over, the warm-up rows of the left side the earlier writers found late ({@link
   *     JudgedLate}; empty: none), {@code judgedRight} the right side's: such a row is late again
   * @return rows with the columns of {@code df}: joined rows (side {@link #JOINED}),
   *     unmatched left rows (left join) and late rows; the result carries no watermark, so nothing
   *     stateful may follow
   */
  public static Dataset<Row> join(
      Dataset<Row> df, List<String> keys, String sideCol, String eventTimeCol, String lateCol, String warmupCol,
      String partitionCol, String offsetCol, String kafkaTimeCol, String leftCol, String rightCol, long windowMs, boolean leftOuter,
      String closedLeft, String judgedLeft, String judgedRight) {
    if (keys == null || keys.isEmpty()) {
      throw new IllegalArgumentException("a join needs at least one key column");
    }
    if (windowMs < 0) {
      throw new IllegalArgumentException("windowMs must not be negative, got " + windowMs);
    }
    int leftIndex = index(df.schema(), leftCol, null);
    int rightIndex = index(df.schema(), rightCol, null);
    StructType leftType = structOf(df.schema(), leftIndex);
    StructType rightType = structOf(df.schema(), rightIndex);
    // each side's fields as bytes through the operator and its state (PackedRows: why)
    Dataset<Row> packed = df
        .withColumn(leftCol, PackedRows.packed(functions.col(leftCol), leftType))
        .withColumn(rightCol, PackedRows.packed(functions.col(rightCol), rightType));
    StructType schema = packed.schema();
    int[] keyIndexes = new int[keys.size()];
    StructField[] keyFields = new StructField[keys.size()];
    Column[] keyCols = new Column[keys.size()];
    for (int i = 0; i < keys.size(); i++) {
      keyIndexes[i] = schema.fieldIndex(keys.get(i));
      keyFields[i] = schema.fields()[keyIndexes[i]];
      keyCols[i] = functions.col(keys.get(i));
    }
    StructType state = new StructType()
        .add("left", DataTypes.createArrayType(entrySchema(leftOuter), false), false)
        .add("right", DataTypes.createArrayType(entrySchema(leftOuter), false), false);
    JoinPairing pairing = new JoinPairing(
        keyIndexes,
        index(schema, sideCol, DataTypes.IntegerType),
        index(schema, eventTimeCol, DataTypes.TimestampType),
        index(schema, lateCol, DataTypes.BooleanType),
        index(schema, warmupCol, DataTypes.BooleanType),
        partitionCol == null ? -1 : index(schema, partitionCol, DataTypes.IntegerType),
        offsetCol == null ? -1 : index(schema, offsetCol, DataTypes.LongType),
        kafkaTimeCol == null ? -1 : index(schema, kafkaTimeCol, DataTypes.TimestampType),
        leftIndex, rightIndex, schema.size(), windowMs * 1000L, leftOuter, ClosedWindows.parse(closedLeft),
        JudgedLate.parse(judgedLeft), JudgedLate.parse(judgedRight));
    // every output column nullable: joined rows have no Kafka coordinates, unmatched rows no right side
    StructType out = new StructType();
    for (StructField f : schema.fields()) {
      out = out.add(f.name(), f.dataType(), true);
    }
    Dataset<Row> joined = KeyBuckets.groupByBucket(packed, keyCols, BUCKET_COLUMN)
        .transformWithState(
            new BucketJoinProcessor(pairing, leftOuter, keyIndexes, new StructType(keyFields), state),
            TimeMode.EventTime(), OutputMode.Append(), Encoders.row(out));
    return joined
        .withColumn(leftCol, PackedRows.unpacked(functions.col(leftCol), leftType))
        .withColumn(rightCol, PackedRows.unpacked(functions.col(rightCol), rightType));
  }
}
