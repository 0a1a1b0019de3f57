package io.glasspipe.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.WritableByteChannel;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.ConcurrentLinkedQueue;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BaseLargeVariableWidthVector;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.DecimalVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A plan's rows as serialized Arrow record batches, per partition: the bytes {@code Dataset.toArrowBatchRdd}
 * gives (the same vectors, laid out by Arrow's own classes and written by its {@link MessageSerializer}), for
 * flat rows of the types in {@link #kindOf}. Each value goes straight from the row into the vector's buffers.
 *
 * <p>Why: Spark's {@code ArrowWriter} wraps every string in a {@code ByteBuffer} that Arrow then duplicates,
 * checks and grows the buffers for every value, and fills the holes of a null string one at a time: 12.6 % of
 * the task samples of deduplication per Kafka partition at 80 000 events/s (docs/benchmarks-journal.md). Here the
 * vectors hold a whole batch from the start, a string is one copy, and a null is a zero bit left as it is.
 *
 * <p>{@link #batches} returns null for a schema with any other type; the caller then uses Spark's writer.
 */
public final class ArrowBatches {
  private static final int STRING = 0;
  private static final int BINARY = 1;
  private static final int LONG = 2;
  private static final int INT = 3;
  private static final int SHORT = 4;
  private static final int BYTE = 5;
  private static final int DOUBLE = 6;
  private static final int FLOAT = 7;
  private static final int BOOLEAN = 8;
  private static final int DATE = 9;
  private static final int TIMESTAMP = 10;
  private static final int DECIMAL = 11;
  /** Rows a batch holds when Spark's {@code maxRecordsPerBatch} is 0 or less ("no limit"). */
  static final int UNBOUNDED_BATCH_ROWS = 10_000;

  private ArrowBatches() {}

  /**
   * The rows of {@code plan} (the executed plan of a DataFrame whose schema is {@code schema}), as one serialized
   * record batch per {@code maxRecordsPerBatch} rows of each partition, with 64-bit string offsets when
   * {@code largeVarTypes}; null when a column's type is not one this writer fills.
   */
  public static JavaRDD<byte[]> batches(SparkPlan plan, StructType schema, int maxRecordsPerBatch,
                                        boolean largeVarTypes) {
    int[] kinds = kinds(schema);
    if (kinds == null || ByteOrder.nativeOrder() != ByteOrder.LITTLE_ENDIAN) { // Arrow's buffers are little-endian
      return null;
    }
    int rows = maxRecordsPerBatch > 0 ? maxRecordsPerBatch : UNBOUNDED_BATCH_ROWS;
    String key = rows + "/" + largeVarTypes + "/" + schema.json();
    return plan.execute().toJavaRDD()
        .mapPartitions(it -> new Writer(it, key, schema, kinds, rows, largeVarTypes));
  }

  /** Each column's kind, or null when one has a type this writer does not fill. */
  static int[] kinds(StructType schema) {
    StructField[] fields = schema.fields();
    int[] kinds = new int[fields.length];
    for (int i = 0; i < fields.length; i++) {
      kinds[i] = kindOf(fields[i].dataType());
      if (kinds[i] < 0) {
        return null;
      }
    }
    return kinds;
  }

  private static int kindOf(DataType t) {
    if (t instanceof StringType) {
      return STRING; // any collation: Spark's writer stores the UTF-8 bytes of each
    } else if (t instanceof BinaryType) {
      return BINARY;
    } else if (t instanceof LongType) {
      return LONG;
    } else if (t instanceof IntegerType) {
      return INT;
    } else if (t instanceof ShortType) {
      return SHORT;
    } else if (t instanceof ByteType) {
      return BYTE;
    } else if (t instanceof DoubleType) {
      return DOUBLE;
    } else if (t instanceof FloatType) {
      return FLOAT;
    } else if (t instanceof BooleanType) {
      return BOOLEAN;
    } else if (t instanceof DateType) {
      return DATE;
    } else if (t instanceof TimestampType || t instanceof TimestampNTZType) {
      return TIMESTAMP; // microseconds, with or without the session's time zone in the schema
    } else if (t instanceof DecimalType) {
      return DECIMAL;
    }
    return -1;
  }

  /**
   * A batch's vectors (allocated for {@code batchRows} rows) and the array it is serialized into. A micro-batch runs a
   * task per partition, and a task's vectors grow to the size of its batches; so a finished task's vectors wait in
   * {@link #IDLE} for the next task of the same schema instead of being allocated and grown again, up to
   * {@link #MAX_IDLE} of them and {@link #MAX_IDLE_BYTES} each; others are freed.
   */
  private static final class Vectors {
    private static final ConcurrentLinkedQueue<Vectors> IDLE = new ConcurrentLinkedQueue<>();
    private static final int MAX_IDLE = 8;
    private static final long MAX_IDLE_BYTES = 64L << 20;

    final String key;
    final BufferAllocator allocator;
    final VectorSchemaRoot root;
    final FieldVector[] vectors;
    final VectorUnloader unloader;
    /** The batch being serialized; its array is kept from batch to batch, so a batch leaves one array behind. */
    final Bytes out = new Bytes();

    private Vectors(String key, StructType schema, int batchRows, boolean large) {
      this.key = key;
      allocator = ArrowUtils.rootAllocator().newChildAllocator("glasspipe-arrow-batches", 0, Long.MAX_VALUE);
      root = VectorSchemaRoot.create(ArrowUtils.toArrowSchema(schema, "UTC", true, large), allocator);
      List<FieldVector> fields = root.getFieldVectors();
      vectors = fields.toArray(new FieldVector[0]);
      for (FieldVector v : vectors) {
        v.setInitialCapacity(batchRows);
        v.allocateNew();
        v.reset(); // offsets and validity bits start at 0
        if (v.getValueCapacity() < batchRows) {
          throw new IllegalStateException("Arrow allocated " + v.getValueCapacity() + " slots for " + batchRows);
        }
      }
      unloader = new VectorUnloader(root);
    }

    /** Idle vectors made for {@code key} (the schema, its string offsets and the batch's rows), else new ones. */
    static Vectors lease(String key, StructType schema, int batchRows, boolean large) {
      for (Vectors idle : IDLE) {
        if (idle.key.equals(key) && IDLE.remove(idle)) {
          return idle;
        }
      }
      return new Vectors(key, schema, batchRows, large);
    }

    /** Back to {@link #IDLE}, reset, or freed. */
    void release() {
      for (FieldVector v : vectors) {
        v.reset();
      }
      out.clear();
      if (allocator.getAllocatedMemory() + out.capacity() <= MAX_IDLE_BYTES && IDLE.size() < MAX_IDLE) {
        IDLE.offer(this);
      } else {
        root.close();
        allocator.close();
      }
    }
  }

  /** One partition's batches, written into leased {@link Vectors}; they are reset between batches. */
  private static final class Writer implements Iterator<byte[]> {
    private final Iterator<InternalRow> rows;
    private final int[] kinds;
    private final int batchRows;
    private final boolean large;
    private final Vectors leased;
    private final VectorSchemaRoot root;
    private final FieldVector[] vectors;
    private final VectorUnloader unloader;
    private final Bytes out;
    /** Per variable-width column: the end of the bytes written so far in this batch. */
    private final long[] ends;
    /** Per column, for the batch being written: the addresses of its validity bits, its values or bytes, and its
     * offsets (variable-width columns). A data buffer that grows moves: {@link #room} updates its address. */
    private final long[] validity;
    private final long[] values;
    private final long[] offsets;
    private final long[] capacities;
    /** Per decimal column, its type (null for the others). */
    private final DecimalType[] decimals;
    private boolean closed;

    Writer(Iterator<InternalRow> rows, String key, StructType schema, int[] kinds, int batchRows, boolean large) {
      this.rows = rows;
      this.kinds = kinds;
      this.batchRows = batchRows;
      this.large = large;
      leased = Vectors.lease(key, schema, batchRows, large);
      root = leased.root;
      vectors = leased.vectors;
      unloader = leased.unloader;
      out = leased.out;
      ends = new long[vectors.length];
      validity = new long[vectors.length];
      values = new long[vectors.length];
      offsets = new long[vectors.length];
      capacities = new long[vectors.length];
      decimals = new DecimalType[vectors.length];
      for (int c = 0; c < vectors.length; c++) {
        if (schema.fields()[c].dataType() instanceof DecimalType type) {
          decimals[c] = type;
        }
      }
      TaskContext task = TaskContext.get();
      if (task != null) {
        task.addTaskCompletionListener(ctx -> {
          close();
        });
      }
    }

    @Override
    public boolean hasNext() {
      if (closed) {
        return false;
      }
      if (rows.hasNext()) {
        return true;
      }
      close();
      return false;
    }

    @Override
    public byte[] next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      try {
        for (int c = 0; c < vectors.length; c++) {
          validity[c] = vectors[c].getValidityBuffer().memoryAddress();
          values[c] = vectors[c].getDataBuffer().memoryAddress();
          capacities[c] = vectors[c].getDataBuffer().capacity();
          offsets[c] = kinds[c] <= BINARY ? vectors[c].getOffsetBuffer().memoryAddress() : 0;
        }
        int n = 0;
        while (n < batchRows && rows.hasNext()) {
          InternalRow row = rows.next();
          for (int c = 0; c < kinds.length; c++) {
            if (!row.isNullAt(c)) {
              write(c, row, n);
            } else if (kinds[c] <= BINARY) {
              endOffset(c, n); // a null string: its start is its end, and its validity bit stays 0
            }
          }
          n++;
        }
        return serialize(n);
      } finally {
        for (int c = 0; c < vectors.length; c++) {
          vectors[c].reset(); // zeroes the buffers, keeps their capacity
          ends[c] = 0;
        }
      }
    }

    /** Value {@code n} of column {@code c} from {@code row} (not null). The buffers hold a whole batch: no checks. */
    private void write(int c, InternalRow row, int n) {
      long at = values[c];
      switch (kinds[c]) {
        case STRING: {
          UTF8String s = row.getUTF8String(c);
          int len = s.numBytes();
          copy(s.getBaseObject(), s.getBaseOffset(), room(c, len) + ends[c], len);
          ends[c] += len;
          endOffset(c, n);
          break;
        }
        case BINARY: {
          byte[] b = row.getBinary(c);
          Platform.copyMemory(b, Platform.BYTE_ARRAY_OFFSET, null, room(c, b.length) + ends[c], b.length);
          ends[c] += b.length;
          endOffset(c, n);
          break;
        }
        case LONG:
        case TIMESTAMP: // microseconds
          Platform.putLong(null, at + 8L * n, row.getLong(c));
          break;
        case INT:
        case DATE: // days
          Platform.putInt(null, at + 4L * n, row.getInt(c));
          break;
        case SHORT:
          Platform.putShort(null, at + 2L * n, row.getShort(c));
          break;
        case BYTE:
          Platform.putByte(null, at + n, row.getByte(c));
          break;
        case DOUBLE:
          Platform.putDouble(null, at + 8L * n, row.getDouble(c));
          break;
        case FLOAT:
          Platform.putFloat(null, at + 4L * n, row.getFloat(c));
          break;
        case BOOLEAN:
          if (row.getBoolean(c)) {
            setBit(at, n);
          }
          break;
        case DECIMAL: { // as Spark's writer: NULL where the value does not fit the column's precision
          DecimalType type = decimals[c];
          Decimal d = row.getDecimal(c, type.precision(), type.scale());
          if (d.changePrecision(type.precision(), type.scale())) {
            ((DecimalVector) vectors[c]).set(n, d.toJavaBigDecimal()); // sets the validity bit
          }
          return;
        }
        default:
          throw new IllegalStateException("column " + c + " has no writer");
      }
      setBit(validity[c], n);
    }

    /** {@code len} bytes from {@code base + offset} to address {@code to}: a string's few bytes a long at a time,
     * where {@code Platform.copyMemory}'s call costs more than the bytes it moves. */
    private static void copy(Object base, long offset, long to, int len) {
      if (len > 64) {
        Platform.copyMemory(base, offset, null, to, len);
        return;
      }
      int i = 0;
      for (; i + 8 <= len; i += 8) {
        Platform.putLong(null, to + i, Platform.getLong(base, offset + i));
      }
      for (; i < len; i++) {
        Platform.putByte(null, to + i, Platform.getByte(base, offset + i));
      }
    }

    private static void setBit(long bits, int n) {
      long at = bits + (n >>> 3);
      Platform.putByte(null, at, (byte) (Platform.getByte(null, at) | (1 << (n & 7))));
    }

    /** The address of the data buffer of variable-width column {@code c}, grown to hold {@code len} more bytes. */
    private long room(int c, int len) {
      long need = ends[c] + len;
      if (need <= capacities[c]) {
        return values[c];
      }
      FieldVector v = vectors[c];
      if (!large && need > Integer.MAX_VALUE) {
        throw new IllegalStateException("column " + v.getName() + ": more than 2 GiB in one Arrow batch; "
            + "lower spark.sql.execution.arrow.maxRecordsPerBatch or set spark.sql.execution.arrow.useLargeVarTypes");
      }
      while (v.getDataBuffer().capacity() < need) {
        if (large) {
          ((BaseLargeVariableWidthVector) v).reallocDataBuffer();
        } else {
          ((BaseVariableWidthVector) v).reallocDataBuffer();
        }
      }
      values[c] = v.getDataBuffer().memoryAddress();
      capacities[c] = v.getDataBuffer().capacity();
      return values[c];
    }

    /** Row {@code n} of variable-width column {@code c} ends where the column's bytes end so far. */
    private void endOffset(int c, int n) {
      if (large) {
        Platform.putLong(null, offsets[c] + (long) (n + 1) * BaseLargeVariableWidthVector.OFFSET_WIDTH, ends[c]);
      } else {
        Platform.putInt(null, offsets[c] + (long) (n + 1) * BaseVariableWidthVector.OFFSET_WIDTH, (int) ends[c]);
      }
    }

    private byte[] serialize(int n) {
      for (int c = 0; c < vectors.length; c++) {
        if (kinds[c] <= BINARY) { // every offset up to n is written: nothing for Arrow to fill
          if (large) {
            ((BaseLargeVariableWidthVector) vectors[c]).setLastSet(n - 1);
          } else {
            ((BaseVariableWidthVector) vectors[c]).setLastSet(n - 1);
          }
        }
      }
      root.setRowCount(n);
      out.clear();
      try (ArrowRecordBatch batch = unloader.getRecordBatch()) {
        MessageSerializer.serialize(new WriteChannel(out), batch);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return out.toByteArray();
    }

    private void close() {
      if (!closed) {
        closed = true;
        leased.release();
      }
    }
  }

  /**
   * The bytes written to it, in one growing array: what {@code Channels.newChannel(new ByteArrayOutputStream())}
   * gives without that channel's interruptible begin and end around every write, nor its copy through an 8 KiB
   * buffer.
   */
  private static final class Bytes implements WritableByteChannel {
    private byte[] bytes = new byte[1 << 16];
    private int size;

    @Override
    public int write(ByteBuffer src) {
      int n = src.remaining();
      if (size + n > bytes.length) {
        bytes = Arrays.copyOf(bytes, Math.max(size + n, bytes.length * 2));
      }
      src.get(bytes, size, n);
      size += n;
      return n;
    }

    void clear() {
      size = 0;
    }

    int capacity() {
      return bytes.length;
    }

    byte[] toByteArray() {
      return Arrays.copyOf(bytes, size);
    }

    @Override
    public boolean isOpen() {
      return true;
    }

    @Override
    public void close() {}
  }
}
