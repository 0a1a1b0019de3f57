package io.glasspipe.spark;

import java.util.ArrayList;
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
import scala.Tuple2;
import scala.collection.Iterator;

/**
 * The inner temporal join ({@link JoinPairing}) grouped by a bucket of the key, with one event-time timer a bucket
 * instead of one a key ({@link KeyBuckets}: why, and the timer's grid), as {@link BucketDedupProcessor} has.
 *
 * <p>A bucket keeps its keys in a map state (key to each side's rows inside their window) and one timer, on a grid
 * of half a window at or after the earliest expiry of its rows, offset by the bucket's number. When it fires, the
 * bucket's keys are read, rows whose window the watermark has passed go, keys left with none go, and the timer is
 * set again for the earliest left. A key's fresh rows also drop its expired ones when its state is written anyway.
 *
 * <p>A row may thus be kept up to a grid step past its window. That changes no result of an inner join: a row that
 * reaches the state is not late, so it is more than a window after any row whose window the watermark has passed,
 * and matches none of them. A left join emits its unmatched rows at eviction, which must not wait for the grid:
 * it takes {@link JoinProcessor}.
 */
public final class BucketJoinProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  /**
   * The timer grid: half a window. The timers read a key about twice in its life instead of four times on a
   * quarter-window grid, and their time a batch halves; a row stays up to half a window past its window instead of
   * a quarter (docs/benchmarks.md, "An inner join's timers on a half-window grid").
   */
  static final int GRID_PARTS = 2;

  private final JoinPairing pairing;
  private final int[] keyIndexes;
  private final StructType keySchema;
  private final StructType stateSchema;
  private final long gridMs;
  private transient MapState<Row, Row> stored;

  BucketJoinProcessor(JoinPairing pairing, int[] keyIndexes, StructType keySchema, StructType stateSchema) {
    this.pairing = pairing;
    this.keyIndexes = keyIndexes.clone();
    this.keySchema = keySchema;
    this.stateSchema = stateSchema;
    this.gridMs = KeyBuckets.gridMs(pairing.windowMs(), GRID_PARTS);
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    stored = getHandle().getMapState("rows", Encoders.row(keySchema), Encoders.row(stateSchema), TTLConfig.NONE());
  }

  @Override
  public Iterator<Row> handleInputRows(Row bucket, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    Map<Row, JoinPairing.Sides> byKey = new LinkedHashMap<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    while (rows.hasNext()) {
      Row row = rows.next();
      JoinPairing.Sides fresh =
          byKey.computeIfAbsent(KeyBuckets.keyOf(row, keyIndexes), k -> new JoinPairing.Sides());
      pairing.route(row, watermark, out, fresh);
    }
    long earliest = Long.MAX_VALUE;
    for (Map.Entry<Row, JoinPairing.Sides> e : byKey.entrySet()) {
      Row key = e.getKey();
      JoinPairing.Sides fresh = e.getValue();
      if (fresh.isEmpty() || JoinPairing.anyNull(key)) {
        continue; // only late rows; or a NULL key, which matches nothing (an inner join drops such rows)
      }
      JoinPairing.Sides kept = pairing.decode(stored.getValue(key));
      pairing.evict(key, kept, watermark, out);
      pairing.pair(key, fresh, kept, out);
      stored.updateValue(key, pairing.encode(kept));
      earliest = Math.min(earliest, pairing.earliestExpiry(fresh));
    }
    if (earliest != Long.MAX_VALUE) {
      KeyBuckets.keepTimerBefore(getHandle(), bucket, earliest, gridMs);
    }
    return JoinPairing.iterator(out);
  }

  /**
   * The bucket's timer: rows whose window the watermark has passed go, and keys left with none; the timer is set
   * again for the earliest row left (Spark deletes the one that fired). Keys are written as they are read, which
   * Spark's RocksDB store allows ({@link BucketDedupProcessor#handleExpiredTimer}).
   */
  @Override
  public Iterator<Row> handleExpiredTimer(Row bucket, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    List<Row> out = new ArrayList<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    long earliest = Long.MAX_VALUE;
    scala.collection.Iterator<Tuple2<Row, Row>> it = stored.iterator();
    while (it.hasNext()) {
      Tuple2<Row, Row> kv = it.next();
      JoinPairing.Sides kept = pairing.decode(kv._2());
      if (!pairing.evict(kv._1(), kept, watermark, out)) {
        earliest = Math.min(earliest, pairing.earliestExpiry(kept));
      } else if (kept.isEmpty()) {
        stored.removeKey(kv._1());
      } else {
        stored.updateValue(kv._1(), pairing.encode(kept));
        earliest = Math.min(earliest, pairing.earliestExpiry(kept));
      }
    }
    if (earliest != Long.MAX_VALUE) {
      getHandle().registerTimer(KeyBuckets.timerFor(bucket, earliest, gridMs));
    }
    return JoinPairing.iterator(out);
  }
}
