"""A Spark session on Ray through RayDP, with defaults that work on a laptop.

    >>> import raystream as rs
    >>> spark = rs.spark.session()            # doctest: +SKIP
    >>> spark.range(3).count()                # doctest: +SKIP
    3
    >>> rs.spark.stop()                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

from raystream.core.ray_start import ensure_ray
from raystream.spark.quiet import children_stderr_without_ray_info, quiet_spark, requiet_spark
from raystream.spark.extra import require_spark

LAPTOP_CONFIGS = {
    # Few partitions: a laptop has few cores and small results.
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.showConsoleProgress": "false",  # no progress bars between the rows a job prints
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
}

_session = None


def session(app_name: str = "raystream", *, address: str | None = None, num_executors: int = 1,
            executor_cores: int = 1, executor_memory: str = "1g",
            configs: Mapping[str, str] | None = None) -> Any:
    """Start (or reuse) Ray and a Spark session whose executors are Ray actors (RayDP).

    The Python workers use this interpreter (``PYSPARK_PYTHON``), so they see
    the same virtualenv as the driver.
    """
    global _session
    if _session is not None:
        return _session
    require_spark("rs.spark.session()")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    ensure_ray(address)
    import raydp

    merged = {**LAPTOP_CONFIGS, **(configs or {})}
    quiet_spark(merged)
    with children_stderr_without_ray_info():  # the Spark driver JVM started here keeps it
        _session = raydp.init_spark(app_name, num_executors=num_executors,
                                    executor_cores=executor_cores,
                                    executor_memory=executor_memory, configs=merged)
    requiet_spark(_session, merged)
    return _session


def stop() -> None:
    """Stop the Spark session started by :func:`session` (Ray keeps running)."""
    global _session
    if _session is None:
        return
    import raydp

    from raystream.spark.handoff import release_all

    release_all()  # no DataFrame can use hand-off blocks once Spark is gone
    raydp.stop_spark()
    _session = None
