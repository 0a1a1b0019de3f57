package io.glasspipe.spark;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.json.JsonToStructsEvaluator;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code from_json} over a Kafka value's bytes, with Spark's own parser (JacksonParser in a PERMISSIVE
 * FailureSafeParser, the options {@code from_json} is given) and the same result for every record.
 *
 * <p>Why: {@code from_json} takes a string and hands Jackson an {@code InputStreamReader} per record,
 * whose decoder allocates an 8 KB buffer each time: most of a pipeline's young garbage, and ~13 % of the
 * task samples of the join at 20 000 pairs/s. Jackson's byte parser reads UTF-8 in place. A record that
 * parser does not take as it is (a parse error: not UTF-8, not JSON, a value that does not fit its type;
 * or bytes Jackson would read as another encoding: a byte-order mark, a NUL in the first four) is parsed
 * again the way {@code from_json} parses it, so the result, corrupt-record column included, is always
 * {@code from_json}'s.
 *
 * <p>A record whose values are all of the plainest kind for their fields is read by {@link PlainJson}, without
 * Spark's parser. In the others, top-level timestamp fields are first read as strings and turned into
 * timestamps by {@link IsoTimestamps} where they have its shape; a record with one that has not (or is no
 * string) is read again with the timestamps as Spark reads them. A task whose records mostly are not plain,
 * or whose timestamps mostly have another shape, stops trying that reader.
 */
public final class JsonValues implements Serializable {
  private static final long serialVersionUID = 1L;

  private final StructType schema;
  private final String corruptColumn;
  private final String timeZoneId;
  /** {@code from_json} itself (Spark's evaluator): the path for what the byte parser does not take. */
  private final JsonToStructsEvaluator fromJson;
  /** The byte parser with the timestamps as Spark reads them. */
  private transient FailureSafeParser<byte[]> bytesParser;
  /** The byte parser with the top-level timestamps read as strings (null without any). */
  private transient FailureSafeParser<byte[]> isoParser;
  private transient int corruptIndex;
  /** Indices of the top-level TIMESTAMP fields, which {@link #isoParser} reads as strings. */
  private transient int[] timestampSlots;
  /** Their names, quoted, in UTF-8. */
  private transient byte[][] timestampNames;
  /** Records whose timestamps {@link IsoTimestamps} read, and those it could not. */
  private transient Tally isoTally;
  /** The reader of plain records (null when the schema has column defaults), and its tally. */
  private transient PlainJson plain;
  private transient Tally plainTally;

  private JsonValues(StructType schema, String corruptColumn, String timeZoneId) {
    this.schema = schema;
    this.corruptColumn = corruptColumn;
    this.timeZoneId = timeZoneId;
    this.fromJson = new JsonToStructsEvaluator(options(corruptColumn), schema, corruptColumn,
        Option.apply(timeZoneId), false);
  }

  private static Map<String, String> options(String corruptColumn) {
    return new Map.Map2<>("mode", "PERMISSIVE", "columnNameOfCorruptRecord", corruptColumn);
  }

  /**
   * {@code df} with {@code outCol} = the BINARY {@code valueCol} parsed by {@code schemaJson} (a struct type
   * as JSON, holding the string column {@code corruptColumn}), as {@code from_json(CAST(valueCol AS
   * STRING), schema, {mode: PERMISSIVE, columnNameOfCorruptRecord: corruptColumn})} would; NULL for NULL.
   */
  public static Dataset<Row> withParsed(
      Dataset<Row> df, String valueCol, String outCol, String schemaJson, String corruptColumn) {
    StructType schema = ((StructType) DataType.fromJson(schemaJson)).asNullable();
    String timeZone = df.sparkSession().conf().get("spark.sql.session.timeZone");
    JsonValues parser = new JsonValues(schema, corruptColumn, timeZone);
    return df.withColumn(outCol, GeneratedCalls.pure(parser, "parse", schema, true, df.col(valueCol)));
  }

  /**
   * A BOOLEAN column: true where the BINARY column {@code valueCol} of {@code df} is not a JSON object, as
   * {@code from_json(CAST(valueCol AS STRING), 'map<string,string>') IS NULL} is (true for NULL). Spark's
   * {@code from_json} has no generated code: an expression holding it takes its whole projection out of
   * whole-stage code generation, and that projection's code is generated again in every task.
   */
  public static Column notAnObject(Dataset<Row> df, String valueCol) {
    ObjectCheck check = new ObjectCheck(df.sparkSession().conf().get("spark.sql.session.timeZone"));
    return GeneratedCalls.pure(check, "notAnObject", DataTypes.BooleanType, false, df.col(valueCol));
  }

  /** Spark's own {@code from_json} to {@code map<string,string>}, called from generated code. */
  public static final class ObjectCheck implements Serializable {
    private static final long serialVersionUID = 1L;
    private final JsonToStructsEvaluator asMap;

    ObjectCheck(String timeZoneId) {
      Map<String, String> none = scala.collection.immutable.Map$.MODULE$.<String, String>empty();
      asMap = new JsonToStructsEvaluator(none,
          DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true),
          "_corrupt_record", Option.apply(timeZoneId), false);
    }

