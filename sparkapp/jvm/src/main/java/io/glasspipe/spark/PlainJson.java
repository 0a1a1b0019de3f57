package io.glasspipe.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.util.BufferRecycler;
import com.fasterxml.jackson.core.util.RecyclerPool;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ResolveDefaultColumns;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Reads a JSON object whose every value is the plainest token for its field's type straight into an
 * {@link InternalRow}: a string for STRING, an integer that fits for INT and BIGINT, a number for DOUBLE and
 * FLOAT, true or false for BOOLEAN, an {@link IsoTimestamps} string for TIMESTAMP, an object for a struct, or
 * null. Those are the cases in which Spark's JacksonParser calls the same Jackson getter and stores what it
 * returns, so the row is the one {@code from_json} gives. Anything else (another token for a field, a field
 * twice, a field of another type that is not null, not one object, not JSON) returns {@code null}, and the
 * caller parses the record Spark's way.
 *
 * <p>Why: Spark's parser spends a third of its time around the tokens: a check of the schema's column defaults
 * (two passes over the fields and an array, per object), the string of each value turned back into bytes, a
 * name lookup and a closure per field, the failure-safe wrapper per record.
 */
public final class PlainJson {
  enum Kind { STRING, LONG, INT, DOUBLE, FLOAT, BOOLEAN, TIMESTAMP, STRUCT, OTHER }

  /** The fields of one struct: kinds, nested levels, and the slot of each name. */
  static final class Level {
    final Kind[] kinds;
    final Level[] nested;
    final HashMap<String, Integer> slots = new HashMap<>();
    /** The names of {@link #slots} interned, and their slots: Jackson interns the names it reads. */
    final String[] names;
    final int[] nameSlots;
    /** Each of {@link #names} as its bytes when it is printable ASCII (null otherwise): for {@link AsciiJson}. */
    final byte[][] asciiNames;

    Level(StructType struct, String skipped) {
      StructField[] fields = struct.fields();
      kinds = new Kind[fields.length];
      nested = new Level[fields.length];
      for (int i = 0; i < fields.length; i++) {
        DataType t = fields[i].dataType();
        kinds[i] = kindOf(t);
        if (t instanceof StructType) {
          nested[i] = new Level((StructType) t, null);
        }
        if (!fields[i].name().equals(skipped)) {
          slots.putIfAbsent(fields[i].name(), i);
        }
      }
      names = new String[slots.size()];
      nameSlots = new int[slots.size()];
      asciiNames = new byte[slots.size()][];
      int n = 0;
      for (Map.Entry<String, Integer> e : slots.entrySet()) {
        names[n] = e.getKey().intern();
        asciiNames[n] = names[n].chars().allMatch(c -> c >= 0x20 && c < 0x7f)
            ? names[n].getBytes(StandardCharsets.US_ASCII) : null;
        nameSlots[n++] = e.getValue();
      }
    }

    /**
     * The slot of the field {@code name}, -1 for none: the same string first (a scan of a few references; the
     * map's lookup was 4 % of a deduplicating pipeline's task samples), then an equal one.
     */
    int slot(String name) {
      for (int i = 0; i < names.length; i++) {
        if (names[i] == name) {
          return nameSlots[i];
        }
      }
      return slots.getOrDefault(name, -1);
    }
  }

  /** The kind of each type read here; a struct is {@link Kind#STRUCT}, any other type {@link Kind#OTHER}. */
  private static final Map<DataType, Kind> KINDS = Map.of(
      DataTypes.StringType, Kind.STRING, DataTypes.LongType, Kind.LONG, DataTypes.IntegerType, Kind.INT,
      DataTypes.DoubleType, Kind.DOUBLE, DataTypes.FloatType, Kind.FLOAT, DataTypes.BooleanType, Kind.BOOLEAN,
      DataTypes.TimestampType, Kind.TIMESTAMP);

  private static Kind kindOf(DataType t) {
    return t instanceof StructType ? Kind.STRUCT : KINDS.getOrDefault(t, Kind.OTHER);
  }

  /**
   * The buffers of the last parser, kept for the next: a reader parses one record at a time. Jackson's default
   * pool finds them through a {@code ThreadLocal} for every parser, a lookup that missed its slot in the task
   * thread's crowded map: 4.5 % of the task samples of a deduplicating pipeline at 110 000 events/s.
   */
  static final class OneRecycler implements RecyclerPool<BufferRecycler> {
    private static final long serialVersionUID = 1L;
    private final AtomicReference<BufferRecycler> kept = new AtomicReference<>();

    @Override
    public BufferRecycler acquirePooled() {
      BufferRecycler r = kept.getAndSet(null);
      return r != null ? r : new BufferRecycler();
    }

    @Override
    public void releasePooled(BufferRecycler r) {
      kept.set(r);
    }
  }

  /** A value that is not the plainest token for its field. */
  private static final Object NOT_PLAIN = new Object();

  private final JsonFactory factory;
  private final Level top;
  /** The bytes' own reader, tried first while it reads most records ({@link Tally}). */
  private final AsciiJson ascii;
  private final Tally asciiTally = new Tally();

  private PlainJson(JsonFactory factory, StructType schema, String corruptColumn) {
    this.factory = factory.rebuild().recyclerPool(new OneRecycler()).build();
    this.top = new Level(schema, corruptColumn);
    this.ascii = new AsciiJson(top);
  }

  /**
   * A reader for {@code schema} (the row's, {@code corruptColumn} included and left null), with the factory
   * Spark's parser uses; null when a field has a column default, which Spark's parser fills in itself.
   */
  static PlainJson forSchema(JsonFactory factory, StructType schema, String corruptColumn) {
    if (hasDefaults(schema)) {
      return null;
    }
    return new PlainJson(factory, schema, corruptColumn);
  }

