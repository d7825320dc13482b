"""Flagship example: a click stream, running per-user aggregates, queried with PySpark.

A deterministic generator produces click events (user, page, event time,
dwell time), slightly out of order. raystream keys them by user and keeps a
running aggregate per user (clicks and total dwell time) on Ray actors; the
result goes to Spark through RayDP, where a Spark SQL query ranks the users.
The numbers are checked against numpy over the same generated input.

Run it with ``./dev demo`` (sets everything up first), or ``python examples/flagship.py``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import raystream as rs

PAGES = np.array(["home", "search", "product", "cart", "checkout"])
BASE_TS = 1_700_000_000_000  # ms since the epoch


def clicks(index: np.ndarray) -> dict[str, object]:
    """Event ``i`` of the click stream: a pure function of ``i``, so replays agree."""
    jitter = (index * 1103515245 + 12345) % 3000 - 1500  # up to 1.5 s out of order
    spread = ((index * 2654435761) % (1 << 32)) / (1 << 32)
    user = (5000 * spread ** 3).astype(np.int64)  # a few heavy users, a long tail
    return {
        "user": np.char.add("user-", user.astype(str)),
        "page": PAGES[(index * 7) % len(PAGES)],
        "ts": BASE_TS + index * 5 + jitter,
        "dwell_ms": (index * 37) % 30_000,
    }


def running_totals(acc: dict, click: dict) -> dict:
    return {"user": click["user"], "clicks": acc["clicks"] + click["clicks"],
            "dwell_ms": acc["dwell_ms"] + click["dwell_ms"], "last_page": click["last_page"]}


def build_job(env: rs.StreamEnvironment, n: int) -> rs.SinkHandle:
    events = env.from_sequence(n, clicks, batch_size=8192, num_splits=4, name="clicks",
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=2000))
    engaged = events.filter_batches(lambda b: pc.greater(b["dwell_ms"], 1000), name="engaged")
    shaped = engaged.map_batches(lambda b: pa.record_batch({
        "user": b["user"], "clicks": pa.array(np.ones(b.num_rows, np.int64)),
        "dwell_ms": b["dwell_ms"], "last_page": b["page"]}), name="shape")
    return shaped.key_by("user").reduce(running_totals, name="per-user").collect(name="totals")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()

    started = time.perf_counter()
    env = rs.StreamEnvironment(parallelism=args.parallelism)
    sink = build_job(env, args.events)
    print(f"job plan:\n{env.plan().describe()}\n")
    result = env.execute("clickstream")
    updates = result.table(sink)
    print(f"raystream: {args.events:,} clicks -> {updates.num_rows:,} running-total updates "
          f"in {result.run_s:.1f} s (start-up {result.deploy_s:.1f} s)")

    spark_started = time.perf_counter()
    spark = rs.spark.session("raystream-flagship")
    print(f"spark: session on Ray through RayDP in {time.perf_counter() - spark_started:.1f} s")
    query_started = time.perf_counter()
    df = rs.spark.to_spark(spark, updates)
    df.createOrReplaceTempView("updates")
    top = spark.sql("""
        SELECT user, max(clicks) AS clicks, round(max(dwell_ms) / max(clicks) / 1000, 2) AS avg_dwell_s
        FROM updates GROUP BY user ORDER BY clicks DESC, user LIMIT 10""")
    print("\nTop users (Spark SQL over raystream's output):")
    top.show(truncate=False)
    print(f"spark: hand-off and query in {time.perf_counter() - query_started:.1f} s")

    # Independent check with numpy over the same generated input.
    generated = clicks(np.arange(args.events, dtype=np.int64))
    engaged = generated["dwell_ms"] > 1000
    users, counts = np.unique(generated["user"][engaged], return_counts=True)
    expected = dict(zip(users.tolist(), counts.tolist()))
    got = {row["user"]: row["clicks"] for row in top.collect()}
    assert all(expected[user] == clicks_ for user, clicks_ in got.items()), "mismatch with numpy"
    print(f"checked against numpy: {len(got)} users agree; total {time.perf_counter() - started:.1f} s")
    rs.spark.stop()


if __name__ == "__main__":
    main()
