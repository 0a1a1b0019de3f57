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
 * arrived ({@code pending}), by slots of {@link #SLOT_MS} of the rows' expiry, each slot with an exact timer at
 * its earliest expiry. When it fires, the slot's keys due by the watermark are read (a row matched since then is
 * not emitted, only dropped) and the timer set again at the earliest expiry left in the slot. So a bucket fires a
 * pending timer about once a batch however many of its rows are due, not once for each distinct millisecond of
 * expiry (docs/benchmarks-journal.md, "A left join's waiting rows in slots"), and a row is still written in the batch
 * whose watermark passes its window.
 */
public final class BucketJoinProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  /**
   * The timer grid: half a window. The timers read a key about twice in its life instead of four times on a
   * quarter-window grid, and their time a batch halves; a row stays up to half a window past its window instead of
   * a quarter (docs/benchmarks-journal.md, "An inner join's timers on a half-window grid").
   */
  static final int GRID_PARTS = 2;

  /**
   * A left join's pending slot, in ms of expiry: its keys are read and rewritten as a list when rows are added or
   * due, so a slot holds a few seconds of a bucket's unmatched rows; wider than a micro-batch's step of the watermark,
   * so most buckets fire one pending timer a batch.
   */
  static final long SLOT_MS = 4_000L;

  private final JoinPairing pairing;
  private final boolean leftOuter;
  private final int[] keyIndexes;
  private final StructType keySchema;
  private final StructType stateSchema;
  private final StructType pendingSchema;
  private final long gridMs;
  private transient MapState<Row, Row> stored;
  /** A left join's keys of left rows unmatched on arrival, by their expiry's slot: its timer and (expiry, key)s. */
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
    this.pendingSchema = new StructType()
        .add("timer", DataTypes.LongType, false)
        .add("expiries", DataTypes.createArrayType(DataTypes.LongType, false), false)
        .add("keys", DataTypes.createArrayType(keySchema, false), false);
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
    Map<Long, Slot> unmatched = new TreeMap<>();
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
            long expiry = pairing.expiryMs(l);
            unmatched.computeIfAbsent(slotOf(expiry), n -> new Slot()).add(expiry, key);
          }
        }
      }
    }
    for (Map.Entry<Long, Slot> e : unmatched.entrySet()) {
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

  /** A pending slot's number: its expiries' {@link #SLOT_MS} step (its timer lies in it: slots share no timer). */
  static long slotOf(long expiryMs) {
    return Math.floorDiv(expiryMs, SLOT_MS);
  }

  /** A pending slot's (expiry, key)s, and the timer it has set (its earliest expiry when written). */
  private static final class Slot {
    long timer = Long.MAX_VALUE;
    final List<Long> expiries = new ArrayList<>();
    final List<Row> keys = new ArrayList<>();

    void add(long expiry, Row key) {
      expiries.add(expiry);
      keys.add(key);
    }

    long earliest() {
      long min = Long.MAX_VALUE;
      for (long e : expiries) {
        min = Math.min(min, e);
      }
      return min;
    }
  }

  private Slot readSlot(long slot) {
    Row had = pending.getValue(slot);
    Slot s = new Slot();
    if (had != null) {
      s.timer = had.getLong(0);
      s.expiries.addAll(had.<Long>getList(1));
      s.keys.addAll(had.<Row>getList(2));
    }
    return s;
  }

  private void writeSlot(long slot, Slot s) {
    pending.updateValue(slot, RowFactory.create(s.timer, CollectionConverters.asScala(s.expiries).toSeq(),
        CollectionConverters.asScala(s.keys).toSeq()));
  }

  private boolean isSweep(long timer) {
    return sweep.exists() && sweep.get() == timer;
  }

  /** Whether a pending slot's timer is {@code timer} (then the sweep may not delete it). */
  private boolean isPendingTimer(long timer) {
    Row had = pending.getValue(slotOf(timer));
    return had != null && had.getLong(0) == timer;
  }

  /** Adds a batch's unmatched (expiry, key)s to their slot, moving the slot's timer to the earliest of them. */
  private void addPending(long slot, Slot fresh) {
    Slot s = readSlot(slot);
    long had = s.timer;
    s.expiries.addAll(fresh.expiries);
    s.keys.addAll(fresh.keys);
    s.timer = Math.min(had, fresh.earliest());
    if (s.timer != had) {
      if (had != Long.MAX_VALUE && !isSweep(had)) {
        getHandle().deleteTimer(had);
      }
      if (!isSweep(s.timer)) {
        getHandle().registerTimer(s.timer);
      }
    }
    writeSlot(slot, s);
  }

  /**
   * A pending slot's timer fired: the keys whose rows are due by the watermark are read (emitting their unmatched
   * rows, evicting the key); the others stay, with the timer set again at the earliest of them.
   */
  private void firePending(long fired, long watermark, List<Row> out) {
    long slot = slotOf(fired);
    Slot s = readSlot(slot);
    if (s.timer != fired) {
      return; // the sweep's timer, in a slot with another timer or none
    }
    Set<Row> due = new LinkedHashSet<>();
    Slot rest = new Slot();
    for (int i = 0; i < s.expiries.size(); i++) {
      long expiry = s.expiries.get(i);
      if (expiry <= watermark) {
        due.add(s.keys.get(i));
      } else {
        rest.add(expiry, s.keys.get(i));
      }
    }
    for (Row key : due) {
      Row state = stored.getValue(key);
      if (state != null) {
        evictKey(key, pairing.decode(state), watermark, out);
      }
    }
    if (rest.expiries.isEmpty()) {
      pending.removeKey(slot);
      return;
    }
    rest.timer = rest.earliest(); // after the watermark: a later batch's
    if (!isSweep(rest.timer)) {
      getHandle().registerTimer(rest.timer);
    }
    writeSlot(slot, rest);
  }

  /** A left join's {@link KeyBuckets#keepTimerBefore}: the sweep timer, kept where a pending expiry shares it. */
  private void keepSweepBefore(Row bucket, long expiry) {
    long wanted = KeyBuckets.timerFor(bucket, expiry, gridMs);
    Long current = sweep.exists() ? sweep.get() : null;
    if (current != null && wanted >= current) {
      return;
    }
    if (current != null && !isPendingTimer(current)) {
      getHandle().deleteTimer(current);
    }
    setSweep(wanted);
  }

  private void setSweep(long timer) {
    if (!isPendingTimer(timer)) {
      getHandle().registerTimer(timer);
    }
    sweep.update(timer);
  }

  /**
   * A left join's pending timer emits its slot's rows due by then that never matched (evicting the keys it reads);
   * the sweep timer reads the bucket's keys: rows whose window the watermark has passed go, and keys left with
   * none; the sweep is set again for the earliest row left (Spark deletes the timer that fired). One timer may be
   * both. Keys are written as they are read, which Spark's RocksDB store allows
   * ({@link BucketDedupProcessor#handleExpiredTimer}).
   */
  @Override
  public Iterator<Row> handleExpiredTimer(Row bucket, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    List<Row> out = new ArrayList<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    if (leftOuter) {
      long fired = expiredTimerInfo.getExpiryTimeInMs();
      firePending(fired, watermark, out);
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
