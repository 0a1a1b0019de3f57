package io.glasspipe.spark;

import java.lang.reflect.Method;

import org.apache.spark.TaskContext;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.sql.internal.ReadOnlySQLConf;
import org.apache.spark.sql.internal.SQLConf;

/**
 * One read-only SQL conf for the rest of a task, where Spark would build a new one on every call.
 *
 * <p>Why: inside a task, Spark 4.2's {@code SQLConf.get} returns the conf a caller has set for the thread
 * ({@code SQLConf.withExistingConf}) or else a new {@code ReadOnlySQLConf} over the task's properties, and
 * its types framework calls it once per field of every row it encodes: the state store's key encoders
 * behind {@code registerTimer}, {@code transformWithState}'s output wrapping per key. That was ~4.5 % of the
 * stateful stage's task samples, and garbage. The conf Spark would build is the same on every call of a
 * task (its local properties do not change while it runs), so the stateful processors build it once in
 * {@code init} and set it for the task's thread until the task completes.
 *
 * <p>The thread's slot is private to Spark; it is reached by reflection, and where that fails (another
 * Spark version) nothing is pinned and Spark behaves as before. A slot someone else has set (an enclosing
 * {@code withExistingConf}) is left alone.
 */
public final class TaskConf {
  private static final ThreadLocal<SQLConf> SLOT = existingConfSlot();
  /** The task this thread's slot was pinned for by {@link #pin()}, so a stale pin is never reused. */
  private static final ThreadLocal<TaskContext> PINNED_FOR = new ThreadLocal<>();

  private TaskConf() {}

  @SuppressWarnings("unchecked")
  private static ThreadLocal<SQLConf> existingConfSlot() {
    try {
      Class<?> module = Class.forName("org.apache.spark.sql.internal.SQLConf$", true, SQLConf.class.getClassLoader());
      Method slot = module.getDeclaredMethod("existingConf");
      slot.setAccessible(true);
      return (ThreadLocal<SQLConf>) slot.invoke(module.getField("MODULE$").get(null));
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }

  /** Whether this Spark lets a conf be pinned (the reflection above found its slot). */
  public static boolean available() {
    return SLOT != null;
  }

  /**
   * Sets, for the rest of the current task, the conf {@code SQLConf.get} would build on each call. No-op
   * outside a task, when already pinned for this task, or when the thread's slot holds someone else's conf.
   */
  public static void pin() {
    TaskContext task = TaskContext.get();
    if (SLOT == null || task == null) {
      return;
    }
    TaskContext pinned = PINNED_FOR.get();
    if (pinned == task) {
      return;
    }
    if (pinned == null && SLOT.get() != null) {
      return; // an enclosing SQLConf.withExistingConf: its conf wins, as it would without us
    }
    SLOT.set(new ReadOnlySQLConf(task));
    PINNED_FOR.set(task);
    task.addTaskCompletionListener((TaskCompletionListener) TaskConf::unpin);
  }

  /** Clears the pin {@link #pin()} set for {@code task}, if the thread still holds it. */
  static void unpin(TaskContext task) {
    if (SLOT != null && PINNED_FOR.get() == task) {
      SLOT.remove();
      PINNED_FOR.remove();
    }
  }

  /**
   * For tests and diagnostics, called per row (SQL {@code reflect('io.glasspipe.spark.TaskConf', 'probe', x)}):
   * pins, and says {@code "<before>|<after>|<session time zone SQLConf.get reads>"}, where before is
   * {@code clean} (the thread's slot empty), {@code pinned} (already pinned for this task) or {@code stale}
   * (a conf left from elsewhere), and after is {@code pinned} when {@code SQLConf.get} returns the task's pin.
   */
  public static String probe(long row) {
    TaskContext task = TaskContext.get();
    String before = SLOT == null || SLOT.get() == null ? "clean" : PINNED_FOR.get() == task ? "pinned" : "stale";
    pin();
    boolean after = task != null && PINNED_FOR.get() == task && SQLConf.get() == SLOT.get(); // set only with a SLOT
    return before + "|" + (after ? "pinned" : "not") + "|" + SQLConf.get().sessionLocalTimeZone();
  }
}
