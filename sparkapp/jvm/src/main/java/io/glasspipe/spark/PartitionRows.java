package io.glasspipe.spark;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * The text in which the driver hands an operator numbers per Kafka partition (glasspipe_job.jvm.partition_rows_text):
 * {@code "p:a@b,a@b;p:a@b"}, each row {@code width} numbers joined by {@code @} (empty: none). {@link ClosedWindows}
 * and {@link JudgedLate} read their hand-over facts from it.
 */
final class PartitionRows {
  private PartitionRows() {}

  /** Per partition, its rows sorted by their first number; {@code what} names the facts in an error. */
  static Map<Integer, long[][]> parse(String spec, int width, String what) {
    Map<Integer, long[][]> out = new HashMap<>();
    if (spec == null || spec.isEmpty()) {
      return out;
    }
    for (String part : spec.split(";")) {
      int colon = part.indexOf(':');
      if (colon < 0) {
        throw new IllegalArgumentException(what + ": expected partition:row,row..., got " + part);
      }
      String[] steps = part.substring(colon + 1).split(",");
      long[][] rows = new long[steps.length][];
      for (int i = 0; i < steps.length; i++) {
        String[] numbers = steps[i].split("@");
        if (numbers.length != width) {
          throw new IllegalArgumentException(what + ": expected " + width + " numbers joined by @, got " + steps[i]);
        }
        rows[i] = Arrays.stream(numbers).mapToLong(Long::parseLong).toArray();
      }
      Arrays.sort(rows, (a, b) -> Long.compare(a[0], b[0]));
      out.put(Integer.parseInt(part.substring(0, colon)), rows);
    }
    return out;
  }
}
