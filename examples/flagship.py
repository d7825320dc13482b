"""Flagship example: a click stream sessionized per user, written exactly once, queried with PySpark.

A deterministic generator produces click events (user, page, event time,
dwell time), up to 1.5 s out of order. raystream keys the engaged clicks by
user and cuts them into event-time session windows (10 s of inactivity ends a
session; window state and timers per key, checkpointed every 0.5 s), and
writes one row per session to an exactly-once Parquet sink. Spark, started on
Ray through RayDP, reads only the committed files and ranks the users with
Spark SQL. The figures are checked against numpy over the same input.

Run it with ``./dev demo`` (sets everything up first), or ``python examples/flagship.py``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
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


SESSION_GAP_MS = 10_000  # a user's session ends after 10 s of event time without a click


def build_job(env: rs.StreamEnvironment, n: int, output: str) -> rs.SinkHandle:
    events = env.from_sequence(n, clicks, batch_size=8192, num_splits=4, name="clicks",
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=2000))
    engaged = events.filter_batches(lambda b: pc.greater(b["dwell_ms"], 1000), name="engaged")
    sessions = engaged.key_by("user").window(
        rs.EventTimeSessionWindows(gap_ms=SESSION_GAP_MS), timestamp="ts").agg(
        name="sessions", clicks=("count", None), dwell_ms=("sum", "dwell_ms"),
        longest_dwell_ms=("max", "dwell_ms"))
    return sessions.sink_to_parquet(output, name="sessions-out")


def sessions_with_numpy(n: int) -> dict[str, tuple[int, int]]:
    """The oracle: per user, (sessions, clicks) from the generated input, with numpy."""
    generated = clicks(np.arange(n, dtype=np.int64))
    keep = generated["dwell_ms"] > 1000
    users, ts = generated["user"][keep], generated["ts"][keep]
    order = np.lexsort((ts, users))
    users, ts = users[order], ts[order]
    new_user = np.r_[True, users[1:] != users[:-1]]
    new_session = new_user | np.r_[True, np.diff(ts) > SESSION_GAP_MS]
    result = {}
    for user, sessions, count in zip(users[new_user], np.add.reduceat(new_session, np.flatnonzero(new_user)),
                                     np.diff(np.r_[np.flatnonzero(new_user), len(users)])):
        result[str(user)] = (int(sessions), int(count))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's and Spark's own log lines too (RAYSTREAM_LOG=debug)")
    args = parser.parse_args()
    if args.verbose:
        os.environ["RAYSTREAM_LOG"] = "debug"

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        output = os.path.join(work, "sessions")
        env = rs.StreamEnvironment(parallelism=args.parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.5, storage=os.path.join(work, "checkpoints")))
        build_job(env, args.events, output)
        print(f"job plan:\n{env.plan().describe()}\n")
        result = env.execute("clickstream-sessions")
        completed = sum(c.status == "COMPLETED" for c in result.checkpoints)
        print(f"raystream: {args.events:,} clicks sessionized in {result.run_s:.1f} s "
              f"(start-up {result.deploy_s:.1f} s, {completed} checkpoints, "
              f"exactly-once Parquet output in {output})")

        spark_started = time.perf_counter()
        spark = rs.spark.session("raystream-flagship")
        print(f"spark: session on Ray through RayDP in {time.perf_counter() - spark_started:.1f} s")
        query_started = time.perf_counter()
        rs.spark.read(spark, output).createOrReplaceTempView("sessions")  # committed files only
        top = spark.sql("""
            SELECT user, count(*) AS sessions, sum(clicks) AS clicks,
                   round(avg(window_end - window_start) / 1000, 1) AS avg_session_s,
                   round(sum(dwell_ms) / sum(clicks) / 1000, 2) AS avg_dwell_s
            FROM sessions GROUP BY user ORDER BY sessions DESC, clicks DESC, user LIMIT 10""")
        print("\nMost engaged users (Spark SQL over raystream's committed Parquet output):")
        top.show(truncate=False)
        rows = top.collect()
        print(f"spark: read and query in {time.perf_counter() - query_started:.1f} s")

        expected = sessions_with_numpy(args.events)  # independent check over the same input
        got = {row["user"]: (row["sessions"], row["clicks"]) for row in rows}
        mismatched = {u: (g, expected.get(u)) for u, g in got.items() if expected.get(u) != g}
        assert not mismatched, f"raystream/Spark disagree with numpy: {mismatched}"
        print(f"checked against numpy: {len(got)} users agree; total "
              f"{time.perf_counter() - started:.1f} s")
        rs.spark.stop()


if __name__ == "__main__":
    main()