    public boolean notAnObject(byte[] value) {
      return value == null || asMap.evaluate(UTF8String.fromBytes(value)) == null;
    }
  }

  /** The parsed row (possibly reused by the next call, as {@code from_json}'s is); called by generated code. */
  public InternalRow parse(byte[] value) {
    if (bytesParser == null) {
      open();
    }
    if (PlainJson.readsAsUtf8(value)) {
      if (plain != null && plainTally.worthTrying()) {
        InternalRow row = plain.read(value);
        if (plainTally.count(row != null)) {
          return row;
        }
      }
      if (isoParser != null && isoTally.worthTrying() && oncePerTimestampField(value)) {
        InternalRow row = first(isoParser.parse(value));
        if (!clean(row)) {
          return viaFromJson(value); // corrupt with the timestamps as strings, so with them as timestamps too
        }
        if (isoTally.count(timestampsRead(row))) {
          return row;
        }
      }
      InternalRow row = first(bytesParser.parse(value));
      if (clean(row)) {
        return row;
      }
    }
    return viaFromJson(value);
  }

  /**
   * The reader {@link #parse} tries first, for a schema as {@link #withParsed} takes it (null when that schema has
   * column defaults), so that what it reads and what it leaves to Spark's parser can be seen on its own. Its
   * rows do not depend on the session's time zone: the timestamps it reads carry their offset.
   */
  public static PlainJson plainReader(String schemaJson, String corruptColumn) {
    StructType schema = ((StructType) DataType.fromJson(schemaJson)).asNullable();
    JSONOptions parsedOptions = new JSONOptions(options(corruptColumn), "UTC", corruptColumn);
    return PlainJson.forSchema(parsedOptions.buildJsonFactory(), schema, corruptColumn);
  }

  /** Whether a byte parser read the record into a row without marking it corrupt. */
  private boolean clean(InternalRow row) {
    return row != null && row.isNullAt(corruptIndex);
  }

  /** {@code from_json}'s own path: whatever the byte parsers do not take as it is. */
  private InternalRow viaFromJson(byte[] value) {
    return (InternalRow) fromJson.evaluate(UTF8String.fromBytes(value));
  }

  /** Replaces the timestamp fields' strings in {@code row} by their values; false if one has another shape. */
  private boolean timestampsRead(InternalRow row) {
    for (int slot : timestampSlots) {
      if (!row.isNullAt(slot)) {
        long micros = IsoTimestamps.micros(row.getUTF8String(slot));
        if (micros == IsoTimestamps.NOT_THIS_SHAPE) {
          return false;
        }
        row.update(slot, micros);
      }
    }
    return true;
  }

  private static InternalRow first(Iterator<InternalRow> rows) {
    return rows.hasNext() ? rows.next() : null;
  }

  private void open() {
    JSONOptions parsedOptions = new JSONOptions(options(corruptColumn), timeZoneId, corruptColumn);
    StructField[] asStrings = schema.fields().clone();
    List<Integer> slots = new ArrayList<>();
    for (int i = 0; i < asStrings.length; i++) {
      if (asStrings[i].dataType().equals(DataTypes.TimestampType)) {
        asStrings[i] = new StructField(asStrings[i].name(), DataTypes.StringType, true, asStrings[i].metadata());
        slots.add(i);
      }
    }
    timestampSlots = slots.stream().mapToInt(Integer::intValue).toArray();
    timestampNames = slots.stream().map(i -> ('"' + asStrings[i].name() + '"').getBytes(StandardCharsets.UTF_8))
        .toArray(byte[][]::new);
    bytesParser = byteParser(schema, parsedOptions);
    isoParser = slots.isEmpty() ? null : byteParser(new StructType(asStrings), parsedOptions);
    corruptIndex = schema.fieldIndex(corruptColumn);
    plain = PlainJson.forSchema(parsedOptions.buildJsonFactory(), schema, corruptColumn);
    isoTally = new Tally();
    plainTally = new Tally();
  }

  /**
   * Whether {@link #isoParser} reads {@code value} as Spark's parser does: not when a timestamp field may be in it
   * twice (Spark reads each value as a timestamp, and one that is none makes the record corrupt; read as strings,
   * the last value wins): a field's quoted name twice in the bytes, or an escape anywhere, which may spell a name.
   */
  private boolean oncePerTimestampField(byte[] value) {
    for (byte b : value) {
      if (b == '\\') {
        return false;
      }
    }
    for (byte[] name : timestampNames) {
      int at = indexOf(value, name, 0);
      if (at >= 0 && indexOf(value, name, at + name.length) >= 0) {
        return false;
      }
    }
    return true;
  }

  private static int indexOf(byte[] bytes, byte[] part, int from) {
    for (int i = from; i <= bytes.length - part.length; i++) {
      if (java.util.Arrays.equals(bytes, i, i + part.length, part, 0, part.length)) {
        return i;
      }
    }
    return -1;
  }

  /** Spark's JacksonParser for {@code readSchema} over a value's bytes, in a PERMISSIVE FailureSafeParser. */
  private FailureSafeParser<byte[]> byteParser(StructType readSchema, JSONOptions parsedOptions) {
    StructType fields = new StructType(java.util.Arrays.stream(readSchema.fields())
        .filter(f -> !f.name().equals(corruptColumn)).toArray(StructField[]::new));
    Seq<Filter> noFilters = CollectionConverters.asScala(List.<Filter>of()).toSeq();
    JacksonParser raw = new JacksonParser(fields, parsedOptions, false, noFilters);
    scala.Function1<byte[], UTF8String> bytesLiteral = UTF8String::fromBytes;
    scala.Function2<JsonFactory, byte[], JsonParser> bytesSource = (factory, bytes) -> {
      try {
        return factory.createParser(bytes);
      } catch (java.io.IOException e) {
        throw new java.io.UncheckedIOException(e);
      }
    };
    return new FailureSafeParser<>(b -> raw.parse(b, bytesSource, bytesLiteral),
        parsedOptions.parseMode(), readSchema, corruptColumn);
  }
}
