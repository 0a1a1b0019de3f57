package io.glasspipe.spark;

import org.apache.spark.sql.execution.streaming.runtime.StreamExecution;
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryWrapper;
import org.apache.spark.sql.execution.streaming.runtime.TERMINATED$;
import org.apache.spark.sql.streaming.StreamingQuery;

/**
 * Ends a streaming query after its micro-batch in flight, interrupting nothing. Spark has no such stop:
 * {@code StreamingQuery.stop()} marks the query terminated and interrupts its thread, so a batch in flight fails
 * in the middle of its writes (exact all the same, by the sink's ledger, but replayed, and noisy: the foreachBatch
 * callback's error came back as a Python traceback, and Spark's check of whether that error is an interruption, a
 * regex over the whole text, overflowed the thread's stack on a long one). The trigger loop runs a batch only
 * while the query is active and ends once it is not; marking it terminated, without the interrupt, lets the batch
 * in flight finish and commit, then the loop ends and the query terminates as a stopped one, with no exception.
 *
 * <p>Spark checks again just before a batch's plan runs, and interrupts the batch if the query is no longer active
 * by then: marked from inside the batch's foreachBatch call, past that check, the batch runs to its end.
 */
public final class QueryEnd {
  private QueryEnd() {}

  /**
   * Marks {@code query} terminated, to end after its batch in flight; false when it is not a micro-batch query of
   * this Spark (the caller then stops it with {@code stop()}).
   */
  public static boolean afterBatchInFlight(StreamingQuery query) {
    StreamExecution execution = execution(query);
    if (execution == null) {
      return false;
    }
    execution.state().set(TERMINATED$.MODULE$);
    return true;
  }

  /**
   * Marks {@code query} terminated, and wakes its thread, if that thread is asleep until its next trigger: no batch
   * runs then, and none starts after the mark. False, doing nothing, while the thread does anything else (a batch,
   * or planning one: a mark there would have Spark interrupt that batch at its start).
   */
  public static boolean ifWaitingForTrigger(StreamingQuery query) {
    StreamExecution execution = execution(query);
    Thread thread = execution == null ? null : execution.queryExecutionThread();
    if (thread == null || !waitingForTrigger(thread)) {
      return false;
    }
    execution.state().set(TERMINATED$.MODULE$);
    if (waitingForTrigger(thread)) { // still asleep, so past no check since the mark: it ends when woken
      thread.interrupt();
    }
    return true;
  }

  /** Whether {@code thread} is in the processing-time trigger's wait for its next trigger time. */
  private static boolean waitingForTrigger(Thread thread) {
    StackTraceElement[] frames = thread.getStackTrace();
    for (int i = 0; i + 1 < frames.length; i++) {
      if (frames[i].getMethodName().equals("waitTillTime")
          && frames[i + 1].getClassName().endsWith(".ProcessingTimeExecutor")) {
        return true;
      }
    }
    return false;
  }

  /**
   * Waits up to {@code timeoutMs} for the marked query's thread to end; whether it has. Once marked, {@code
   * awaitTermination} and {@code isActive} answer from the mark, not from the thread, which may still be running
   * its last batch.
   */
  public static boolean threadEnded(StreamingQuery query, long timeoutMs) throws InterruptedException {
    StreamExecution execution = execution(query);
    if (execution == null) {
      throw new IllegalArgumentException("not a micro-batch query: " + query.name());
    }
    Thread thread = execution.queryExecutionThread();
    thread.join(timeoutMs);
    return !thread.isAlive();
  }

  private static StreamExecution execution(StreamingQuery query) {
    StreamingQuery inner = query instanceof StreamingQueryWrapper wrapper ? wrapper.streamingQuery() : query;
    return inner instanceof StreamExecution execution ? execution : null;
  }
}
