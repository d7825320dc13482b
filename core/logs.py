"""How much Ray and Spark print: only raystream's own lines unless asked for more.

Ray prints C++ lines (``gcs_client.cc: GcsClient has no Cluster ID set``) from
every process, and INFO/WARNING lines at start-up; Spark's JVM prints log4j
warnings about the host name and native Hadoop. None of it is about the job.
So, unless verbose: Ray's Python logger is at ERROR and the output of Ray's
worker processes stays in their log files (``/tmp/ray/session_latest/logs``;
a job's failures still reach the driver, with their tracebacks). Spark's part
is in :mod:`raystream.spark.quiet`; Ray's start-up in :mod:`raystream.core.ray_start`.
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

__all__ = ["LOG_LEVEL_VARIABLE", "quiet_ray", "set_verbose", "verbose"]

LOG_LEVEL_VARIABLE = "RAYSTREAM_LOG"
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
