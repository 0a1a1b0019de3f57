package io.glasspipe.spark;

import java.util.Arrays;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * {@link PlainJson}'s rows read from the bytes themselves, for the records most pipelines carry: strict JSON whose
 * strings are printable ASCII without escapes, whose integers have at most 18 digits, and whose values for declared
 * fields are strings, integers, booleans, objects or null. Everything else (a byte past ASCII or a control byte in a
 * string, an escape, a fraction or exponent for a declared field, a leading zero, NaN, single quotes, comments,
 * nesting past {@link #MAX_DEPTH}, a declared field twice) is {@link #DEFER}red to PlainJson's Jackson parser,
 * which gives the same row or leaves the record to Spark. What is read here is the row Jackson's tokens give: ASCII
 * text is its own UTF-8, and a JSON integer of at most 18 digits is the long Jackson reads.
 *
 * <p>Why: Jackson decodes every string into characters, which PlainJson then turns back into bytes, and tokenizes
 * the record field by field: the JSON parse was a fifth of the task samples of a deduplicating pipeline at
 * 120 000 events/s (docs/benchmarks-journal.md). Here a string is a slice of the record's bytes, no copy.
 *
 * <p>Not thread-safe: one reader per task, as PlainJson.
 */
final class AsciiJson {
  /** Nesting deeper than this is Jackson's to read (its own limit is far higher). */
  static final int MAX_DEPTH = 64;
  /** Longer numbers in fields not declared are Jackson's to skip (it limits their length). */
  private static final int MAX_NUMBER_BYTES = 64;
  private static final Object DEFER = new Object();

  private final PlainJson.Level top;
  private byte[] b;
  private int pos;

  AsciiJson(PlainJson.Level top) {
    this.top = top;
  }

  /**
   * The row of {@code value}, or null when it is not of the kind read here (PlainJson's Jackson parser decides). Its
   * strings share {@code value}'s bytes: the caller must not change them (generated code hands a fresh copy).
   */
  InternalRow read(byte[] value) {
    b = value;
    pos = 0;
    try {
      skipSpace();
      if (at() != '{') {
        return null;
      }
      pos++;
      Object row = object(top, 0);
      skipSpace();
      return row == DEFER || pos != b.length ? null : (InternalRow) row;
    } finally {
      b = null;
    }
  }

  /** The byte at the position, 0 past the end (a byte no JSON token starts or goes on with here). */
  private byte at() {
    return pos < b.length ? b[pos] : 0;
  }

  private void skipSpace() {
    while (pos < b.length) {
      byte c = b[pos];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
        return;
      }
      pos++;
    }
  }

  /** The object whose '{' was just read, as a row of {@code level}. */
  private Object object(PlainJson.Level level, int depth) {
    Object[] values = new Object[level.kinds.length];
    boolean[] seen = new boolean[level.kinds.length];
    skipSpace();
    if (at() == '}') {
      pos++;
      return new GenericInternalRow(values);
    }
    while (true) {
      skipSpace();
      int nameStart = pos + 1;
      int nameLength = memberName();
      if (nameLength < 0) {
        return DEFER;
      }
      int slot = slot(level, nameStart, nameLength);
      if (slot < 0) {
        if (!skip(depth)) {
          return DEFER;
        }
      } else {
        if (seen[slot]) {
          return DEFER;
        }
        seen[slot] = true;
        Object v = value(level, slot, depth);
        if (v == DEFER) {
          return DEFER;
        }
        values[slot] = v;
      }
      skipSpace();
      byte c = at();
      pos++;
      if (c == '}') {
        return new GenericInternalRow(values);
      }
      if (c != ',') {
        return DEFER;
      }
    }
  }

  /**
   * Past a member's name at the position, its colon and the space after: the name's length in bytes (it starts one
   * past the position), or -1 when the member is not of the kind read here.
   */
  private int memberName() {
    int from = pos + 1;
    if (at() != '"' || !string()) {
      return -1;
    }
    int length = pos - 1 - from;
    skipSpace();
    if (at() != ':') {
      return -1;
    }
    pos++;
    skipSpace();
    return length;
  }

  /** The slot of the field named by the {@code length} bytes at {@code from}, -1 for a field not declared. */
  private int slot(PlainJson.Level level, int from, int length) {
    byte[][] names = level.asciiNames;
    for (int i = 0; i < names.length; i++) {
      byte[] name = names[i];
      if (name != null && name.length == length && Arrays.equals(name, 0, length, b, from, from + length)) {
        return level.nameSlots[i];
      }
    }
    return -1;
  }

  /** A declared field's value at the position: its row value (null for JSON null), or DEFER. */
  private Object value(PlainJson.Level level, int slot, int depth) {
    byte c = at();
    if (c == 'n') {
      return literal("null") ? null : DEFER;
    }
    switch (level.kinds[slot]) {
      case STRING:
        return c == '"' ? text() : DEFER;
      case TIMESTAMP:
        if (c != '"') {
          return DEFER;
        }
        Object s = text();
        if (s == DEFER) {
          return DEFER;
        }
        long micros = IsoTimestamps.micros((UTF8String) s);
        return micros == IsoTimestamps.NOT_THIS_SHAPE ? DEFER : (Object) micros;
      case LONG:
        return integer(Long.MIN_VALUE, Long.MAX_VALUE);
      case INT:
        Object n = integer(Integer.MIN_VALUE, Integer.MAX_VALUE);
        return n == DEFER ? DEFER : (Object) (int) (long) (Long) n;
      case BOOLEAN:
        return c == 't' ? (literal("true") ? Boolean.TRUE : DEFER)
            : c == 'f' ? (literal("false") ? Boolean.FALSE : DEFER) : DEFER;
      case STRUCT:
        if (c != '{' || depth + 1 > MAX_DEPTH) {
          return DEFER;
        }
        pos++;
        return object(level.nested[slot], depth + 1);
      default: // DOUBLE, FLOAT (Jackson's reading of a fraction) and the types only Spark reads
        return DEFER;
    }
  }

  /** The string at the position as text sharing the record's bytes, or DEFER. */
  private Object text() {
    int from = pos + 1;
    return string() ? UTF8String.fromBytes(b, from, pos - 1 - from) : DEFER;
  }

  /**
   * Past the string whose '"' is at the position, if it is printable ASCII without escapes (then its bytes are its
   * UTF-8 text); false otherwise, the position anywhere.
   */
  private boolean string() {
    pos++;
    while (pos < b.length) {
      byte c = b[pos++];
      if (c == '"') {
        return true;
      }
      if (c < 0x20 || c == '\\' || c == 0x7f) { // a negative byte is past ASCII
        return false;
      }
    }
    return false;
  }

  /** An integer of at most 18 digits within [min, max], or DEFER (Jackson reads the rest and says what it is). */
  private Object integer(long min, long max) {
    boolean negative = at() == '-';
    if (negative) {
      pos++;
    }
    int from = pos;
    long v = 0;
    while (pos < b.length && b[pos] >= '0' && b[pos] <= '9') {
      v = v * 10 + (b[pos++] - '0');
      if (pos - from > 18) {
        return DEFER;
      }
    }
    int digits = pos - from;
    if (digits == 0 || (digits > 1 && b[from] == '0')) {
      return DEFER; // no digits, or a leading zero: not JSON
    }
    byte next = at();
    if (next == '.' || next == 'e' || next == 'E') {
      return DEFER;
    }
    v = negative ? -v : v;
    return v < min || v > max ? DEFER : (Object) v;
  }

  /** Past {@code word} if it is at the position. */
  private boolean literal(String word) {
    int n = word.length();
    if (pos + n > b.length) {
      return false;
    }
    for (int i = 0; i < n; i++) {
      if (b[pos + i] != word.charAt(i)) {
        return false;
      }
    }
    pos += n;
    return true;
  }

  /** Past the value of a field not declared, if it is strict JSON of the kind read here. */
  private boolean skip(int depth) {
    byte c = at();
    switch (c) {
      case '"':
        return string();
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      case '{':
      case '[':
        return depth + 1 <= MAX_DEPTH && skipContainer(c == '{', depth + 1);
      default:
        return (c == '-' || (c >= '0' && c <= '9')) && skipNumber();
    }
  }

  /** Past the object or array whose bracket is at the position. */
  private boolean skipContainer(boolean isObject, int depth) {
    byte close = (byte) (isObject ? '}' : ']');
    pos++;
    skipSpace();
    if (at() == close) {
      pos++;
      return true;
    }
    while (true) {
      skipSpace();
      if ((isObject && memberName() < 0) || !skip(depth)) {
        return false;
      }
      skipSpace();
      byte c = at();
      pos++;
      if (c == close) {
        return true;
      }
      if (c != ',') {
        return false;
      }
    }
  }

  /** Past a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, of at most MAX_NUMBER_BYTES. */
  private boolean skipNumber() {
    int from = pos;
    if (at() == '-') {
      pos++;
    }
    if (at() == '0') {
      pos++;
    } else if (!digits()) {
      return false;
    }
    if (at() == '.') {
      pos++;
      if (!digits()) {
        return false;
      }
    }
    if (at() == 'e' || at() == 'E') {
      pos++;
      if (at() == '+' || at() == '-') {
        pos++;
      }
      if (!digits()) {
        return false;
      }
    }
    byte next = at();
    return pos - from <= MAX_NUMBER_BYTES && !(next >= '0' && next <= '9');
  }

  /** Past one or more digits. */
  private boolean digits() {
    int from = pos;
    while (at() >= '0' && at() <= '9') {
      pos++;
    }
    return pos > from;
  }
}
