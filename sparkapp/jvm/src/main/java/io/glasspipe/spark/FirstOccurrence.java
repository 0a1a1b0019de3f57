package io.glasspipe.spark;

import java.io.Serializable;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.util.LongAccumulator;
import scala.Tuple2;

/**
 * The deduplication rule, applied to one key's rows of a micro-batch against the key's first occurrence, and the
 * row columns it reads ({@link BucketDedupProcessor} holds the state).
 *
 * <p>First occurrence of a key wins; a later row of that key is a duplicate when its event time lies within a
 * window of the first one (first - window &lt; t &lt; first + window). Once the window has passed, the next row
 * of the key is accepted and opens a new window. A row more than a window <em>earlier</em> than the first one
 * (possible when the allowed lateness exceeds the window) is not a duplicate either: it is accepted, and the state
 * keeps the later first occurrence. A key's state may go once the watermark passes first + window: a row arriving
 * after that has an event time at or above the watermark (older rows are late), so it lies outside the old
 * window and accepting it is correct.
 *
 * <p>Late rows: with late flags the caller has kept Spark from dropping rows below the watermark ({@link
 * WindowDedup}); they are emitted with the late flag set, without reading or changing any state, so that they
 * reach the dead-letter topic. Before a join a row is late at the watermark too, as the join operator counts it
 * ({@code t <= watermark}). A warm-up row (read again after a hand-over to rebuild the state) is late exactly when
 * the writer that read it first found it late ({@link JudgedLate}): that writer dead-lettered it, so it must not
 * seed its key's state now. The new writer's own watermark, which rises with the partition furthest ahead while the
 * warm-up is read over many micro-batches, says nothing about it.
 *
 * <p>Within one micro-batch the rows of a key are taken in event-time order (ties by partition and offset), so a
 * replayed micro-batch with the same rows gives the same result.
 *
 * <p>The state also keeps the Kafka partition of the first occurrence: a key seen again in another partition
 * within its window is counted in {@code keysInTwoPartitions}, because deduplication is only exact when the topic
 * is partitioned by the key (each partition is owned by one replica).
 */
public final class FirstOccurrence implements Serializable {
  private static final long serialVersionUID = 1L;

  private final int eventTimeIndex;
  private final long windowMs;
  private final boolean emitDropped;
  private final int passthroughIndex;
  private final int partitionIndex;
  private final int offsetIndex;
  private final LongAccumulator keysInTwoPartitions;
  private final boolean withLate;
  private final boolean lateAtWatermark;
  private final int warmupIndex;
  private final JudgedLate judgedLate;

  /**
   * @param withLate the output rows carry a late flag after the duplicate flag
   * @param lateAtWatermark a row at the watermark is late too (before a join, which counts it so)
   * @param warmupIndex the BOOLEAN warm-up column (-1: none); a warm-up row is late as its first writer judged it
   * @param judgedLate the warm-up rows the writers before the hand-over found late
   */
  FirstOccurrence(int eventTimeIndex, long windowMs, boolean emitDropped, int passthroughIndex, int partitionIndex,
      int offsetIndex, LongAccumulator keysInTwoPartitions, boolean withLate, boolean lateAtWatermark,
      int warmupIndex, JudgedLate judgedLate) {
    this.eventTimeIndex = eventTimeIndex;
    this.windowMs = windowMs;
    this.emitDropped = emitDropped;
    this.passthroughIndex = passthroughIndex;
    this.partitionIndex = partitionIndex;
    this.offsetIndex = offsetIndex;
    this.keysInTwoPartitions = keysInTwoPartitions;
    this.withLate = withLate;
    this.lateAtWatermark = lateAtWatermark;
    this.warmupIndex = warmupIndex;
    this.judgedLate = judgedLate;
  }

  /**
   * A TIMESTAMP value (a {@link Timestamp} or an {@link Instant}) in epoch milliseconds; {@code Long.MIN_VALUE}
   * for NULL, which cannot be placed in any window and so counts as its own occurrence. Public for
   * bench/PartitionDedupProbe.java, which reads event times as this rule does.
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

  /** The row plus its duplicate flag (and, with {@code withLate}, its late flag): the output row. */
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

