"""How much Ray and Spark print: only raystream's own lines unless asked for more.

Ray prints C++ lines (``gcs_client.cc: GcsClient has no Cluster ID set``) from
every process, and INFO/WARNING lines at start-up; Spark's JVM prints log4j
warnings about the host name and native Hadoop. None of it is about the job.
So, unless verbose: Ray's Python logger is at ERROR and the output of Ray's
worker processes stays in their log files (``/tmp/ray/session_latest/logs``;
a job's failures still reach the driver, with their tracebacks). The messages
raylets send to drivers (``(raylet) WARNING: 16 PYTHON worker processes have
been started``, printed by a thread of Ray's driver that ``log_to_driver`` does
not stop) go to the Python logger ``raystream.ray`` instead
(:func:`quiet_raylet_messages`); the raylet's log file (``raylet.out``) has
them too. Spark's part is in :mod:`raystream.spark.quiet`; Ray's start-up in
:mod:`raystream.core.ray_start`; librdkafka's in :mod:`raystream.engine.kafka_client`.
``RAYSTREAM_LOG=debug`` (``raystream run --verbose``, ``./dev demo --verbose``)
leaves Ray's and Spark's own settings alone.

    >>> import os
    >>> os.environ.pop("RAYSTREAM_LOG", None) and None
    >>> verbose()
    False
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["LOG_LEVEL_VARIABLE", "RAY_MESSAGES_LOGGER", "quiet_ray", "quiet_raylet_messages",
           "set_verbose", "verbose"]

LOG_LEVEL_VARIABLE = "RAYSTREAM_LOG"
RAY_MESSAGES_LOGGER = "raystream.ray"
VERBOSE_LEVELS = ("debug", "info", "verbose")


def verbose() -> bool:
    """Whether the user asked for Ray's and Spark's own output (``RAYSTREAM_LOG=debug``)."""
    return os.environ.get(LOG_LEVEL_VARIABLE, "").strip().lower() in VERBOSE_LEVELS


def set_verbose() -> None:
    """Ask for Ray's and Spark's own output in this process and those it starts."""
    os.environ[LOG_LEVEL_VARIABLE] = "debug"


def quiet_ray(init_kwargs: dict[str, Any]) -> None:
    """Before ``ray.init``: Ray's Python logger at ERROR and worker output left in the
    workers' log files, unless verbose or set by the caller."""
    if verbose():
        return
    init_kwargs.setdefault("logging_level", logging.ERROR)
    init_kwargs.setdefault("log_to_driver", False)


def quiet_raylet_messages() -> None:
    """Before (or after) ``ray.init`` on a driver, unless verbose: the raylets' messages to drivers go
    to the logger :data:`RAY_MESSAGES_LOGGER` (printed only where the program configured
    logging) rather than to stdout.

    Ray's driver thread ``listen_error_messages`` prints each with the module function
    ``ray._private.worker.print_to_stdstream`` as ``pid="raylet"``, looked up when it
    prints (the worker-output printer of ``log_to_driver`` kept the original, and is
    off anyway); that function is wrapped here, and ``tests/test_quiet_logs.py`` fails
    when a Ray version changes it.
    """
    if verbose():
        return
    from ray._private import worker

    original = worker.print_to_stdstream
    if getattr(original, "raystream_wrapped", False):
        return
    logger = logging.getLogger(RAY_MESSAGES_LOGGER)
    if not logger.handlers:  # (else Python's last-resort handler prints it on stderr)
        logger.addHandler(logging.NullHandler())

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        for line in data.get("lines", ()):
            logger.warning("%s", line)

    setattr(print_to_stdstream, "raystream_wrapped", True)
    worker.print_to_stdstream = print_to_stdstream
