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
import org.apache.spark.sql.types.StructType;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Temporal join of two sides unioned into one stream grouped by the join key(s): a left row and a
 * right row of the same key match when {@code |t_left - t_right| <= window} (both bounds included).
 * See {@link TemporalJoin} for the input columns.
 *
 * <p>State per key: one value holding each side's rows still inside their window (event time, Kafka
 * partition and offset, warm-up flag, for left rows a matched flag, and the side's struct), and one
 * event-time timer at the earliest {@code t + window} among them. A pair is emitted once, in the
 * micro-batch in which the second of its two rows arrives (rows of one batch are taken left side
 * first, each side sorted by event time, partition and offset, so a replayed batch gives the same rows
 * in the same order and leaves the same state).
 *
 * <p>Eviction: a stored row is dropped once the watermark {@code W} reaches {@code t + window}. That
 * loses no match: a row arriving later that is not late has {@code t' > W >= t + window} (rows with
 * {@code t' <= W} are late: flagged by a side's dedup operator, or, where the late flag is NULL, here,
 * against the same watermark; late rows pass through without touching state). A left row evicted without having matched is emitted then, with the right side NULL, when
 * the join is a left join. Eviction reads only the keys whose timer fired (an expiry-ordered index),
 * never the whole state, so a micro-batch costs its own rows plus the expired keys.
 *
 * <p>Output rows have the input's columns: a joined row has side {@link #JOINED}, both structs, the
 * later of the two event times, the warm-up flag set only if both rows are warm-up rows, the late flag
 * false; an unmatched left row is the stored left row (warm-up false); a late row passes through
 * with its late flag true.
 */
public final class JoinProcessor extends StatefulProcessor<Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  public static final int LEFT = 0;
  public static final int RIGHT = 1;
  public static final int JOINED = 2;

  // fields of a stored entry (TemporalJoin.entrySchema)
  private static final int E_TIME = 0;
  private static final int E_PARTITION = 1;
  private static final int E_OFFSET = 2;
  private static final int E_WARMUP = 3;
  private static final int E_MATCHED = 4;
  private static final int E_VALUE = 5;

  private final int[] keyIndexes;
  private final int sideIndex;
  private final int eventTimeIndex;
  private final int lateIndex;
  private final int warmupIndex;
  private final int partitionIndex;
  private final int offsetIndex;
  private final int leftIndex;
  private final int rightIndex;
  private final int width;
  private final long windowMicros;
  private final boolean leftOuter;
  private final StructType stateSchema;
  private transient ValueState<Row> stored;

  /** An entry of one side, decoded. */
  private static final class Entry {
    final Object time;
    final long micros;
    final int partition;
    final long offset;
    final boolean warmup;
    boolean matched;
    final Row value;
    boolean changed;

    Entry(Object time, int partition, long offset, boolean warmup, boolean matched, Row value) {
      this.time = time;
      this.micros = micros(time);
      this.partition = partition;
      this.offset = offset;
      this.warmup = warmup;
      this.matched = matched;
      this.value = value;
    }

    Row toRow() {
      return RowFactory.create(time, partition, offset, warmup, matched, value);
    }
  }

  private static final Comparator<Entry> ORDER = Comparator.<Entry>comparingLong(e -> e.micros)
      .thenComparingInt(e -> e.partition).thenComparingLong(e -> e.offset);

  public JoinProcessor(int[] keyIndexes, int sideIndex, int eventTimeIndex, int lateIndex, int warmupIndex,
      int partitionIndex, int offsetIndex, int leftIndex, int rightIndex, int width, long windowMicros,
      boolean leftOuter, StructType stateSchema) {
    this.keyIndexes = keyIndexes.clone();
    this.sideIndex = sideIndex;
    this.eventTimeIndex = eventTimeIndex;
    this.lateIndex = lateIndex;
    this.warmupIndex = warmupIndex;
    this.partitionIndex = partitionIndex;
    this.offsetIndex = offsetIndex;
    this.leftIndex = leftIndex;
    this.rightIndex = rightIndex;
    this.width = width;
    this.windowMicros = windowMicros;
    this.leftOuter = leftOuter;
    this.stateSchema = stateSchema;
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TaskConf.pin(); // init runs in the task, before its rows: one SQL conf for all of them
    stored = getHandle().getValueState("rows", Encoders.row(stateSchema), TTLConfig.NONE());
  }

  static long micros(Object v) {
    if (v instanceof Timestamp) {
      Timestamp t = (Timestamp) v;
      return Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000;
    }
    if (v instanceof Instant) {
      Instant t = (Instant) v;
      return t.getEpochSecond() * 1_000_000L + t.getNano() / 1000;
    }
    throw new IllegalStateException("join input without event time: " + v);
  }

  /** The timer (ms) at which an entry leaves its window: the first watermark with t + window <= W. */
  private long expiryMs(Entry e) {
    return Math.floorDiv(e.micros + windowMicros + 999L, 1000L);
  }

  private boolean expired(Entry e, long watermarkMs) {
    return e.micros + windowMicros <= watermarkMs * 1000L;
  }

  private boolean matches(Entry l, Entry r) {
    return Math.abs(l.micros - r.micros) <= windowMicros;
  }

  private static List<Entry> decode(Row state, int field) {
    List<Entry> out = new ArrayList<>();
    if (state == null || state.isNullAt(field)) {
      return out;
    }
    List<Row> rows = state.getList(field);
    for (Row r : rows) {
      out.add(new Entry(r.get(E_TIME), r.getInt(E_PARTITION), r.getLong(E_OFFSET), r.getBoolean(E_WARMUP),
          r.getBoolean(E_MATCHED), r.getStruct(E_VALUE)));
    }
    return out;
  }

  private static Object encodeSide(List<Entry> entries) {
    List<Row> rows = new ArrayList<>(entries.size());
    for (Entry e : entries) {
      rows.add(e.toRow());
    }
    return CollectionConverters.asScala(rows).toSeq();
  }

  private Entry entryOf(Row row, int side) {
    int p = partitionIndex >= 0 && !row.isNullAt(partitionIndex) ? row.getInt(partitionIndex) : -1;
    long o = offsetIndex >= 0 && !row.isNullAt(offsetIndex) ? row.getLong(offsetIndex) : -1L;
    boolean w = !row.isNullAt(warmupIndex) && row.getBoolean(warmupIndex);
    return new Entry(row.get(eventTimeIndex), p, o, w, false, row.getStruct(side == LEFT ? leftIndex : rightIndex));
  }

  private Object[] keyed(Row key) {
    Object[] values = new Object[width];
    for (int i = 0; i < keyIndexes.length; i++) {
      values[keyIndexes[i]] = key.get(i);
    }
    values[lateIndex] = false;
    return values;
  }

  private Row joined(Row key, Entry l, Entry r) {
    Object[] values = keyed(key);
    values[sideIndex] = JOINED;
    values[eventTimeIndex] = l.micros >= r.micros ? l.time : r.time;
    values[warmupIndex] = l.warmup && r.warmup;
    values[leftIndex] = l.value;
    values[rightIndex] = r.value;
    return RowFactory.create(values);
  }

  private Row unmatched(Row key, Entry l) {
    Object[] values = keyed(key);
    values[sideIndex] = LEFT;
    values[eventTimeIndex] = l.time;
    // as Spark's outer join did: an unmatched row is written by the layout that closes its window
    values[warmupIndex] = false;
    values[leftIndex] = l.value;
    return RowFactory.create(values);
  }

  /**
   * A row whose late flag is NULL (a side without deduplication, so no operator of its own) is late at
   * or below the watermark, as the sides' dedup operators count it ({@code WindowDedup}): the same
   * watermark then decides lateness and eviction, which is what makes eviction exact.
   */
  private boolean isLate(Row row, long watermarkMs) {
    return !row.isNullAt(eventTimeIndex) && Math.floorDiv(micros(row.get(eventTimeIndex)), 1000L) <= watermarkMs;
  }

  /** The row with its late flag set (its event time kept, for the dead letter's reason). */
  private Row asLate(Row row) {
    Object[] values = new Object[row.length()];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(i);
    }
    values[lateIndex] = true;
    return RowFactory.create(values);
  }

  private static boolean anyNull(Row key) {
    for (int i = 0; i < key.length(); i++) {
      if (key.isNullAt(i)) {
        return true;
      }
    }
    return false;
  }

  private static long minExpiry(List<Entry> a, List<Entry> b, JoinProcessor p) {
    long min = Long.MAX_VALUE;
    for (Entry e : a) {
      min = Math.min(min, p.expiryMs(e));
    }
    for (Entry e : b) {
      min = Math.min(min, p.expiryMs(e));
    }
    return min;
  }

  @Override
  public Iterator<Row> handleInputRows(Row key, Iterator<Row> rows, TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    List<Entry> newLeft = new ArrayList<>();
    List<Entry> newRight = new ArrayList<>();
    long watermark = timerValues.getCurrentWatermarkInMs();
    while (rows.hasNext()) {
      Row row = rows.next();
      if (row.isNullAt(lateIndex)) {
        if (isLate(row, watermark)) {
          out.add(asLate(row)); // late: a dead letter, never in state
          continue;
        }
      } else if (row.getBoolean(lateIndex)) {
        out.add(row); // flagged late by the side's dedup operator
        continue;
      }
      int side = row.getInt(sideIndex);
      (side == LEFT ? newLeft : newRight).add(entryOf(row, side));
    }
    if (newLeft.isEmpty() && newRight.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    if (anyNull(key)) {
      // a NULL key matches nothing: an unmatched left row is final at once, a right row is dropped as
      // an inner join drops any row that matches nothing
      if (leftOuter) {
        newLeft.sort(ORDER);
        for (Entry l : newLeft) {
          out.add(unmatched(key, l));
        }
      }
      return CollectionConverters.asScala(out.iterator());
    }
    newLeft.sort(ORDER);
    newRight.sort(ORDER);
    Row state = stored.get();
    List<Entry> left = decode(state, LEFT);
    List<Entry> right = decode(state, RIGHT);
    long oldTimer = state == null ? Long.MAX_VALUE : minExpiry(left, right, this);
    boolean leftChanged = !newLeft.isEmpty();
    for (Entry l : newLeft) {
      for (Entry r : right) {
        if (matches(l, r)) {
          out.add(joined(key, l, r));
          l.matched = true;
        }
      }
      left.add(l);
    }
    for (Entry r : newRight) {
      for (Entry l : left) {
        if (matches(l, r)) {
          out.add(joined(key, l, r));
          if (!l.matched) {
            l.matched = true;
            leftChanged = true;
          }
        }
      }
      right.add(r);
    }
    // an inner join never reads the matched flags: only new rows change the state then
    if (leftChanged || !newRight.isEmpty()) {
      stored.update(RowFactory.create(encodeSide(left), encodeSide(right)));
    }
    long timer = minExpiry(left, right, this);
    if (timer != oldTimer) {
      if (oldTimer != Long.MAX_VALUE) {
        getHandle().deleteTimer(oldTimer);
      }
      getHandle().registerTimer(timer);
    }
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public Iterator<Row> handleExpiredTimer(Row key, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    Row state = stored.get();
    if (state == null) {
      return CollectionConverters.asScala(Collections.<Row>emptyIterator());
    }
    long watermark = Math.max(timerValues.getCurrentWatermarkInMs(), expiredTimerInfo.getExpiryTimeInMs());
    List<Row> out = new ArrayList<>();
    List<Entry> left = new ArrayList<>();
    List<Entry> right = new ArrayList<>();
    for (Entry l : decode(state, LEFT)) {
      if (!expired(l, watermark)) {
        left.add(l);
      } else if (leftOuter && !l.matched) {
        out.add(unmatched(key, l));
      }
    }
    for (Entry r : decode(state, RIGHT)) {
      if (!expired(r, watermark)) {
        right.add(r);
      }
    }
    if (left.isEmpty() && right.isEmpty()) {
      stored.clear();
    } else {
      stored.update(RowFactory.create(encodeSide(left), encodeSide(right)));
      getHandle().registerTimer(minExpiry(left, right, this));
    }
    return CollectionConverters.asScala(out.iterator());
  }
}
