"""2,000,000 result rows into Spark: the RayDP hand-off against the committed Parquet files.

One raystream job (parallelism 2, checkpoints on) computes 2,000,000 rows
``{"id", "key", "value", "name", "ts"}`` (int64, int64, float64, string,
timestamp) and sends them to two sinks: ``collect()`` (an Arrow table in the
driver) and the exactly-once ``sink_to_parquet`` (committed files). Then, in
the same Spark session (RayDP: Spark executors are Ray actors), each path
makes a DataFrame and Spark consumes every value with
``selectExpr("sum(xxhash64(*))")``:

* ``raydp``: ``result.to_spark(spark, collect_sink)`` -- the table goes into
  Ray's object store in driver-owned blocks, Spark's Python workers fetch
  them and hand Arrow batches to Spark (``mapInArrow``; ``raystream.spark.handoff``);
* ``parquet``: ``result.to_spark(spark, parquet_sink)`` = ``rs.spark.read``
  of the committed files.

Each timing covers making the DataFrame and running the query. Both paths
run twice untimed first (JVM warm-up, Python workers connected to Ray), then
5 times each, alternating which goes first; the medians are compared. Both
paths must give the same hash sum (the same rows, types and values). With
``--stock`` RayDP's own ``ray.data.from_arrow(table).to_spark(spark)``
(through pandas) is timed too, for reference (it keeps every block until
Spark stops). ``--profile`` splits the hand-off's time: the driver side
(cast, put, DataFrame), then queries that stop after each step -- a Spark
job whose Python workers yield nothing, one that also fetches the blocks
from Ray, one that hands them to the JVM and counts rows -- and the query.

    ./dev bench bench/spark_handoff.py            # prints both medians, last line RESULT
    ./dev bench bench/spark_handoff.py --stock --profile

The last line is ``RESULT raydp_over_parquet=<median raydp time / median
parquet time>``: below 1 the hand-off is faster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

import raystream as rs

ROWS = 2_000_000
REPEATS = 5
NAMES = np.array([f"user-{k:04d}" for k in range(1000)])


def rows(i: np.ndarray) -> dict:
    return {"id": i, "key": (i * 7919) % 10_007, "value": i * 0.001 - 17.5,
            "name": NAMES[i % len(NAMES)],
            "ts": (1_700_000_000_000_000 + i * 1_003).astype("datetime64[us]")}


def consume(df) -> int:
    return df.selectExpr("sum(xxhash64(*)) AS h").collect()[0]["h"]


def timed(make) -> tuple[float, int]:
    start = time.perf_counter()
    value = consume(make())
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--stock", action="store_true", help="also time RayDP's own to_spark")
    parser.add_argument("--profile", action="store_true", help="split the hand-off's time")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"machine: {os.cpu_count()} cores; other jobs on it may slow both paths alike")

    work = tempfile.mkdtemp(prefix="spark-handoff-")
    try:
        out = os.path.join(work, "out")
        env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
            interval_s=2.0, storage=os.path.join(work, "chk")))
        results = env.from_sequence(args.rows, rows, batch_size=50_000, name="rows")
        collected = results.collect(name="collected")
        written = results.sink_to_parquet(out, name="parquet")
        started = time.perf_counter()
        result = env.execute("spark-handoff")
        print(f"job: {args.rows:,} rows to collect() and to Parquet in "
              f"{time.perf_counter() - started:.1f} s")
        table = result.table(collected)
        assert table.num_rows == args.rows, table.num_rows
        files = written.committed_files()
        print(f"result: {table.nbytes / 1e6:.0f} MB in the driver; {len(files)} committed "
              f"Parquet files, {sum(os.path.getsize(f) for f in files) / 1e6:.0f} MB")

        spark = rs.spark.session("spark-handoff", configs={"spark.ui.showConsoleProgress": "false"})
        paths = {"raydp": lambda: result.to_spark(spark, collected),
                 "parquet": lambda: result.to_spark(spark, written)}
        if args.stock:
            import ray

            paths["stock raydp (pandas)"] = lambda: ray.data.from_arrow(table).to_spark(spark)
        names = list(paths)
        for _ in range(2):  # warm-up: JIT, Python workers and their Ray connection
            warm = {name: timed(paths[name]) for name in names}
        values = {v for _, v in warm.values()}
        assert len(values) == 1, f"the paths disagree on the data: {warm}"
        print(f"warm-up done; every path gives sum(xxhash64(*)) = {values.pop()}")

        times: dict[str, list[float]] = {name: [] for name in names}
        for repeat in range(args.repeats):
            order = names if repeat % 2 == 0 else names[::-1]
            for name in order:
                seconds, _ = timed(paths[name])
                times[name].append(seconds)
        for name in names:
            print(f"{name:>22}: median {statistics.median(times[name]):.3f} s  "
                  f"({', '.join(f'{t:.3f}' for t in times[name])})")

        if args.profile:
            profile(spark, table)

        ratio = statistics.median(times["raydp"]) / statistics.median(times["parquet"])
        print(f"RESULT raydp_over_parquet={ratio:.3f}")
    finally:
        rs.spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def _drain(batches, **fetch_args):
    """A mapInArrow function that fetches the blocks like the hand-off and yields nothing."""
    from raystream.spark.handoff import _fetch_blocks

    for _ in _fetch_blocks(batches, **fetch_args):
        pass
    return iter(())


def profile(spark, table: pa.Table) -> None:
    """Where the hand-off's time goes, step by step (fastest and median of 5: on a busy
    machine the fastest run shows the cost best)."""
    import functools

    import ray

    from raystream.spark import handoff

    def median_of(fn, n: int = 5) -> tuple[float, float]:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return min(samples), statistics.median(samples)

    def count(df) -> int:
        return df.selectExpr("count(1)").collect()[0][0]

    driver = median_of(lambda: handoff.to_spark(spark, table))
    df = handoff.to_spark(spark, table)
    blocks = df.rdd.getNumPartitions()
    key = list(handoff._live)[-1]
    context = ray.get_runtime_context()
    nothing = spark.range(0, blocks, 1, blocks).mapInArrow(lambda it: iter(()), df.schema)
    fetched = spark.range(0, blocks, 1, blocks).mapInArrow(functools.partial(
        _drain, key=key, address=context.gcs_address, namespace=context.namespace), df.schema)
    steps = [("driver: cast, ray.put, DataFrame", driver),
             ("Spark job + Python workers, no data", median_of(lambda: count(nothing))),
             ("... + fetching the blocks from Ray", median_of(lambda: count(fetched))),
             ("... + Arrow to the JVM, rows counted", median_of(lambda: count(df))),
             ("... + every value hashed (the query)", median_of(lambda: consume(df)))]
    print(f"profile of the hand-off ({blocks} block(s), {table.num_rows:,} rows):")
    for label, (fastest, median) in steps:
        print(f"  {label:<40} fastest {fastest:.3f} s, median {median:.3f} s")


if __name__ == "__main__":
    main()
