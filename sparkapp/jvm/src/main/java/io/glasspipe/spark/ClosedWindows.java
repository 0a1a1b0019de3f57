package io.glasspipe.spark;

import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;

/**
 * How far the writers before a hand-over closed the left join's windows, per Kafka partition of the left side: for
 * each earlier writer that read past the warm-up start, its end offset and the event time up to which it closed left
 * windows, its watermark minus its join window (glasspipe_job.handover.closed_windows). A warm-up left row at offset
 * {@code o} was read by the writers whose end offset is above {@code o}; if one of them closed event times up to
 * {@code F >= t}, it wrote the row (matched or with NULLs) and the new writer must not emit it again.
 *
 * <p>Given as text, {@code "p:end@f,end@f;p:end@f"} ({@link PartitionRows}; empty: no hand-over, or a ledger that does
 * not record it).
 */
final class ClosedWindows implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Nothing closed: what {@link #closedThrough} gives when no earlier writer read past an offset. */
  static final long NONE = Long.MIN_VALUE;

  /** Per partition: end offsets ascending, and for each the latest closed time of the writers ending there or later. */
  private final Map<Integer, long[]> ends = new HashMap<>();
  private final Map<Integer, long[]> closed = new HashMap<>();

  private ClosedWindows() {}

  static ClosedWindows parse(String spec) {
    ClosedWindows out = new ClosedWindows();
    PartitionRows.parse(spec, 2, "closed windows").forEach((partition, pairs) -> {
      long[] e = new long[pairs.length];
      long[] f = new long[pairs.length];
      long max = NONE;
      for (int i = pairs.length - 1; i >= 0; i--) {
        max = Math.max(max, pairs[i][1]);
        e[i] = pairs[i][0];
        f[i] = max;
      }
      out.ends.put(partition, e);
      out.closed.put(partition, f);
    });
    return out;
  }

  boolean isEmpty() {
    return ends.isEmpty();
  }

  /**
   * The event time (ms) up to which the writers that read the record at {@code offset} of {@code partition} (those
   * whose end offset is above it) closed left windows, the latest of them. {@link #NONE} when no earlier writer read
   * it.
   */
  long closedThrough(int partition, long offset) {
    long[] e = ends.get(partition);
    if (e == null || offset < 0) {
      return NONE;
    }
    int lo = 0;
    int hi = e.length;
    while (lo < hi) { // the first end above the offset
      int mid = (lo + hi) >>> 1;
      if (e[mid] > offset) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo == e.length ? NONE : closed.get(partition)[lo];
  }
}
