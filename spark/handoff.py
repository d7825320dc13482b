"""Arrow results into Spark DataFrames through Ray's object store, without files.

:func:`to_spark` puts the table, cast once to the Arrow types Spark reads
(timestamps as microseconds in UTC, plain strings), into Ray's object store
in blocks that the driver owns. The DataFrame maps one row per block with
``mapInArrow``: Spark's Python workers -- RayDP runs them inside executors
that are Ray actors, so they reach the object store of their node -- fetch
their block (zero-copy) and yield Arrow record batches, which Spark reads as
Arrow. Nothing goes through pandas, so int64 columns with nulls, timestamps,
strings and nulls arrive exactly as they were (RayDP's own ``to_spark``
converts through pandas, where int64 with nulls becomes float64 and loses
every value above 2**53).

Block lifetime. A worker asks a small registry actor for its block's ref,
so the ref travels in-band and Ray counts the borrow. The blocks stay in the
object store while any Spark plan still uses the DataFrame -- the DataFrame
itself, one derived from it, a cached or temp-view copy -- and are released
after that, the way Spark's ``ContextCleaner`` releases RDDs: the hand-off
holds a JVM weak reference to the ``mapInArrow`` function that every such
plan shares; after each :func:`to_spark` a background thread runs Python's
and the JVM's garbage collectors and releases the blocks of the hand-offs
whose function is gone (:func:`release_unused` does the same on demand).
Spark keeps the plan of the last job it ran until it runs another, and py4j
tells the JVM about dropped Python objects about once a second, so blocks
leave the store a second or two after their last DataFrame is dropped and
Spark ran something else. :func:`raystream.spark.stop` releases all. (RayDP's
own ``to_spark`` keeps every block in its master actor until Spark stops.)

    >>> import pyarrow as pa, raystream as rs
    >>> spark = rs.spark.session()                                         # doctest: +SKIP
    >>> df = rs.spark.to_spark(spark, pa.table({"x": pa.array([2**60 + 1, None])}))  # doctest: +SKIP
    >>> df.collect()                                                       # doctest: +SKIP
    [Row(x=1152921504606846977), Row(x=None)]
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, cast

import pyarrow as pa
import pyarrow.compute as pc
import ray

from raystream.spark.schema import spark_schema, transfer_schema

log = logging.getLogger(__name__)

REGISTRY_NAME = "raystream-spark-handoff"
REGISTRY_NAMESPACE = "raystream"
# Ray blocks (one Spark partition each): one per executor core, not smaller than this.
MIN_ROWS_PER_BLOCK = 1 << 18
# Arrow batches handed to Spark: bigger ones cost less per row (bench/spark_handoff.py).
BATCH_ROWS = 1 << 18
BATCH_BYTES = 32 << 20


@ray.remote(num_cpus=0)
class BlockRegistry:
    """Lends the refs of hand-off blocks to Spark's Python workers (in-band, counted)."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[ray.ObjectRef]] = {}

    def add(self, key: str, refs: list[ray.ObjectRef]) -> None:
        self.blocks[key] = refs

    def get(self, key: str, index: int) -> ray.ObjectRef | None:
        refs = self.blocks.get(key)
        return None if refs is None else refs[index]

    def remove(self, keys: list[str]) -> None:
        for key in keys:
            self.blocks.pop(key, None)

    def keys(self) -> list[str]:
        return list(self.blocks)


@dataclass
class _Handoff:
    refs: list[ray.ObjectRef]
    function: Any  # a JVM WeakReference to the mapInArrow function, or None


_lock = threading.Lock()
_live: dict[str, _Handoff] = {}


_registry_handle: tuple[str, Any] | None = None  # (Ray job id, handle)


def _registry() -> Any:
    """The registry actor; this driver keeps a handle, without which Ray would end it."""
    global _registry_handle
    job = ray.get_runtime_context().get_job_id()
    if _registry_handle is None or _registry_handle[0] != job:
        _registry_handle = (job, BlockRegistry.options(
            name=REGISTRY_NAME, namespace=REGISTRY_NAMESPACE, get_if_exists=True).remote())
    return _registry_handle[1]


