package io.glasspipe.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
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
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * First occurrence of a key wins; later rows of that key whose event time is before
 * first + window are duplicates. Once the window has passed, the next row of the key is accepted
 * and opens a new window. The state (first accepted event time, ms) is cleared by an event-time
 * timer at first + window, i.e. when the watermark passes the end of the window: a row arriving
 * after that has an event time at or above the watermark (older rows are dropped as late by
 * Spark), so it lies outside the old window and accepting it is correct.
 *
 * <p>Within one micro-batch the rows of a key are taken in event-time order (ties keep input
 * order), so a replayed micro-batch with the same rows gives the same result.
 */
public final class DedupProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final int eventTimeIndex;
  private final long windowMs;
  private final boolean emitDropped;
  private final int passthroughIndex;
  private transient ValueState<Long> firstSeenMs;

  /**
   * @param passthroughIndex index of a boolean column; rows where it is true (e.g. records bound
   *     for the dead-letter topic) are emitted as kept without reading or changing any state. -1:
   *     no such column.
   */
  public DedupProcessor(int eventTimeIndex, long windowMs, boolean emitDropped, int passthroughIndex) {
    this.eventTimeIndex = eventTimeIndex;
    this.windowMs = windowMs;
    this.emitDropped = emitDropped;
    this.passthroughIndex = passthroughIndex;
  }

  private boolean passesThrough(Row row) {
    return passthroughIndex >= 0 && !row.isNullAt(passthroughIndex) && row.getBoolean(passthroughIndex);
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    firstSeenMs = getHandle().getValueState("firstSeenMs", Encoders.LONG(), TTLConfig.NONE());
  }

  private long eventMs(Row row) {
    Object v = row.get(eventTimeIndex);
    if (v instanceof Timestamp) {
      return ((Timestamp) v).getTime();
    }
    if (v instanceof Instant) {
      return ((Instant) v).toEpochMilli();
    }
    // A NULL event time cannot be placed in any window: treat it as its own occurrence.
    return Long.MIN_VALUE;
  }

  private Row flagged(Row row, boolean duplicate) {
    Object[] values = new Object[row.length() + 1];
    for (int i = 0; i < row.length(); i++) {
      values[i] = row.get(i);
    }
    values[row.length()] = duplicate;
    return RowFactory.create(values);
  }

  @Override
  public Iterator<Row> handleInputRows(Row key, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    List<Row> batch = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      if (passesThrough(row)) {
        out.add(emitDropped ? flagged(row, false) : row);
      } else {
        batch.add(row);
      }
    }
    if (batch.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    if (batch.size() > 1) {
      batch.sort(Comparator.comparingLong(this::eventMs)); // List.sort is stable
    }
    boolean exists = firstSeenMs.exists();
    long first = exists ? firstSeenMs.get() : Long.MIN_VALUE;
    long oldFirst = first;
    boolean hadState = exists;
    for (Row row : batch) {
      long t = eventMs(row);
      boolean duplicate = exists && t != Long.MIN_VALUE && t < first + windowMs;
      if (!duplicate && t != Long.MIN_VALUE) {
        first = t;
        exists = true;
      }
      if (emitDropped) {
        out.add(flagged(row, duplicate));
      } else if (!duplicate) {
        out.add(row);
      }
    }
    if (exists && (!hadState || first != oldFirst)) {
      if (hadState) {
        getHandle().deleteTimer(oldFirst + windowMs);
      }
      firstSeenMs.update(first);
      getHandle().registerTimer(first + windowMs);
    }
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public Iterator<Row> handleExpiredTimer(
      Row key, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    if (firstSeenMs.exists()
        && firstSeenMs.get() + windowMs <= expiredTimerInfo.getExpiryTimeInMs()) {
      firstSeenMs.clear();
    }
    return CollectionConverters.asScala(Collections.<Row>emptyIterator());
  }
}
