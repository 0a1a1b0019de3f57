package io.glasspipe.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.util.LongAccumulator;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * First occurrence of a key wins; a later row of that key is a duplicate when its event time lies
 * within a window of the first one (first - window < t < first + window). Once the window has
 * passed, the next row of the key is accepted and opens a new window. A row more than a window
 * <em>earlier</em> than the first one (possible when the allowed lateness exceeds the window) is
 * not a duplicate either: it is accepted, and the state keeps the later first occurrence. The state
 * (first accepted event time, ms) is cleared by an event-time timer at first + window, i.e. when the
 * watermark passes the end of the window: a row arriving after that has an event time at or above
 * the watermark (older rows are late), so it lies outside the old window and accepting it is
 * correct.
 *
 * <p>Late rows (event time below the current watermark): with {@code flagLate} the caller has kept
 * Spark from dropping them (see {@link WindowDedup}), and they are emitted with the late flag set,
 * without reading or changing any state, so that they reach the dead-letter topic.
 *
 * <p>Before a join ({@code lateAtWatermark}) a row is late at or below the watermark, as the join
 * operator counts it ({@code t <= watermark}).
 *
 * <p>Within one micro-batch the rows of a key are taken in event-time order (ties by partition and
 * offset), so a replayed micro-batch with the same rows gives the same result.
 *
 * <p>The state also keeps the Kafka partition of the first occurrence: a key seen again in another
 * partition within its window is counted in {@code keysInTwoPartitions}, because deduplication is
 * only exact when the topic is partitioned by the key (each partition is owned by one replica).
 */
public final class DedupProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final FirstOccurrence rule;
  private final boolean flagLate;
  private final boolean lateAtWatermark;
  private transient ValueState<Tuple2<Long, Integer>> firstSeen;

  /**
   * @param passthroughIndex index of a boolean column; rows where it is true (e.g. records bound
   *     for the dead-letter topic) are emitted as kept without reading or changing any state. -1:
   *     no such column.
   * @param lateAtWatermark a row at the watermark is late too (before a join, which counts it so)
   */
  public DedupProcessor(int eventTimeIndex, long windowMs, boolean emitDropped, int passthroughIndex,
      int partitionIndex, int offsetIndex, LongAccumulator keysInTwoPartitions, boolean flagLate,
      boolean lateAtWatermark) {
    this.rule = new FirstOccurrence(eventTimeIndex, windowMs, emitDropped, passthroughIndex, partitionIndex,
        offsetIndex, keysInTwoPartitions, flagLate);
    this.flagLate = flagLate;
    this.lateAtWatermark = lateAtWatermark;
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    firstSeen = getHandle().getValueState(
        "firstSeen", Encoders.tuple(Encoders.LONG(), Encoders.INT()), TTLConfig.NONE());
  }

  /**
   * A TIMESTAMP value (a {@link Timestamp} or an {@link Instant}) in epoch milliseconds; {@code Long.MIN_VALUE}
   * for NULL, which cannot be placed in any window and so counts as its own occurrence. Public for
   * bench/PartitionDedupProbe.java, which reads event times as this operator does.
   */
  public static long eventMillis(Object v) {
    if (v instanceof Timestamp) {
      return ((Timestamp) v).getTime();
    }
    if (v instanceof Instant) {
      return ((Instant) v).toEpochMilli();
    }
    return Long.MIN_VALUE;
  }

  /** The row plus its duplicate flag (and, with {@code withLate}, its late flag): this operator's output row. */
  public static Row withFlags(Row row, boolean duplicate, boolean withLate, boolean late) {
    Object[] values = new Object[row.length() + (withLate ? 2 : 1)];
    for (int i = 0; i < row.length(); i++) {
      values[i] = row.get(i);
    }
    values[row.length()] = duplicate;
    if (withLate) {
      values[row.length() + 1] = late;
    }
    return RowFactory.create(values);
  }

  private boolean isLate(Row row, long watermark) {
    long t = rule.eventMs(row);
    if (!flagLate || t == Long.MIN_VALUE) {
      return false;
    }
    return lateAtWatermark ? t <= watermark : t < watermark;
  }

  @Override
  public Iterator<Row> handleInputRows(Row key, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    List<Row> batch = new ArrayList<>();
    long watermark = flagLate ? timerValues.getCurrentWatermarkInMs() : Long.MIN_VALUE;
    while (rows.hasNext()) {
      Row row = rows.next();
      if (rule.passesThrough(row)) {
        out.add(rule.passed(row));
      } else if (isLate(row, watermark)) {
        out.add(rule.late(row));
      } else {
        batch.add(row);
      }
    }
    if (batch.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    Tuple2<Long, Integer> stored = firstSeen.get(); // null when absent: one RocksDB read
    Tuple2<Long, Integer> moved = rule.apply(batch, stored, out);
    if (moved != null) {
      // A key's only timer is at its current first + window (handleExpiredTimer relies on it).
      if (stored != null) {
        getHandle().deleteTimer(stored._1() + rule.windowMs());
      }
      firstSeen.update(moved);
      getHandle().registerTimer(moved._1() + rule.windowMs());
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /**
   * A key's only timer is the one at its current first + window: whenever the first moves,
   * {@link #handleInputRows} deletes the old timer before it registers the new one (every version of
   * this operator has), so a timer that fires always closes the current window and the state goes
   * without being read first. Once the watermark has expired a timer per new key, that read was a
   * third of the RocksDB calls of each expiry.
   */
  @Override
  public Iterator<Row> handleExpiredTimer(
      Row key, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    firstSeen.clear();
    return CollectionConverters.asScala(Collections.<Row>emptyIterator());
  }
}
