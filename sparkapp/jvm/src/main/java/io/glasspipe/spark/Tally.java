package io.glasspipe.spark;

/** Hits and misses of a faster path: worth trying until it has missed 64 times and more often than not. */
final class Tally {
  private long hits;
  private long misses;

  boolean worthTrying() {
    return misses < 64 || misses <= hits;
  }

  /** Counts {@code hit} and returns it. */
  boolean count(boolean hit) {
    if (hit) {
      hits++;
    } else {
      misses++;
    }
    return hit;
  }
}
