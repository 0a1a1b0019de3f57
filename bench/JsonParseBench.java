import java.io.DataInputStream;
import java.io.FileInputStream;
import java.io.BufferedInputStream;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import io.glasspipe.spark.JsonValues;
import io.glasspipe.spark.PlainJson;
import org.apache.spark.sql.catalyst.InternalRow;

/**
 * The job's JSON readers on the same records, in one JVM (bench/json_parse.py makes the records and runs this):
 * CPU-ns a record of PlainJson.read (AsciiJson first) and of PlainJson.readWithJackson (the Jackson parser alone),
 * in alternating rounds after a warm-up, and a check that both give the same row for every record.
 *
 * <p>java -cp SPARK_JARS/*:OPS_JAR bench/JsonParseBench.java RECORDS SCHEMA_JSON CORRUPT_COLUMN ROUNDS
 */
public final class JsonParseBench {
  public static void main(String[] args) throws IOException {
    List<byte[]> records = new ArrayList<>();
    try (DataInputStream in = new DataInputStream(new BufferedInputStream(new FileInputStream(args[0])))) {
      while (in.available() > 0) {
        byte[] r = new byte[in.readInt()];
        in.readFully(r);
        records.add(r);
      }
    }
    PlainJson reader = JsonValues.plainReader(args[1], args[2]);
    int rounds = Integer.parseInt(args[3]);
    long differ = 0;
    long ascii = 0;
    for (byte[] r : records) {
      InternalRow a = reader.readAscii(r.clone());
      InternalRow j = reader.readWithJackson(r.clone());
      ascii += a == null ? 0 : 1;
      if (!String.valueOf(reader.read(r.clone())).equals(String.valueOf(j))) {
        differ++;
      }
    }
    System.out.printf("%d records, %d read by AsciiJson itself, %d whose rows differ between the two paths%n",
        records.size(), ascii, differ);
    ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
    long[][] ns = new long[2][rounds];
    for (int round = -3; round < rounds; round++) { // three rounds of warm-up
      for (int path = 0; path < 2; path++) {
        long sink = 0;
        long start = cpu.getCurrentThreadCpuTime();
        for (byte[] r : records) {
          InternalRow row = path == 0 ? reader.read(r) : reader.readWithJackson(r);
          sink += row == null ? 0 : row.numFields();
        }
        long spent = cpu.getCurrentThreadCpuTime() - start;
        if (sink == 42) {
          System.out.print("");
        }
        if (round >= 0) {
          ns[path][round] = spent;
        }
      }
    }
    String[] names = {"PlainJson.read (AsciiJson first)", "PlainJson.readWithJackson"};
    double[] median = new double[2];
    for (int path = 0; path < 2; path++) {
      long[] sorted = ns[path].clone();
      Arrays.sort(sorted);
      median[path] = (double) sorted[rounds / 2] / records.size();
      System.out.printf("%-34s median %6.0f CPU-ns a record over %d rounds (min %.0f, max %.0f)%n", names[path],
          median[path], rounds, (double) sorted[0] / records.size(), (double) sorted[rounds - 1] / records.size());
    }
    System.out.printf("AsciiJson first: %.2fx the Jackson parser's CPU a record%n", median[0] / median[1]);
  }
}
