package io.glasspipe.spark;

import java.io.Serializable;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.util.LongAccumulator;
import scala.Tuple2;

/**
 * The deduplication rule both processors apply ({@link DedupProcessor}, a key per group; {@link
 * BucketDedupProcessor}, a bucket of keys per group), to one key's rows of a micro-batch against the key's first
 * occurrence, and the row columns it reads. See {@link DedupProcessor} for the rule.
 */
final class FirstOccurrence implements Serializable {
  private static final long serialVersionUID = 1L;

  private final int eventTimeIndex;
  private final long windowMs;
  private final boolean emitDropped;
  private final int passthroughIndex;
  private final int partitionIndex;
  private final int offsetIndex;
  private final LongAccumulator keysInTwoPartitions;
  private final boolean withLate;

  /** @param withLate the output rows carry a late flag after the duplicate flag */
  FirstOccurrence(int eventTimeIndex, long windowMs, boolean emitDropped, int passthroughIndex, int partitionIndex,
      int offsetIndex, LongAccumulator keysInTwoPartitions, boolean withLate) {
    this.eventTimeIndex = eventTimeIndex;
    this.windowMs = windowMs;
    this.emitDropped = emitDropped;
    this.passthroughIndex = passthroughIndex;
    this.partitionIndex = partitionIndex;
    this.offsetIndex = offsetIndex;
    this.keysInTwoPartitions = keysInTwoPartitions;
    this.withLate = withLate;
  }

  long windowMs() {
    return windowMs;
  }

  long eventMs(Row row) {
    return DedupProcessor.eventMillis(row.get(eventTimeIndex));
  }

  private long offsetOf(Row row) {
    return offsetIndex >= 0 && !row.isNullAt(offsetIndex) ? row.getLong(offsetIndex) : 0L;
  }

  private int partitionOf(Row row) {
    return partitionIndex >= 0 && !row.isNullAt(partitionIndex) ? row.getInt(partitionIndex) : -1;
  }

  /** A row that bypasses the state (e.g. a record bound for the dead-letter topic). */
  boolean passesThrough(Row row) {
    return passthroughIndex >= 0 && !row.isNullAt(passthroughIndex) && row.getBoolean(passthroughIndex);
  }

  /** A passing-through row as it is emitted: kept, not late. */
  Row passed(Row row) {
    return emitDropped ? DedupProcessor.withFlags(row, false, withLate, false) : row;
  }

  /** A late row as it is emitted: flagged late, state untouched. */
  Row late(Row row) {
    return DedupProcessor.withFlags(row, false, withLate, true);
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
        out.add(DedupProcessor.withFlags(row, duplicate, withLate, false));
      } else if (!duplicate) {
        out.add(row);
      }
    }
    return exists && (stored == null || first != oldFirst) ? new Tuple2<>(first, firstPartition) : null;
  }
}
