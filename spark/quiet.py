"""Spark's and RayDP's start-up output.

Spark's JVM prints log4j warnings about the host name and native Hadoop, about
a streaming query's temporary checkpoint directory (``ResolveWriteToStream``),
and the INFO lines Ray's C++ code prints before its logging is set up (in
RayDP's JVM, which writes to this process's stderr). None of it is about the
job. Unless ``RAYSTREAM_LOG=debug`` (:func:`verbose`), a Spark session gets a
log4j configuration that writes Spark's warnings to a file beside Ray's logs
(:func:`spark_log_file`: ``/tmp/ray/session_latest/logs/raystream-spark-driver-<pid>.log``)
and only its errors to stderr too, and those INFO lines are filtered out of
the JVM's stderr. Ray's own settings, and :func:`verbose`, are in
:mod:`raystream.core.logs`.

    >>> import os
    >>> os.environ.pop("RAYSTREAM_LOG", None) and None
    >>> verbose()
    False
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

from raystream.core.logs import verbose

# Spark's driver JVM (RayDP reads this file name from its config): WARN, minus the
# start-up warnings about this machine rather than the job
SPARK_LOG4J_FILE = Path(__file__).resolve().parent / "log4j2-quiet.properties"


def quiet_spark(configs: dict[str, str]) -> None:
    """Before a Spark session starts (Ray is up): a log4j configuration that keeps Spark's
    lines in :func:`spark_log_file` (errors on stderr too), and the loopback address
    Spark would otherwise warn it picked instead of the host name (the session binds to
    127.0.0.1 anyway), unless verbose or set by the caller."""
    if verbose():
        return
    if "spark.log4j.config.file.name" not in configs:
        configs["spark.log4j.config.file.name"] = str(SPARK_LOG4J_FILE)
        # (RayDP adds its own options to the driver's)
        configs["spark.driver.extraJavaOptions"] = " ".join(filter(None, [
            configs.get("spark.driver.extraJavaOptions"),
            f"-Draystream.spark.log={spark_log_file()}"]))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def requiet_spark(spark: Any, configs: dict[str, str]) -> None:
    """Once the session is up: load raystream's log4j configuration again, unless verbose
    or the caller gave one. Ray's Java runtime, started by RayDP in the driver JVM,
    replaced it with a console logger at WARN (Ray's ``LoggingUtil``), which printed
    Spark's warnings (``ResolveWriteToStream``) between the job's lines."""
    if verbose() or configs.get("spark.log4j.config.file.name") != str(SPARK_LOG4J_FILE):
        return
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.reconfigure(
        jvm.java.io.File(str(SPARK_LOG4J_FILE)).toURI())


def spark_log_file() -> Path:
    """Where the Spark driver of this process writes its log: in the log directory of the
    Ray session it runs on, else the temporary directory."""
    import tempfile

    from ray._private import worker  # (Ray has no public name for its session's logs)

    name = f"raystream-spark-driver-{os.getpid()}.log"
    try:
        logs = Path(worker._global_node.get_logs_dir_path())  # pyright: ignore
        logs.mkdir(parents=True, exist_ok=True)
        return logs / name
    except Exception:  # (no node of its own: a Ray Client, say)
        return Path(tempfile.gettempdir()) / name



# "[2026-11-25 15:59:49,208 I 1261 1523] gcs_client.cc:96: ...": an INFO line of Ray's C++ code
_RAY_NATIVE_INFO = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} I \d+ \d+\] ")


@contextlib.contextmanager
def children_stderr_without_ray_info() -> Iterator[None]:
    """Processes started inside the block write their stderr through a filter that drops
    Ray's C++ INFO lines and passes everything else on, for as long as they run; this
    process's own stderr is restored when the block ends. Nothing happens when verbose."""
    if verbose():
        yield
        return
    read_end, write_end = os.pipe()
    original = os.dup(2)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines, os.fdopen(os.dup(original), "wb", 0) as out:
            for line in lines:  # ends when every process holding the write end has exited
                if not _RAY_NATIVE_INFO.match(line):
                    out.write(line)

    threading.Thread(target=forward, name="raystream-stderr-filter", daemon=True).start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(original, 2)
        os.close(original)
