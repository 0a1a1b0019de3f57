package io.glasspipe.spark;

import java.io.Serializable;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * Which warm-up rows of one source the writers before a hand-over found late (glasspipe_job.handover.judged_late).
 * Each batch that dead-lettered late rows recorded in the ledger, per Kafka partition, the lowest and highest
 * offset of its late rows and their latest event time {@code m}. Within that batch a row was late exactly when its
 * event time was below one watermark (at or below it, before a join), so its late rows have {@code t <= m} and every
 * other row {@code t > m}: a warm-up row at an offset in {@code [lo, hi]} was late for its first writer exactly when
 * {@code t <= m}, whatever rule and watermark that writer applied. The new writer treats it the same way: late, kept
 * out of the state (it is in the dead-letter topic already), where its own watermark would have let it seed a key.
 *
 * <p>Given as text, {@code "p:lo@hi@m,lo@hi@m;p:..."} ({@link PartitionRows}; empty: no hand-over, or nothing late
 * before it). The ranges of a partition never overlap: each offset is read fresh by one committed batch.
 */
final class JudgedLate implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Per partition: range starts ascending, their ends and latest late event times (ms). */
  private final Map<Integer, long[][]> ranges = new HashMap<>();

  private JudgedLate() {}

  static JudgedLate parse(String spec) {
    JudgedLate out = new JudgedLate();
    PartitionRows.parse(spec, 3, "judged late").forEach((partition, rows) -> {
      long[][] columns = new long[3][rows.length];
      for (int i = 0; i < rows.length; i++) {
        for (int c = 0; c < 3; c++) {
          columns[c][i] = rows[i][c];
        }
      }
      out.ranges.put(partition, columns);
    });
    return out;
  }

  /** Whether the writer that first read the record at {@code offset} of {@code partition} found it late. */
  boolean wasLate(int partition, long offset, long eventMs) {
    long[][] r = ranges.get(partition);
    if (r == null || eventMs == Long.MIN_VALUE) {
      return false;
    }
    int i = Arrays.binarySearch(r[0], offset);
    if (i < 0) {
      i = -i - 2; // the last range starting below the offset
    }
    return i >= 0 && offset <= r[1][i] && eventMs <= r[2][i];
  }
}
