package io.glasspipe.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;
import scala.collection.Iterator;

/**
 * The left temporal join ({@link JoinPairing}) grouped by the join key, with one value (each side's rows still inside
 * their window) and one event-time timer a key, at the earliest {@code t + window} among its rows: a left row
 * that matched nothing is emitted, right side NULL, in the first micro-batch whose watermark passes its
 * {@code t + window} (docs/semantics.md), which a timer a key gives exactly. Inner joins take
 * {@link BucketJoinProcessor}, whose timers are coarser and cheaper.
 *
 * <p>Eviction reads only the keys whose timer fired (an expiry-ordered index), never the whole state, so a
 * micro-batch costs its own rows plus the expired keys; but Spark's timer scan steps over the tombstones of timers
 * fired since RocksDB last compacted them (see {@link BucketDedupProcessor}).
 */
public final class JoinProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final JoinPairing pairing;
  private final StructType stateSchema;
  private transient ValueState<Row> stored;

  JoinProcessor(JoinPairing pairing, StructType stateSchema) {
    this.pairing = pairing;
    this.stateSchema = stateSchema;
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    stored = getHandle().getValueState("rows", Encoders.row(stateSchema), TTLConfig.NONE());
  }

  @Override
  public Iterator<Row> handleInputRows(Row key, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    JoinPairing.Sides fresh = new JoinPairing.Sides();
    long watermark = timerValues.getCurrentWatermarkInMs();
    while (rows.hasNext()) {
      pairing.route(rows.next(), watermark, out, fresh);
    }
    if (fresh.isEmpty()) {
      return JoinPairing.iterator(out);
    }
    if (JoinPairing.anyNull(key)) {
      // a NULL key matches nothing: an unmatched left row is final at once, a right row is dropped
      pairing.unmatchedNow(key, fresh, out);
      return JoinPairing.iterator(out);
    }
    Row state = stored.get();
    JoinPairing.Sides kept = pairing.decode(state);
    long oldTimer = state == null ? Long.MAX_VALUE : pairing.earliestExpiry(kept);
    pairing.pair(key, fresh, kept, out);
    stored.update(pairing.encode(kept));
    long timer = pairing.earliestExpiry(kept);
    if (timer != oldTimer) {
      if (oldTimer != Long.MAX_VALUE) {
        getHandle().deleteTimer(oldTimer);
      }
      getHandle().registerTimer(timer);
    }
    return JoinPairing.iterator(out);
  }

  @Override
  public Iterator<Row> handleExpiredTimer(Row key, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    List<Row> out = new ArrayList<>();
    Row state = stored.get();
    if (state == null) {
      return JoinPairing.iterator(out);
    }
    long watermark = Math.max(timerValues.getCurrentWatermarkInMs(), expiredTimerInfo.getExpiryTimeInMs());
    JoinPairing.Sides kept = pairing.decode(state);
    pairing.evict(key, kept, watermark, out);
    if (kept.isEmpty()) {
      stored.clear();
    } else {
      stored.update(pairing.encode(kept));
      getHandle().registerTimer(pairing.earliestExpiry(kept));
    }
    return JoinPairing.iterator(out);
  }
}
