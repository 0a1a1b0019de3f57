package io.glasspipe.spark;

import java.io.Serializable;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The temporal join's rule, applied to one key's new rows of a micro-batch against the rows the key keeps, and the
 * row columns it reads and writes ({@link BucketJoinProcessor} holds the state). See
 * {@link TemporalJoin} for the input columns.
 *
 * <p>A left row and a right row of the same key match when {@code |t_left - t_right| <= window} (both bounds
 * included). A pair is emitted once, when the second of its two rows arrives; a key's new rows are taken left side
 * first, each side sorted by event time, partition and offset, so a replayed batch gives the same rows in the same
 * order and leaves the same state.
 *
 * <p>A kept row may go once the watermark {@code W} reaches {@code t + window}: a row arriving later that is not
 * late has {@code t' > W >= t + window}, so it cannot match (rows with {@code t' <= W} are late: flagged by a side's
 * dedup operator, or, where the late flag is NULL, here, against the same watermark). Late rows pass through without
 * touching state. A warm-up row is late only as the writer that read it first judged it (see {@link #isLate}).
 *
 * <p>Output rows have the input's columns: a joined row has side {@link #JOINED}, both structs, the later of the
 * two event times, the later of the two Kafka timestamps that a row of this batch has (the record whose arrival
 * made the pair; kept rows do not keep theirs), the warm-up flag set only if both rows are warm-up rows, the late
 * flag false; an unmatched left row is the kept left row (warm-up false: written by the layout that closes its
 * window, except a NULL key's, emitted on arrival and so warm-up when its row is; Kafka timestamp NULL, except that
 * NULL key's); a late row passes through with its late flag true.
 *
 * <p>After a hand-over, a warm-up left row whose window an earlier writer closed ({@link ClosedWindows}) was written
 * by that writer, matched or with NULLs: it is dropped on arrival, so it is neither emitted unmatched again nor
 * paired with a fresh right row (one that earlier writer would have found late).
 */
final class JoinPairing implements Serializable {
  private static final long serialVersionUID = 1L;

  static final int LEFT = 0;
  static final int RIGHT = 1;
  static final int JOINED = 2;

  // fields of a kept row (TemporalJoin.entrySchema): an inner join's (t, w, v), a left join's (t, w, m, v)
  private static final int E_TIME = 0;
  private static final int E_WARMUP = 1;
  private static final int E_VALUE_INNER = 2;
  private static final int E_MATCHED_LEFT = 2;
  private static final int E_VALUE_LEFT = 3;

  private final int[] keyIndexes;
  private final int sideIndex;
  private final int eventTimeIndex;
  private final int lateIndex;
  private final int warmupIndex;
  private final int partitionIndex;
  private final int offsetIndex;
  private final int kafkaTimeIndex;
  private final int leftIndex;
  private final int rightIndex;
  private final int width;
  private final long windowMicros;
  private final boolean leftOuter;
  private final ClosedWindows closedLeft;
  private final JudgedLate[] judgedLate; // by side

  /** A kept row of one side, decoded. */
  static final class Entry {
    final Object time;
    final long micros;
    final int partition;
    final long offset;
    final boolean warmup;
    /** A fresh row's Kafka timestamp (NULL on kept rows: the state does not keep it). */
    final Object kafkaTime;
    boolean matched;
    /** The side's fields, carried and never read (their bytes: {@link PackedRows}). */
    final Object value;

    Entry(Object time, int partition, long offset, Object kafkaTime, boolean warmup, boolean matched, Object value) {
      this.time = time;
      this.micros = micros(time);
      this.partition = partition;
      this.offset = offset;
      this.kafkaTime = kafkaTime;
      this.warmup = warmup;
      this.matched = matched;
      this.value = value;
    }
  }

  /** One key's rows: those kept from earlier batches, then this batch's in {@link #ORDER}. */
  static final class Sides {
    final List<Entry> left;
    final List<Entry> right;

    /** No rows yet (a key's rows of a batch, most often one or two). */
    Sides() {
      this(new ArrayList<>(2), new ArrayList<>(2));
    }

    Sides(List<Entry> left, List<Entry> right) {
      this.left = left;
      this.right = right;
    }

    boolean isEmpty() {
      return left.isEmpty() && right.isEmpty();
    }
  }

  static final Comparator<Entry> ORDER = Comparator.<Entry>comparingLong(e -> e.micros)
      .thenComparingInt(e -> e.partition).thenComparingLong(e -> e.offset);

  JoinPairing(int[] keyIndexes, int sideIndex, int eventTimeIndex, int lateIndex, int warmupIndex, int partitionIndex,
      int offsetIndex, int kafkaTimeIndex, int leftIndex, int rightIndex, int width, long windowMicros, boolean leftOuter,
      ClosedWindows closedLeft, JudgedLate judgedLeft, JudgedLate judgedRight) {
    this.keyIndexes = keyIndexes.clone();
    this.sideIndex = sideIndex;
    this.eventTimeIndex = eventTimeIndex;
    this.lateIndex = lateIndex;
    this.warmupIndex = warmupIndex;
    this.partitionIndex = partitionIndex;
    this.offsetIndex = offsetIndex;
    this.kafkaTimeIndex = kafkaTimeIndex;
    this.leftIndex = leftIndex;
    this.rightIndex = rightIndex;
    this.width = width;
    this.windowMicros = windowMicros;
    this.leftOuter = leftOuter;
    this.closedLeft = closedLeft;
    this.judgedLate = new JudgedLate[] {judgedLeft, judgedRight};
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

  long windowMs() {
    return Math.floorDiv(windowMicros, 1000L);
  }

  /** The timer (ms) at which an entry leaves its window: the first watermark with t + window <= W. */
  long expiryMs(Entry e) {
    return Math.floorDiv(e.micros + windowMicros + 999L, 1000L);
  }

  boolean expired(Entry e, long watermarkMs) {
    return e.micros + windowMicros <= watermarkMs * 1000L;
  }

  private boolean matches(Entry l, Entry r) {
    return Math.abs(l.micros - r.micros) <= windowMicros;
  }

  /** The earliest expiry among a key's kept rows ({@code Long.MAX_VALUE} for none). */
  long earliestExpiry(Sides kept) {
    long min = Long.MAX_VALUE;
    for (Entry e : kept.left) {
      min = Math.min(min, expiryMs(e));
    }
    for (Entry e : kept.right) {
      min = Math.min(min, expiryMs(e));
    }
    return min;
  }

  /**
   * A key's kept rows, decoded from its state row ({@code null}: none). Only a batch's fresh rows are sorted by
   * their Kafka coordinates and time a pair's latency by their Kafka timestamp, so the state does not keep them (they
   * decode as -1 and NULL).
   */
  Sides decode(Row state) {
    return new Sides(decodeSide(state, LEFT), decodeSide(state, RIGHT));
  }

  private List<Entry> decodeSide(Row state, int field) {
    List<Entry> out = new ArrayList<>();
    if (state == null || state.isNullAt(field)) {
      return out;
    }
    List<Row> rows = state.getList(field);
    for (Row r : rows) {
      out.add(leftOuter
          ? new Entry(r.get(E_TIME), -1, -1L, null, r.getBoolean(E_WARMUP), r.getBoolean(E_MATCHED_LEFT),
              r.get(E_VALUE_LEFT))
          : new Entry(r.get(E_TIME), -1, -1L, null, r.getBoolean(E_WARMUP), false, r.get(E_VALUE_INNER)));
    }
    return out;
  }

  /** A key's state row (TemporalJoin's state schema). */
  Row encode(Sides kept) {
    return RowFactory.create(encodeSide(kept.left), encodeSide(kept.right));
  }

  private Object encodeSide(List<Entry> entries) {
    List<Row> rows = new ArrayList<>(entries.size());
    for (Entry e : entries) {
      rows.add(leftOuter
          ? RowFactory.create(e.time, e.warmup, e.matched, e.value)
          : RowFactory.create(e.time, e.warmup, e.value));
    }
    return CollectionConverters.asScala(rows).toSeq();
  }

  /**
   * Sorts a batch's rows: late rows (flagged, or NULL-flagged at or below the watermark) go to {@code out} at once;
   * the others are added to {@code fresh}, left or right by their side.
   */
  void route(Row row, long watermarkMs, List<Row> out, Sides fresh) {
    if (row.isNullAt(lateIndex)) {
      if (isLate(row, watermarkMs)) {
        out.add(asLate(row)); // late: a dead letter, never in state
        return;
      }
    } else if (row.getBoolean(lateIndex)) {
      out.add(row); // flagged late by the side's dedup operator
      return;
    }
    int side = row.getInt(sideIndex);
    Entry e = entryOf(row, side);
    if (side == LEFT && e.warmup && closedEarlier(e)) {
      return; // an earlier writer wrote it (see the class comment)
    }
    (side == LEFT ? fresh.left : fresh.right).add(e);
  }

  private boolean isWarmup(Row row) {
    return !row.isNullAt(warmupIndex) && row.getBoolean(warmupIndex);
  }

  /** Whether a writer before the hand-over read this warm-up left row and closed its window. */
  private boolean closedEarlier(Entry l) {
    long f = closedLeft.closedThrough(l.partition, l.offset);
    return f != ClosedWindows.NONE && l.micros <= f * 1000L;
  }

  /**
   * A row whose late flag is NULL (a side without deduplication, so no operator of its own) is late at
   * or below the watermark, as the sides' dedup operators count it ({@code WindowDedup}): the same
   * watermark then decides lateness and eviction, which is what makes eviction exact.
   *
   * <p>A warm-up row is late exactly when the writer that read it first found it late ({@link JudgedLate}; it is in
   * the dead-letter topic): a right row that was late then must not mark an open left row matched now. The new
   * writer's own watermark, which rises with the partition furthest ahead while the warm-up is read over many
   * micro-batches, says nothing about it. (A side's dedup operator judges its warm-up rows the same way.)
   */
  private boolean isLate(Row row, long watermarkMs) {
    if (row.isNullAt(eventTimeIndex)) {
      return false;
    }
    long t = Math.floorDiv(micros(row.get(eventTimeIndex)), 1000L);
    if (isWarmup(row)) {
      return judgedLate[row.getInt(sideIndex)].wasLate(partitionOf(row), offsetOf(row), t);
    }
    return t <= watermarkMs;
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

  private Entry entryOf(Row row, int side) {
    boolean w = !row.isNullAt(warmupIndex) && row.getBoolean(warmupIndex);
    Object kafkaTime = kafkaTimeIndex >= 0 ? row.get(kafkaTimeIndex) : null;
    return new Entry(row.get(eventTimeIndex), partitionOf(row), offsetOf(row), kafkaTime, w, false,
        row.get(side == LEFT ? leftIndex : rightIndex));
  }

  private int partitionOf(Row row) {
    return partitionIndex >= 0 && !row.isNullAt(partitionIndex) ? row.getInt(partitionIndex) : -1;
  }

  private long offsetOf(Row row) {
    return offsetIndex >= 0 && !row.isNullAt(offsetIndex) ? row.getLong(offsetIndex) : -1L;
  }

  /**
   * Pairs a key's fresh rows with its kept rows and with each other (left side first, each side in {@link #ORDER}),
   * emitting each pair to {@code out}, and adds the fresh rows to {@code kept}. Only fresh rows change a key's rows
   * (a kept left row becomes matched only by a fresh right row), so the caller writes the state back when there
   * were any.
   */
  void pair(Row key, Sides fresh, Sides kept, List<Row> out) {
    fresh.left.sort(ORDER);
    fresh.right.sort(ORDER);
    for (Entry l : fresh.left) {
      for (Entry r : kept.right) {
        if (matches(l, r)) {
          out.add(joined(key, l, r));
          l.matched = true;
        }
      }
      kept.left.add(l);
    }
    for (Entry r : fresh.right) {
      for (Entry l : kept.left) {
        if (matches(l, r)) {
          out.add(joined(key, l, r));
          l.matched = true;
        }
      }
      kept.right.add(r);
    }
  }

  /** The unmatched left rows among fresh ones, as a left join emits them for a NULL key (which matches nothing). */
  void unmatchedNow(Row key, Sides fresh, List<Row> out) {
    fresh.left.sort(ORDER);
    for (Entry l : fresh.left) {
      out.add(unmatched(key, l, l.warmup)); // written on arrival: by the writer that read it first
    }
  }

  /**
   * Drops a key's kept rows whose window the watermark has passed, emitting the unmatched left ones to {@code out}
   * in a left join. Returns whether any row went.
   */
  boolean evict(Row key, Sides kept, long watermarkMs, List<Row> out) {
    boolean any = false;
    for (java.util.Iterator<Entry> it = kept.left.iterator(); it.hasNext();) {
      Entry l = it.next();
      if (expired(l, watermarkMs)) {
        if (leftOuter && !l.matched) {
          out.add(unmatched(key, l, false));
        }
        it.remove();
        any = true;
      }
    }
    for (java.util.Iterator<Entry> it = kept.right.iterator(); it.hasNext();) {
      if (expired(it.next(), watermarkMs)) {
        it.remove();
        any = true;
      }
    }
    return any;
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
    if (kafkaTimeIndex >= 0) {
      values[kafkaTimeIndex] = later(l.kafkaTime, r.kafkaTime);
    }
    values[warmupIndex] = l.warmup && r.warmup;
    values[leftIndex] = l.value;
    values[rightIndex] = r.value;
    return RowFactory.create(values);
  }

  /** An unmatched left row; {@code warmup}: written by an earlier layout (then not written again). */
  private Row unmatched(Row key, Entry l, boolean warmup) {
    Object[] values = keyed(key);
    values[sideIndex] = LEFT;
    values[eventTimeIndex] = l.time;
    if (kafkaTimeIndex >= 0) {
      values[kafkaTimeIndex] = l.kafkaTime; // NULL once kept: its window's close, not its arrival, emits it
    }
    values[warmupIndex] = warmup;
    values[leftIndex] = l.value;
    return RowFactory.create(values);
  }

  /** The later of two Kafka timestamps, either NULL (a kept row's). */
  private static Object later(Object a, Object b) {
    if (a == null || b == null) {
      return a == null ? b : a;
    }
    return micros(a) >= micros(b) ? a : b;
  }

  static boolean anyNull(Row key) {
    for (int i = 0; i < key.length(); i++) {
      if (key.isNullAt(i)) {
        return true;
      }
    }
    return false;
  }

  static Iterator<Row> iterator(List<Row> rows) {
    return CollectionConverters.asScala(rows.iterator());
  }
}
