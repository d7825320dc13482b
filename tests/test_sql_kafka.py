"""SQL's ``kafka`` connector on a real Kafka-protocol broker (Tansu): Nexmark's
``ddl_kafka.sql`` as published, written by one SQL job (the generator into the topic,
exactly once through a writer's death in a checkpoint) and read by another (Nexmark's
views over it, a window count) against pandas over the same generated events; the raw
format both ways; and the errors a kafka table gets before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import NewTopic  # noqa: E402

import raystream as rs  # noqa: E402
from raystream.nexmark import EventKind  # noqa: E402
from tests.support.kafka import Broker  # noqa: E402
from tests.support.nexmark_sql import QUERIES, events, ms, nexmark_ddl, rows  # noqa: E402



def kafka_ddl(broker: Broker, *, read: bool) -> str:
    """ddl_kafka.sql with its placeholder filled; to ``read`` it, with Flink's option to
    stop where the topic ended when the job started, and a watermark an hour behind
    instead of 4 s: the events' order in each partition is the order two writers' rows
    met there (one of them restarted), so the oracle could not tell which are late."""
    text = (QUERIES / "ddl_kafka.sql").read_text().replace("${BOOTSTRAP_SERVERS}",
                                                           broker.bootstrap)
    if read:
        text = text.replace("'format' = 'json'",
                            "'format' = 'json', 'scan.bounded.mode' = 'latest-offset'")
        text = text.replace("INTERVAL '4' SECOND", "INTERVAL '1' HOUR")
    return text


def test_nexmark_through_kafka_as_published_exactly_once(ray_session, broker, tmp_path):
    """The generator into ``ddl_kafka.sql``'s topic (its writer dies in its second
    checkpoint's snapshot: the open transaction is aborted, the restored writer writes
    those events again); then the views of ``ddl_views.sql`` over the topic: every bid
    once, and the bids per auction of each 10 s window."""
    for future in broker.admin.create_topics([NewTopic("nexmark", 3, 1)]).values():
        future.result()  # (the topic ddl_kafka.sql names)
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=[rs.Failpoint("in_snapshot", operator="kafka", subtask=0,
                                                hit=2, attempt=0)],
        checkpoints=rs.CheckpointConfig(interval_s=0.3, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(2, 0.1))
    env.sql(nexmark_ddl(batch_size=2_048) + ";\n" + kafka_ddl(broker, read=False))
    env.sql("INSERT INTO kafka SELECT event_type, person, auction, bid FROM datagen")
    written = env.execute("nexmark-into-kafka")
    assert written.restarts == 1, written.failures

    produced = broker.read("nexmark")
    assert len(produced) == len(set(produced["value"]))  # each event once
    kinds = pd.Series([json.loads(v)["event_type"] for v in produced["value"]]).value_counts()
    generated = {kind: len(events(kind)) for kind in EventKind}
    assert kinds.to_dict() == {0: generated[EventKind.PERSON], 1: generated[EventKind.AUCTION],
                               2: generated[EventKind.BID]}

    env = rs.StreamEnvironment(parallelism=2)
    views = (QUERIES / "ddl_views.sql").read_text().replace("${NEXMARK_TABLE}", "kafka")
    env.sql(kafka_ddl(broker, read=True) + ";\n" + views)
    every = env.sql_query("SELECT * FROM bid").to_stream().collect()
    counts = env.sql_query("""
        SELECT auction, COUNT(*) AS n, window_start
        FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
        GROUP BY auction, window_start, window_end""").to_stream().collect()
    read = env.execute("nexmark-from-kafka")

    b = events(EventKind.BID)
    expected = pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
                             "channel": b["channel"].astype(str), "url": b["url"].astype(str),
                             "dateTime": ms(b["date_time"]), "extra": b["extra"]})
    assert rows(read.table(every)) == rows(expected)
    w = b.assign(window_start=ms(b["date_time"] // 10_000 * 10_000))
    per_window = w.groupby(["auction", "window_start"]).size().rename("n").reset_index()
    assert rows(read.table(counts)) == rows(per_window[["auction", "n", "window_start"]])


def test_the_raw_format_both_ways(ray_session, broker):
    topic = broker.topic(2, "raw")
    lines = [f"line {i}, with a comma".encode() for i in range(300)]
    broker.produce(topic, 0, lines[:150])
    broker.produce(topic, 1, lines[150:])
    out = broker.topic(1, "raw-out")
    env = rs.StreamEnvironment(parallelism=2)
    env.sql(f"""
        CREATE TABLE lines (line STRING) WITH ('connector' = 'kafka', 'topic' = '{topic}',
          'properties.bootstrap.servers' = '{broker.bootstrap}', 'format' = 'raw',
          'scan.bounded.mode' = 'latest-offset', 'properties.client.id' = 'sql-test');
        CREATE TABLE upper_lines (v BYTES) WITH ('connector' = 'kafka', 'topic' = '{out}',
          'properties.bootstrap.servers' = '{broker.bootstrap}', 'value.format' = 'raw',
          'sink.delivery-guarantee' = 'at-least-once');
        INSERT INTO upper_lines SELECT CAST(UPPER(line) AS BYTES) FROM lines""")
    env.execute("raw")
    expected = sorted(v.upper() for v in lines)
    assert sorted(broker.read(out)["value"]) == expected


@pytest.mark.parametrize("options, message", [
    ("'topic' = 't', 'scan.startup.mode' = 'newest'",
     "'scan.startup.mode' is one of earliest-offset, latest-offset, group-offsets, timestamp, "
     "not 'newest'"),
    ("'topic' = 't', 'scan.startup.mode' = 'timestamp'", "needs 'scan.startup.timestamp-millis'"),
    ("'topic' = 't', 'topic-pattern' = 't.*'", "give 'topic' or 'topic-pattern', not both"),
    ("'topic' = 't', 'format' = 'avro'", "'value.format' is one of json, raw, not 'avro'"),
    ("'topic' = 't', 'scan.watermark.idle-timeout' = 'a while'", "'a while' is not a duration"),
    ("'topic' = 't', 'sink.partitioner' = 'fixed'", "one of default, round-robin, not 'fixed'"),
    ("'topic' = 't', 'scan.bounded.mode' = 'timestamp'", "one of unbounded, latest-offset"),
    ("'topc' = 't'", "has no option 'topc'"),
])
def test_kafka_table_errors(options, message):
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(rs.SqlError, match=message):
        env.sql(f"CREATE TABLE k (a BIGINT) WITH ('connector' = 'kafka', "
                f"'properties.bootstrap.servers' = '127.0.0.1:1', {options})")


def test_kafka_table_errors_at_planning():
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(rs.SqlError, match="needs option 'properties.bootstrap.servers'"):
        env.sql("CREATE TABLE k (a BIGINT) WITH ('connector' = 'kafka', 'topic' = 't')")
    with pytest.raises(rs.SqlError, match="the raw format has one physical column"):
        env.sql("CREATE TABLE k (a BYTES, b BYTES) WITH ('connector' = 'kafka', 'topic' = 't', "
                "'properties.bootstrap.servers' = '127.0.0.1:1', 'format' = 'raw')")
    env.sql("CREATE TABLE p (a BIGINT) WITH ('connector' = 'kafka', 'topic-pattern' = 't.*', "
            "'properties.bootstrap.servers' = '127.0.0.1:1')")
    with pytest.raises(rs.SqlError, match="INSERT INTO p: a kafka table is written to one 'topic'"):
        env.sql("INSERT INTO p SELECT a FROM p")
    assert env.transformations == []


def test_the_kafka_to_parquet_example_of_the_docs_plans(capsys):
    """docs/sql.md's Kafka → windows → Parquet job, as EXPLAIN prints it."""
    text = (Path(__file__).parent.parent / "docs" / "sql.md").read_text()
    (block,) = [b for b in re.findall(r"```sql\n(.*?)```", text, re.S) if "'kafka'" in b]
    env = rs.StreamEnvironment(parallelism=1)
    env.sql(block.replace("INSERT INTO", "EXPLAIN INSERT INTO"))
    plan = capsys.readouterr().out
    assert "Sink(table=[per_minute], connector=[filesystem])" in plan
    assert "kafka clicks (clicks, json, unbounded)" in plan
    assert env.transformations == []