  private static boolean hasDefaults(StructType struct) {
    if (ResolveDefaultColumns.hasExistenceDefaultValues(struct)) {
      return true;
    }
    for (StructField f : struct.fields()) {
      if (f.dataType() instanceof StructType && hasDefaults((StructType) f.dataType())) {
        return true;
      }
    }
    return false;
  }

  /**
   * The record's row, or null when it is not plain (or not JSON at all, or not UTF-8 from its start). Its strings may
   * share {@code value}'s bytes ({@link AsciiJson}): the caller must not change them.
   */
  public InternalRow read(byte[] value) {
    if (!readsAsUtf8(value)) {
      return null;
    }
    if (asciiTally.worthTrying()) {
      InternalRow row = ascii.read(value);
      if (asciiTally.count(row != null)) {
        return row;
      }
    }
    return jackson(value);
  }

  /** {@link AsciiJson}'s row alone, null where it defers: for a test to see what it reads itself. */
  public InternalRow readAscii(byte[] value) {
    return ascii.read(value);
  }

  /** {@link #read} without {@link AsciiJson}: what it defers to, and what a test compares it with. */
  public InternalRow readWithJackson(byte[] value) {
    return readsAsUtf8(value) ? jackson(value) : null;
  }

  /** The row Jackson's tokens give, for a value {@link #readsAsUtf8} passed. */
  private InternalRow jackson(byte[] value) {
    try (JsonParser p = factory.createParser(value)) {
      if (p.nextToken() != JsonToken.START_OBJECT) {
        return null;
      }
      Object row = object(p, top);
      if (row == NOT_PLAIN || p.nextToken() != null) {
        return null;
      }
      return (InternalRow) row;
    } catch (IOException e) {
      return null; // Spark's parse says what is wrong with it
    }
  }

  /** Jackson's byte parser guesses the encoding from a byte-order mark or NUL bytes at the start. */
  static boolean readsAsUtf8(byte[] v) {
    if (v.length > 0 && (v[0] == (byte) 0xEF || v[0] == (byte) 0xFE || v[0] == (byte) 0xFF)) {
      return false;
    }
    for (int i = 0; i < Math.min(4, v.length); i++) {
      if (v[i] == 0) {
        return false;
      }
    }
    return true;
  }

  /** The object the parser stands at the start of, as a row of {@code level}; NOT_PLAIN if it is not plain. */
  private Object object(JsonParser p, Level level) throws IOException {
    Object[] values = new Object[level.kinds.length];
    boolean[] seen = new boolean[level.kinds.length];
    for (JsonToken t = p.nextToken(); t != JsonToken.END_OBJECT; t = p.nextToken()) {
      int slot = level.slot(p.currentName());
      JsonToken v = p.nextToken();
      if (slot < 0) {
        p.skipChildren();
        continue;
      }
      if (seen[slot]) {
        return NOT_PLAIN;
      }
      seen[slot] = true;
      if (v == JsonToken.VALUE_NULL) {
        continue;
      }
      Object o = value(p, v, level, slot);
      if (o == NOT_PLAIN) {
        return NOT_PLAIN;
      }
      values[slot] = o;
    }
    return new GenericInternalRow(values);
  }

  private Object value(JsonParser p, JsonToken v, Level level, int slot) throws IOException {
    switch (level.kinds[slot]) {
      case STRING:
        return v == JsonToken.VALUE_STRING ? text(p) : NOT_PLAIN;
      case LONG:
        return v == JsonToken.VALUE_NUMBER_INT && fitsLong(p) ? (Object) p.getLongValue() : NOT_PLAIN;
      case INT:
        return v == JsonToken.VALUE_NUMBER_INT && p.getNumberType() == JsonParser.NumberType.INT
            ? (Object) p.getIntValue() : NOT_PLAIN;
      case DOUBLE:
        return isNumber(v) ? (Object) p.getDoubleValue() : NOT_PLAIN;
      case FLOAT:
        return isNumber(v) ? (Object) p.getFloatValue() : NOT_PLAIN;
      case BOOLEAN:
        return v == JsonToken.VALUE_TRUE ? Boolean.TRUE : v == JsonToken.VALUE_FALSE ? Boolean.FALSE : NOT_PLAIN;
      case TIMESTAMP:
        if (v != JsonToken.VALUE_STRING) {
          return NOT_PLAIN;
        }
        long micros = IsoTimestamps.micros(text(p));
        return micros == IsoTimestamps.NOT_THIS_SHAPE ? NOT_PLAIN : (Object) micros;
      case STRUCT:
        return v == JsonToken.START_OBJECT ? object(p, level.nested[slot]) : NOT_PLAIN;
      default:
        return NOT_PLAIN;
    }
  }

  private static boolean isNumber(JsonToken v) {
    return v == JsonToken.VALUE_NUMBER_INT || v == JsonToken.VALUE_NUMBER_FLOAT;
  }

  private static boolean fitsLong(JsonParser p) throws IOException {
    JsonParser.NumberType n = p.getNumberType();
    return n == JsonParser.NumberType.INT || n == JsonParser.NumberType.LONG;
  }

  /**
   * The string value's UTF-8 bytes, as {@code UTF8String.fromString(p.getText())} gives them; ASCII copied
   * straight from Jackson's characters, without a String in between.
   */
  private static UTF8String text(JsonParser p) throws IOException {
    char[] chars = p.getTextCharacters();
    int offset = p.getTextOffset();
    int length = p.getTextLength();
    byte[] bytes = new byte[length];
    for (int i = 0; i < length; i++) {
      char c = chars[offset + i];
      if (c >= 0x80) {
        return UTF8String.fromString(p.getText());
      }
      bytes[i] = (byte) c;
    }
    return UTF8String.fromBytes(bytes);
  }
}
