"""The Spark integration's optional dependencies.

raystream runs jobs without Spark; ``rs.spark.*`` needs PySpark and RayDP,
which ``pip install 'raystream[spark]'`` adds. Checking for them where the
integration starts gives an error that says so, instead of a bare
``ModuleNotFoundError`` from deep inside a call.

    >>> require_spark("rs.spark.session()")  # with the extra installed: no error
"""

from __future__ import annotations

import importlib

SPARK_EXTRA = "pip install 'raystream[spark]'"


def require_spark(what: str, *, modules: tuple[str, ...] = ("pyspark", "raydp")) -> None:
    """Raise ImportError naming ``what``, the missing modules and the extra to install."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f"{what} needs {' and '.join(missing)}, which raystream installs only "
                          f"with its Spark extra: {SPARK_EXTRA}")
