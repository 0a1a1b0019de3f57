package io.glasspipe.spark;

import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.ObjectType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code target.method(args)} as a column: a call in Spark's generated code, {@code target} serialized with the plan
 * (one copy a task). The target's class and method must be public: Janino cannot call others.
 */
final class GeneratedCalls {
  private GeneratedCalls() {}

  /** A pure call, which Spark may move or evaluate again; with {@code nullForNull}, NULL when an argument is. */
  static Column pure(Object target, String method, DataType type, boolean nullForNull, Column... args) {
    return invoke(target, method, type, nullForNull, true, args);
  }

  /**
   * A call with effects, once a row in the rows' order: nondeterministic, so that Spark neither moves it nor
   * evaluates it twice. Its arguments may be NULL only where the method takes objects.
   */
  static Column inRowOrder(Object target, String method, DataType type, Column... args) {
    return invoke(target, method, type, false, false, args);
  }

  private static Column invoke(Object target, String method, DataType type, boolean nullForNull,
      boolean deterministic, Column... args) {
    List<Expression> exprs = Arrays.stream(args).map(ExpressionUtils::expression).toList();
    return ExpressionUtils.column(new Invoke(Literal.create(target, new ObjectType(target.getClass())), method, type,
        CollectionConverters.asScala(exprs).toSeq(), CollectionConverters.asScala(List.<AbstractDataType>of()).toSeq(),
        nullForNull, nullForNull, deterministic));
  }
}