def _for_transfer(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with Spark's Arrow types; timestamps truncated to microseconds
    (Spark's precision, as the Parquet sink writes them)."""
    columns = []
    for column, field in zip(table.columns, schema):
        if column.type == field.type:
            columns.append(column)
        elif pa.types.is_timestamp(column.type):
            columns.append(pc.cast(column, field.type, safe=False))
        else:
            columns.append(pc.cast(column, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _fetch_blocks(batches: Iterator[pa.RecordBatch], *, key: str, address: str,
                  namespace: str) -> Iterator[pa.RecordBatch]:
    """Runs in Spark's Python workers: yield the blocks named by the input rows."""
    import ray

    if not ray.is_initialized():
        # The driver's namespace: RayDP's own to_spark, reusing this worker, expects it.
        ray.init(address=address, namespace=namespace, logging_level=logging.WARNING,
                 log_to_driver=False)
    registry = ray.get_actor(REGISTRY_NAME, namespace=REGISTRY_NAMESPACE)
    for batch in batches:
        for index in batch.column(0).to_pylist():
            # BlockRegistry.get's type (ray.get of an actor call is typed List[Any])
            ref = cast("ray.ObjectRef | None", ray.get(registry.get.remote(key, index)))
            if ref is None:
                raise RuntimeError(f"the Ray blocks of hand-off {key} were released: a DataFrame "
                                   f"from rs.spark.to_spark was used after rs.spark.stop()")
            block = ray.get(ref)
            row_bytes = max(1, block.nbytes // max(1, block.num_rows))
            yield from block.to_batches(max_chunksize=max(1024, min(BATCH_ROWS,
                                                                    BATCH_BYTES // row_bytes)))


def to_spark(spark: Any, table: pa.Table) -> Any:
    """A Spark DataFrame with the rows of ``table``, handed over through Ray's object store.

    Schema (see :mod:`raystream.spark.schema`), types and row count are
    preserved; an empty table gives an empty DataFrame with its columns.
    """
    struct = spark_schema(table.schema)
    if table.num_rows == 0 or table.num_columns == 0:
        empty = spark.createDataFrame([], struct)
        return empty if table.num_rows == 0 else spark.range(table.num_rows).select()
    table = _for_transfer(table, transfer_schema(struct))
    rows_per_block = max(MIN_ROWS_PER_BLOCK, -(-table.num_rows // _executor_cores(spark)))
    refs = [ray.put(table.slice(offset, rows_per_block))  # owned by this driver
            for offset in range(0, table.num_rows, rows_per_block)]
    key = uuid.uuid4().hex
    registry = _registry()
    ray.get(registry.add.remote(key, refs))
    context = ray.get_runtime_context()
    fetch = functools.partial(_fetch_blocks, key=key, address=context.gcs_address,
                              namespace=context.namespace)
    df = spark.range(0, len(refs), 1, len(refs)).mapInArrow(fetch, struct)
    with _lock:
        _live[key] = _Handoff(refs, _weak_function(spark, df))
    _sweep_soon(spark)
    return df


_sweeper: threading.Thread | None = None
_sweep_requested = False


def _sweep_soon(spark: Any) -> None:
    """Release unused hand-offs from a background thread: the garbage collections take a
    tenth of a second or more, which the caller need not wait for. The thread sweeps
    again as long as hand-offs were made during its last sweep."""
    global _sweeper, _sweep_requested
    with _lock:
        _sweep_requested = True
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = threading.Thread(target=_sweep, args=(spark,), daemon=True,
                                        name="raystream-handoff-sweep")
            _sweeper.start()


def _sweep(spark: Any) -> None:
    global _sweep_requested
    while True:
        with _lock:
            if not _sweep_requested:
                return
            _sweep_requested = False
        try:
            release_unused(spark)
        except Exception:  # Spark or Ray stopped meanwhile: stop() released everything
            log.debug("hand-off sweep failed", exc_info=True)
            return


def _executor_cores(spark: Any) -> int:
    """Tasks Spark runs at once: more blocks than that only add tasks."""
    conf = spark.sparkContext.getConf()
    try:
        return max(1, int(conf.get("spark.executor.instances")) *
                   int(conf.get("spark.executor.cores")))
    except (TypeError, ValueError):
        return max(1, int(spark.sparkContext.defaultParallelism))


def _weak_function(spark: Any, df: Any) -> Any:
    """A JVM weak reference to the Python function of ``df``'s ``mapInArrow``, which every
    plan built on ``df`` shares; None if this Spark's plan does not show it."""
    try:
        function = df._jdf.queryExecution().analyzed().functionExpr().func()
        return spark._jvm.java.lang.ref.WeakReference(function)
    except Exception:  # another Spark version: keep the blocks until rs.spark.stop()
        log.warning("cannot track the use of hand-off DataFrames in this Spark version; "
                    "their Ray blocks stay until rs.spark.stop()", exc_info=True)
        return None


def release_unused(spark: Any, *, wait: bool = True) -> int:
    """Release the Ray blocks of hand-offs no Spark plan uses any more; returns how many.

    Runs Python's and the JVM's garbage collectors. py4j tells the JVM about
    dropped DataFrames from a thread that wakes up every second: ``wait``
    gives it that second. Every :func:`to_spark` runs this in a background
    thread.
    """
    with _lock:
        tracked = [key for key, h in _live.items() if h.function is not None]
    if not tracked:
        return 0
    gc.collect()
    if wait:
        time.sleep(1.1)
    spark._jvm.java.lang.System.gc()
    with _lock:
        gone = [key for key in tracked if key in _live and _live[key].function.refersTo(None)]
    _release(gone)
    return len(gone)


def release_all() -> None:
    """Release every hand-off's blocks (Spark is stopping: no DataFrame can use them)."""
    with _lock:
        keys = list(_live)
    _release(keys)


def _release(keys: list[str]) -> None:
    if not keys:
        return
    if ray.is_initialized():
        ray.get(_registry().remove.remote(keys))
    with _lock:
        for key in keys:
            _live.pop(key, None)
