package io.glasspipe.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.LongAccumulator;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Deduplication ({@link FirstOccurrence}: first occurrence wins within the window) in {@code transformWithState},
 * grouped by a bucket of the key ({@link KeyBuckets#BUCKETS} of them) instead of by the key, with
 * one event-time timer a bucket instead of one a key.
 *
 * <p>A bucket keeps its keys in a map state (key to first accepted event time and Kafka partition) and one timer
 * ({@link KeyBuckets}: why, and its grid). When the timer fires, the bucket's keys are read, those whose window the
 * watermark has passed are removed, and the timer is set again for the earliest left. In bench/RocksDBStateSim.java
 * at 10 000 events/s, 250 ms batches, a 2 m window, a timer a key's scan over tombstones was 58 of the state's 80
 * CPU-s, and it dominated the tasks' native time on the pipeline (docs/benchmarks-journal.md).
 *
 * <p>A key's state may outlive its window by up to a grid step. That changes no result: a row that reaches the
 * state is not late, so its event time is at or above the watermark, hence at or past the end of any window the
 * watermark has passed, and such a row opens a new window whether the old state is still there or not.
 *
 * <p>Within one micro-batch the rows of a key are taken in event-time order (ties by partition and offset), so a
 * replayed micro-batch with the same rows gives the same result.
 */
public final class BucketDedupProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  /**
   * The timer grid of a single source: a quarter window. A key is read about four times in its life and kept up to
   * a quarter window past it: dedup windows are long (days) and its keys many, so the extra state counts more than
   * the reads (and a single source that minds the reads has {@code deduplication.ownState}, without timers).
   */
  static final int GRID_PARTS = 4;

  /**
   * The timer grid of a join's side: half a window, as the join's own ({@link BucketJoinProcessor}). A key is read
   * about twice and kept up to half a window past it: on a join's side the timers' reads cost a tenth of the pairs
   * once keys leave (docs/benchmarks-journal.md, "A join whose sides are deduplicated first"), and a side that minds
   * them has {@code ownState}, without timers, as a single source has. Only the timers' times change, not the state:
   * a timer set on the other grid fires and the next is set on this one.
   */
  static final int JOIN_SIDE_GRID_PARTS = 2;

  private final int[] keyIndexes;
  private final StructType keySchema;
  private final FirstOccurrence rule;
  private final long gridMs;
  private transient MapState<Row, Tuple2<Long, Integer>> firstSeen;

  public BucketDedupProcessor(int[] keyIndexes, StructType keySchema, int eventTimeIndex, long windowMs,
      boolean emitDropped, int passthroughIndex, int partitionIndex, int offsetIndex,
      LongAccumulator keysInTwoPartitions, boolean flagLate, boolean beforeJoin, int warmupIndex,
      JudgedLate judgedLate) {
    this.keyIndexes = keyIndexes.clone();
    this.keySchema = keySchema;
    this.rule = new FirstOccurrence(eventTimeIndex, windowMs, emitDropped, passthroughIndex, partitionIndex,
        offsetIndex, keysInTwoPartitions, flagLate, beforeJoin, warmupIndex, judgedLate);
    this.gridMs = KeyBuckets.gridMs(windowMs, beforeJoin ? JOIN_SIDE_GRID_PARTS : GRID_PARTS);
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    firstSeen = getHandle().getMapState("firstSeen", Encoders.row(keySchema),
        Encoders.tuple(Encoders.LONG(), Encoders.INT()), TTLConfig.NONE());
  }

  @Override
  public Iterator<Row> handleInputRows(Row bucket, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    Map<Row, List<Row>> byKey = new LinkedHashMap<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    while (rows.hasNext()) {
      Row row = rows.next();
      if (rule.passesThrough(row)) {
        out.add(rule.passed(row));
      } else if (rule.isLate(row, watermark)) {
        out.add(rule.late(row));
      } else {
        byKey.computeIfAbsent(KeyBuckets.keyOf(row, keyIndexes), k -> new ArrayList<>(1)).add(row);
      }
    }
    long earliestNew = Long.MAX_VALUE;
    for (Map.Entry<Row, List<Row>> e : byKey.entrySet()) {
      Tuple2<Long, Integer> moved = rule.apply(e.getValue(), firstSeen.getValue(e.getKey()), out);
      if (moved != null) {
        firstSeen.updateValue(e.getKey(), moved);
        earliestNew = Math.min(earliestNew, moved._1() + rule.windowMs());
      }
    }
    if (earliestNew != Long.MAX_VALUE) {
      KeyBuckets.keepTimerBefore(getHandle(), bucket, earliestNew, gridMs);
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /**
   * The bucket's timer: its keys whose window the watermark has passed go; the timer is set again for the
   * earliest left (Spark deletes the one that fired). A key goes as it is read, not collected first: Spark's
   * RocksDB store iterates a RocksDB iterator over the database itself (a view as of its creation, which later
   * deletes leave alone) and deletes in the database directly, so a bucket's expired keys never sit in the heap
   * together (a quarter of a bucket's keys, ~350 000 at an 8 h window and 50 000 events/s).
   */
  @Override
  public Iterator<Row> handleExpiredTimer(Row bucket, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    long watermark = timerValues.getCurrentWatermarkInMs();
    long earliest = Long.MAX_VALUE;
    scala.collection.Iterator<Tuple2<Row, Tuple2<Long, Integer>>> it = firstSeen.iterator();
    while (it.hasNext()) {
      Tuple2<Row, Tuple2<Long, Integer>> kv = it.next();
      long expiry = kv._2()._1() + rule.windowMs();
      if (expiry <= watermark) {
        firstSeen.removeKey(kv._1());
      } else {
        earliest = Math.min(earliest, expiry);
      }
    }
    if (earliest != Long.MAX_VALUE) {
      getHandle().registerTimer(KeyBuckets.timerFor(bucket, earliest, gridMs));
    }
    return CollectionConverters.asScala(Collections.<Row>emptyIterator());
  }
}
