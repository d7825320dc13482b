"""Spark's and RayDP's start-up output.

Spark's JVM prints log4j warnings about the host name and native Hadoop, and
the INFO lines Ray's C++ code prints before its logging is set up (in RayDP's
JVM, which writes to this process's stderr). None of it is about the job.
Unless ``RAYSTREAM_LOG=debug`` (:func:`verbose`), a Spark session gets a
quieter log4j configuration, and those INFO lines are filtered out of the
JVM's stderr. Ray's own settings, and :func:`verbose`, are in :mod:`raystream.core.logs`.

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
from typing import Iterator

from raystream.core.logs import verbose

# Spark's driver JVM (RayDP reads this file name from its config): WARN, minus the
# start-up warnings about this machine rather than the job
SPARK_LOG4J_FILE = Path(__file__).resolve().parent / "log4j2-quiet.properties"


def quiet_spark(configs: dict[str, str]) -> None:
    """Before a Spark session starts: a log4j configuration without the start-up noise,
    and the loopback address Spark would otherwise warn it picked instead of the host
    name (the session binds to 127.0.0.1 anyway), unless verbose or set by the caller."""
    if verbose():
        return
    configs.setdefault("spark.log4j.config.file.name", str(SPARK_LOG4J_FILE))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")



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
