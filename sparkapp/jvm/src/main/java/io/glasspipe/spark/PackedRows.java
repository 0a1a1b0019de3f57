package io.glasspipe.spark;

import java.io.Serializable;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

/**
 * A struct column as its {@code UnsafeRow} bytes and back, in generated code: what the join operator carries and
 * keeps of a side's fields, which it never reads. As a struct, each of a side's strings and timestamps became a Java
 * object on the way into {@code transformWithState}, back into Spark's form in the state, a Java object again
 * when the state was read (each timer reads its bucket's keys), and Spark's form once more in the output. As bytes,
 * each of those is one array copy.
 *
 * <p>The bytes are those of the struct's {@code UnsafeRow}: only a reader with the same struct type may read them,
 * which the join's state plan records (glasspipe_job.join.join_state_plan). Public, and its static methods named apart
 * from {@link #pack} and {@link #unpack}, which generated code calls: as a package-private class whose static and
 * instance methods shared those names, Janino found no method to call.
 */
public final class PackedRows implements Serializable {
  private static final long serialVersionUID = 1L;

  private final StructType type;
  private transient UnsafeProjection toUnsafe;

  private PackedRows(StructType type) {
    this.type = type;
  }

  /** BINARY: {@code struct}'s bytes (NULL for NULL). */
  static Column packed(Column struct, StructType type) {
    return GeneratedCalls.pure(new PackedRows(type), "pack", DataTypes.BinaryType, true, struct);
  }

  /** {@code type}: the struct read back from {@link #pack}'s bytes (NULL for NULL). */
  static Column unpacked(Column bytes, StructType type) {
    return GeneratedCalls.pure(new PackedRows(type), "unpack", type, true, bytes);
  }

  /**
   * Called by generated code: a fresh array. Not {@code UnsafeRow.getBytes}, which hands out the row's own array
   * when the row fills it, and the projection reuses its buffer.
   */
  public byte[] pack(InternalRow struct) {
    UnsafeRow row;
    if (struct instanceof UnsafeRow) {
      row = (UnsafeRow) struct;
    } else {
      if (toUnsafe == null) {
        toUnsafe = UnsafeProjection.create(type);
      }
      row = toUnsafe.apply(struct);
    }
    byte[] bytes = new byte[row.getSizeInBytes()];
    row.writeToMemory(bytes, Platform.BYTE_ARRAY_OFFSET);
    return bytes;
  }

  /** Called by generated code: the row reads {@code bytes} in place (a fresh array from the operator's output). */
  public InternalRow unpack(byte[] bytes) {
    UnsafeRow row = new UnsafeRow(type.size());
    row.pointTo(bytes, bytes.length);
    return row;
  }
}
