package io.glasspipe.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The temporal join ({@link JoinPairing}) grouped by a bucket of the key, with one event-time timer a bucket to sweep
 * it instead of one a key ({@link KeyBuckets}: why, and the timer's grid), as {@link BucketDedupProcessor} has.
 *
 * <p>A bucket keeps its keys in a map state (key to each side's rows inside their window) and one sweep timer, on a
 * grid of half a window at or after the earliest expiry of its rows, offset by the bucket's number. When it fires,
 * the bucket's keys are read, rows whose window the watermark has passed go, keys left with none go, and the timer
 * is set again for the earliest left. A key's fresh rows also drop its expired ones when its state is written anyway.
 *
 * <p>A row may thus be kept up to a grid step past its window. That changes no match: a row that reaches the state is
 * not late, so it is more than a window after any row whose window the watermark has passed, and matches none of
 * them. But a left join emits a left row that matched nothing when the watermark passes its window, which must not
 * wait for the grid. So a left join also keeps, a bucket, the keys of left rows that had no match when they
 * arrived, by the row's expiry ({@code pending}: expiry ms to keys), with an exact timer at each such expiry. That
 * timer reads only those keys; a row matched since then is not emitted, only dropped. Where most left rows find
 * their match in the batch they arrive in, or after it, a left join costs about what an inner one does.
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
  private final boolean leftOuter;
  private final int[] keyIndexes;
  private final StructType keySchema;
  private final StructType stateSchema;
  private final StructType pendingSchema;
  private final long gridMs;
  private transient MapState<Row, Row> stored;
  /** A left join's keys of left rows unmatched on arrival, by the rows' expiry (ms); one timer each. */
  private transient MapState<Long, Row> pending;
  /** A left join's sweep timer (an inner join reads its only timer from Spark's timers instead). */
  private transient ValueState<Long> sweep;

  BucketJoinProcessor(JoinPairing pairing, boolean leftOuter, int[] keyIndexes, StructType keySchema,
      StructType stateSchema) {
    this.pairing = pairing;
    this.leftOuter = leftOuter;
    this.keyIndexes = keyIndexes.clone();
    this.keySchema = keySchema;
    this.stateSchema = stateSchema;
    this.pendingSchema = new StructType().add("keys", DataTypes.createArrayType(keySchema, false), false);
    this.gridMs = KeyBuckets.gridMs(pairing.windowMs(), GRID_PARTS);
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    stored = getHandle().getMapState("rows", Encoders.row(keySchema), Encoders.row(stateSchema), TTLConfig.NONE());
    if (leftOuter) {
      pending = getHandle().getMapState("pending", Encoders.LONG(), Encoders.row(pendingSchema), TTLConfig.NONE());
      sweep = getHandle().getValueState("sweep", Encoders.LONG(), TTLConfig.NONE());
    }
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
    Map<Long, Set<Row>> unmatched = new TreeMap<>();
    for (Map.Entry<Row, JoinPairing.Sides> e : byKey.entrySet()) {
      Row key = e.getKey();
      JoinPairing.Sides fresh = e.getValue();
      if (fresh.isEmpty()) {
        continue; // only late rows
      }
      if (JoinPairing.anyNull(key)) {
        // a NULL key matches nothing: an inner join drops such rows; a left join's left rows are final at once
        if (leftOuter) {
          pairing.unmatchedNow(key, fresh, out);
        }
        continue;
      }
      JoinPairing.Sides kept = pairing.decode(stored.getValue(key));
      pairing.evict(key, kept, watermark, out);
      pairing.pair(key, fresh, kept, out);
      stored.updateValue(key, pairing.encode(kept));
      earliest = Math.min(earliest, pairing.earliestExpiry(fresh));
      if (leftOuter) {
        for (JoinPairing.Entry l : fresh.left) {
          if (!l.matched) {
            unmatched.computeIfAbsent(pairing.expiryMs(l), t -> new LinkedHashSet<>()).add(key);
          }
        }
      }
    }
    for (Map.Entry<Long, Set<Row>> e : unmatched.entrySet()) {
      addPending(e.getKey(), e.getValue());
    }
    if (earliest != Long.MAX_VALUE) {
      if (leftOuter) {
        keepSweepBefore(bucket, earliest);
      } else {
        KeyBuckets.keepTimerBefore(getHandle(), bucket, earliest, gridMs);
      }
    }
    return JoinPairing.iterator(out);
  }

  /** Adds keys due at {@code expiry}, with a timer there unless one is set (for these keys or the sweep). */
  private void addPending(long expiry, Set<Row> keys) {
    Row had = pending.getValue(expiry);
    Set<Row> all = new LinkedHashSet<>();
    if (had != null) {
      all.addAll(had.getList(0));
    } else if (!isSweep(expiry)) {
      getHandle().registerTimer(expiry);
    }
    all.addAll(keys);
    pending.updateValue(expiry, RowFactory.create(CollectionConverters.asScala(new ArrayList<>(all)).toSeq()));
  }

  private boolean isSweep(long timer) {
    return sweep.exists() && sweep.get() == timer;
  }

  /** A left join's {@link KeyBuckets#keepTimerBefore}: the sweep timer, kept where a pending expiry shares it. */
  private void keepSweepBefore(Row bucket, long expiry) {
    long wanted = KeyBuckets.timerFor(bucket, expiry, gridMs);
    Long current = sweep.exists() ? sweep.get() : null;
    if (current != null && wanted >= current) {
      return;
    }
    if (current != null && !pending.containsKey(current)) {
      getHandle().deleteTimer(current);
    }
    setSweep(wanted);
  }

  private void setSweep(long timer) {
    if (!pending.containsKey(timer)) {
      getHandle().registerTimer(timer);
    }
    sweep.update(timer);
  }

  /**
   * A left join's pending timer emits the rows due then that never matched (evicting the keys it reads); the sweep
   * timer reads the bucket's keys: rows whose window the watermark has passed go, and keys left with none; the
   * sweep is set again for the earliest row left (Spark deletes the timer that fired). One timer may be both. Keys
   * are written as they are read, which Spark's RocksDB store allows ({@link BucketDedupProcessor#handleExpiredTimer}).
   */
  @Override
  public Iterator<Row> handleExpiredTimer(Row bucket, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    List<Row> out = new ArrayList<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    if (leftOuter) {
      long fired = expiredTimerInfo.getExpiryTimeInMs();
      Row due = pending.getValue(fired);
      if (due != null) {
        pending.removeKey(fired);
        for (Row key : due.<Row>getList(0)) {
          Row state = stored.getValue(key);
          if (state != null) {
            evictKey(key, pairing.decode(state), watermark, out);
          }
        }
      }
      if (!isSweep(fired)) {
        return JoinPairing.iterator(out);
      }
      sweep.clear();
    }
    long earliest = Long.MAX_VALUE;
    scala.collection.Iterator<Tuple2<Row, Row>> it = stored.iterator();
    while (it.hasNext()) {
      Tuple2<Row, Row> kv = it.next();
      JoinPairing.Sides kept = pairing.decode(kv._2());
      evictKey(kv._1(), kept, watermark, out);
      if (!kept.isEmpty()) {
        earliest = Math.min(earliest, pairing.earliestExpiry(kept));
      }
    }
    if (earliest != Long.MAX_VALUE) {
      long timer = KeyBuckets.timerFor(bucket, earliest, gridMs);
      if (leftOuter) {
        setSweep(timer);
      } else {
        getHandle().registerTimer(timer);
      }
    }
    return JoinPairing.iterator(out);
  }

  /** Drops a key's rows whose window the watermark has passed (a left join emits its unmatched ones) and writes
   * the key back, or removes it when none are left. */
  private void evictKey(Row key, JoinPairing.Sides kept, long watermark, List<Row> out) {
    if (!pairing.evict(key, kept, watermark, out)) {
      return;
    }
    if (kept.isEmpty()) {
      stored.removeKey(key);
    } else {
      stored.updateValue(key, pairing.encode(kept));
    }
  }
}
