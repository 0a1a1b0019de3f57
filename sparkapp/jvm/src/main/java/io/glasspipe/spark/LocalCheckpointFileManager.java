package io.glasspipe.spark;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

/**
 * Spark's default checkpoint file manager, except that on a local file system a checkpoint file is
 * written and renamed with plain Java file calls. Without Hadoop's native library, Hadoop's local file
 * system starts a process for each file it creates ({@code chmod}) and four for each rename
 * ({@code readlink} of both paths and their checksum files): in a stateful micro-batch that is the
 * offset and commit logs plus every state store's changelog, ~60 processes per batch for a join with
 * four shuffle partitions (a JFR recording of {@code bench/join_state.py}).
 *
 * <p>The files are the same as the default manager writes (no checksum file, as it writes none for
 * them either), so a checkpoint moves freely between the two. Atomicity is kept: a rename that must
 * not overwrite is a hard link (which fails if the target exists) then an unlink of the temporary
 * file; one that may overwrite is an atomic move. Other file systems (HDFS, object stores) go
 * through the default manager unchanged.
 *
 * <p>Set with {@code spark.sql.streaming.checkpointFileManagerClass} (glasspipe.contract).
 */
public class LocalCheckpointFileManager extends FileContextBasedCheckpointFileManager {
  private final boolean local;

  public LocalCheckpointFileManager(Path path, Configuration hadoopConf) {
    super(path, hadoopConf);
    // the file context is the path's own file system (or the default one, for a path without a scheme)
    this.local = isLocal();
  }

  private static File fileOf(Path path) {
    return new File(path.toUri().getPath());
  }

  @Override
  public FSDataOutputStream createTempFile(Path path) {
    if (!local) {
      return super.createTempFile(path);
    }
    try {
      // the default manager creates with CREATE|OVERWRITE: truncate an existing file
      return new FSDataOutputStream(new FileOutputStream(fileOf(path), false), null);
    } catch (IOException e) {
      throw rethrown(e);
    }
  }

  @Override
  public void renameTempFile(Path srcPath, Path dstPath, boolean overwriteIfPossible) {
    if (!local) {
      super.renameTempFile(srcPath, dstPath, overwriteIfPossible);
      return;
    }
    java.nio.file.Path src = fileOf(srcPath).toPath();
    java.nio.file.Path dst = fileOf(dstPath).toPath();
    try {
      // a checksum file left by an older writer of the same name would not match the new file
      Files.deleteIfExists(dst.resolveSibling("." + dst.getFileName() + ".crc"));
      if (overwriteIfPossible) {
        Files.move(src, dst, StandardCopyOption.ATOMIC_MOVE); // rename(2), same directory
      } else {
        try {
          Files.createLink(dst, src); // link(2) fails if dst exists: no check-then-act window
        } catch (java.nio.file.FileAlreadyExistsException e) {
          // what the default manager throws; callers (the offset log, RenameBasedFSDataOutputStream) catch it
          throw new FileAlreadyExistsException("rename destination " + dstPath + " already exists");
        }
        Files.delete(src);
      }
    } catch (IOException e) {
      throw rethrown(e);
    }
  }

  /** Throws {@code e} unchanged (Scala declares no checked exceptions; callers catch Hadoop's IOExceptions). */
  @SuppressWarnings("unchecked")
  private static <E extends Exception> RuntimeException rethrown(Exception e) throws E {
    throw (E) e;
  }
}