  long windowMs() {
    return windowMs;
  }

  long eventMs(Row row) {
    return eventMillis(row.get(eventTimeIndex));
  }

  private long offsetOf(Row row) {
    return offsetIndex >= 0 && !row.isNullAt(offsetIndex) ? row.getLong(offsetIndex) : 0L;
  }

  private int partitionOf(Row row) {
    return partitionIndex >= 0 && !row.isNullAt(partitionIndex) ? row.getInt(partitionIndex) : -1;
  }

  /**
   * With late flags, a row below the watermark (or at it, before a join): Spark would have dropped it had the
   * caller not kept it from doing so ({@link WindowDedup}), so it goes to the dead-letter topic. Without late
   * flags, Spark has already dropped such rows. A warm-up row is late as its first writer judged it (see the class
   * comment).
   */
  boolean isLate(Row row, long watermarkMs) {
    long t = eventMs(row);
    if (!withLate || t == Long.MIN_VALUE) {
      return false;
    }
    if (isWarmup(row)) {
      return judgedLate.wasLate(partitionOf(row), offsetOf(row), t);
    }
    return lateAtWatermark ? t <= watermarkMs : t < watermarkMs;
  }

  private boolean isWarmup(Row row) {
    return warmupIndex >= 0 && !row.isNullAt(warmupIndex) && row.getBoolean(warmupIndex);
  }

  /** A row that bypasses the state (e.g. a record bound for the dead-letter topic). */
  boolean passesThrough(Row row) {
    return passthroughIndex >= 0 && !row.isNullAt(passthroughIndex) && row.getBoolean(passthroughIndex);
  }

  /** A passing-through row as it is emitted: kept, not late. */
  Row passed(Row row) {
    return emitDropped ? withFlags(row, false, withLate, false) : row;
  }

  /** A late row as it is emitted: flagged late, state untouched. */
  Row late(Row row) {
    return withFlags(row, false, withLate, true);
  }

  /**
   * One key's rows of the batch (not late, not passing through) against its stored first occurrence (null: none):
   * appends the rows to emit to {@code out} and returns the key's new first occurrence (event time ms, Kafka
   * partition), or null when it did not change. Rows are taken in event-time order, ties by Kafka partition and
   * offset, so a replayed batch (whose rows may arrive in another order after the shuffle) keeps the same rows.
   */
  Tuple2<Long, Integer> apply(List<Row> batch, Tuple2<Long, Integer> stored, List<Row> out) {
    if (batch.size() > 1) {
      batch.sort(Comparator.comparingLong(this::eventMs)
          .thenComparingInt(this::partitionOf)
          .thenComparingLong(this::offsetOf));
    }
    boolean exists = stored != null;
    long first = exists ? stored._1() : Long.MIN_VALUE;
    int firstPartition = exists ? stored._2() : -1;
    long oldFirst = first;
    for (Row row : batch) {
      long t = eventMs(row);
      boolean duplicate = exists && t != Long.MIN_VALUE && t > first - windowMs && t < first + windowMs;
      int partition = partitionOf(row);
      if (duplicate && partition != firstPartition && keysInTwoPartitions != null) {
        keysInTwoPartitions.add(1L);
      }
      // A new window opens only forward in time: an accepted straggler from more than a window
      // before the first occurrence leaves the (later) first occurrence in place.
      if (!duplicate && t != Long.MIN_VALUE && (!exists || t >= first + windowMs)) {
        first = t;
        firstPartition = partition;
        exists = true;
      }
      if (emitDropped) {
        out.add(withFlags(row, duplicate, withLate, false));
      } else if (!duplicate) {
        out.add(row);
      }
    }
    return exists && (stored == null || first != oldFirst) ? new Tuple2<>(first, firstPartition) : null;
  }
}
