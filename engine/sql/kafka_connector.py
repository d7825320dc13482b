"""The ``kafka`` SQL connector: a topic as a table, read as ``env.read_kafka`` reads it
(a split per partition, positions in checkpoints, watermarks per partition) and written
as ``stream.sink_to_kafka`` writes it (exactly once by default), with the options of
Flink's ``kafka`` connector:

* ``'topic'`` (several: ``'a;b'``) or ``'topic-pattern'``; ``'properties.bootstrap.servers'``
  (required), ``'properties.group.id'``, and any other ``'properties.<librdkafka key>'``;
* ``'format'`` (or ``'value.format'``): ``json`` (a column per declared physical column;
  timestamps as ``yyyy-MM-dd HH:mm:ss.SSS`` text, as Flink's ``json`` format writes them)
  or ``raw`` (the one physical column, BYTES or STRING, is the value);
* ``'scan.startup.mode'``: ``earliest-offset`` (the default here; Flink's is
  ``group-offsets``), ``latest-offset``, ``group-offsets``, ``timestamp``
  (``'scan.startup.timestamp-millis'``); ``'scan.bounded.mode'``: ``unbounded`` (the
  default) or ``latest-offset`` (the job ends where each partition ended when it
  started); ``'scan.topic-partition-discovery.interval'``; ``'scan.watermark.idle-timeout'``
  (a partition without records for that long does not hold the watermark back);
* ``'sink.delivery-guarantee'``: ``exactly-once`` (the default here: a Kafka transaction
  per checkpoint, committed when it completes; Flink's default is ``at-least-once``) or
  ``at-least-once``; ``'sink.transactional-id-prefix'``; ``'sink.partitioner'``
  ``default`` or ``round-robin`` (rows are written without a key).

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=1)
    >>> env.sql('''CREATE TABLE clicks (user_id BIGINT, ts TIMESTAMP(3),
    ...              WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
    ...            WITH ('connector' = 'kafka', 'topic' = 'clicks', 'format' = 'json',
    ...                  'properties.bootstrap.servers' = '127.0.0.1:9092')''')
    SqlResult(sinks=[])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.formats import Json, Raw
from raystream.engine.sources.kafka import KafkaSourceConfig
from raystream.engine.sources.kafka_reader import kafka_stream
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.connector_base import Connector, ScanSpec, duration_ms
from raystream.engine.sql.scan_source import SqlWatermark, TableShape

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle

_STARTUP = {"earliest-offset": "earliest", "latest-offset": "latest",
            "group-offsets": "committed", "timestamp": None}
_BOUNDED = {"unbounded": None, "latest-offset": "latest"}
_DELIVERY = {"exactly-once": "exactly_once", "at-least-once": "at_least_once"}
_PARTITIONERS = ("default", "round-robin")
PROPERTIES = "properties."


class Kafka(Connector):
    name = "kafka"
    options = frozenset({
        "topic", "topic-pattern", "format", "value.format", "scan.startup.mode",
        "scan.startup.timestamp-millis", "scan.bounded.mode",
        "scan.topic-partition-discovery.interval", "scan.watermark.idle-timeout",
        "sink.delivery-guarantee", "sink.transactional-id-prefix", "sink.partitioner"})

    def check(self, table: TableEntry) -> None:
        given = {key for key, _ in table.definition.options}
        # any librdkafka setting may follow 'properties.': only the others are checked
        others = _without_properties(table)
        super().check(others)
        if "properties.bootstrap.servers" not in given:
            raise SqlError(f"CREATE TABLE {table.name}: connector 'kafka' needs option "
                           f"'properties.bootstrap.servers'")
        _Options.of(table)

    def scan(self, table: TableEntry, conditions: tuple[exp.Expr, ...]) -> ScanSpec:
        options = _Options.of(table)
        if options.topics == () and options.pattern is None:
            raise SqlError(f"table {table.name!r}: a kafka table is read from 'topic' or "
                           f"'topic-pattern'")
        physical = table.physical
        value_format = (Json(pa.schema([pa.field(f.name, f.type) for f in physical.fields]))
                        if options.format == "json" else Raw(physical.names[0]))
        shape = TableShape.of(table)
        rowtime, delay = table.schema.rowtime, table.watermark_delay_ms
        config = KafkaSourceConfig(
            options.servers, topics=options.topics, pattern=options.pattern,
            group_id=options.group_id, starting_offsets=options.startup,
            bounded_until=options.bounded, value_format=value_format,
            idleness_s=options.idleness_s, discovery_interval_s=options.discovery_s,
            client_config=options.client)

        def build(env: StreamEnvironment) -> DataStream:
            watermarks = None if rowtime is None else SqlWatermark(rowtime, delay_ms=delay or 0)
            return kafka_stream(env, config, name=table.name, watermarks=watermarks,
                                parallelism=None, shape=shape)
        what = ", ".join(options.topics) or f"pattern {options.pattern}"
        bounded = "bounded" if options.bounded else "unbounded"
        return ScanSpec(table.schema, build, f"kafka {table.name} ({what}, {options.format}, "
                                             f"{bounded})")

    def check_sink(self, table: TableEntry) -> None:
        options = _Options.of(table)
        if len(options.topics) != 1:
            raise SqlError(f"INSERT INTO {table.name}: a kafka table is written to one "
                           f"'topic'")

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        options = _Options.of(table)
        (topic,) = options.topics
        value_format = (Raw(table.physical.names[0]) if options.format == "raw"
                        else Json(timestamps_as_text=True))
        # (librdkafka's keys have dots, never underscores: sink_to_kafka turns them back)
        settings: dict[str, Any] = {k.replace(".", "_"): v for k, v in options.client.items()}
        return stream.sink_to_kafka(
            options.servers, topic, value_format=value_format, delivery=options.delivery,
            transactional_id_prefix=options.transactional_prefix, name=table.name, **settings)


@dataclass(frozen=True)
class _Options:
    servers: str
    topics: tuple[str, ...]
    pattern: str | None
    group_id: str | None
    format: str
    startup: Any
    bounded: str | None
    idleness_s: float | None
    discovery_s: float | None
    delivery: str
    transactional_prefix: str | None
    client: dict[str, str]

    @classmethod
    def of(cls, table: TableEntry) -> "_Options":
        d, where = table.definition, f"CREATE TABLE {table.name}"

        def choose(key: str, choices: Any, default: str) -> str:
            value = d.option(key, default) or default
            if value not in choices:
                raise SqlError(f"{where}: {key!r} is one of {', '.join(choices)}, not {value!r}")
            return value
        format = choose("value.format", ("json", "raw"), d.option("format") or "json")
        if format == "raw" and len(table.physical.fields) != 1:
            raise SqlError(f"{where}: the raw format has one physical column (BYTES or STRING)")
        if format == "raw":
            (f,) = table.physical.fields
            if not (pa.types.is_binary(f.type) or pa.types.is_string(f.type)):
                raise SqlError(f"{where}: the raw format's column is BYTES or STRING")
        startup: Any = _STARTUP[choose("scan.startup.mode", _STARTUP, "earliest-offset")]
        if startup is None:
            millis = d.option("scan.startup.timestamp-millis")
            if millis is None or not millis.strip().isdigit():
                raise SqlError(f"{where}: 'scan.startup.mode' = 'timestamp' needs "
                               f"'scan.startup.timestamp-millis' (epoch milliseconds)")
            startup = {"timestamp": int(millis)}
        idle = d.option("scan.watermark.idle-timeout")
        discovery = d.option("scan.topic-partition-discovery.interval")
        choose("sink.partitioner", _PARTITIONERS, "default")
        topic, pattern = d.option("topic"), d.option("topic-pattern")
        if topic is not None and pattern is not None:
            raise SqlError(f"{where}: give 'topic' or 'topic-pattern', not both")
        client = {key[len(PROPERTIES):]: value for key, value in d.options
                  if key.startswith(PROPERTIES)}
        return cls(
            servers=client.pop("bootstrap.servers", ""),
            topics=tuple(t.strip() for t in topic.split(";") if t.strip()) if topic else (),
            pattern=pattern, group_id=client.pop("group.id", None), format=format,
            startup=startup, bounded=_BOUNDED[choose("scan.bounded.mode", _BOUNDED, "unbounded")],
            idleness_s=None if idle is None else duration_ms(
                idle, f"{where}: 'scan.watermark.idle-timeout'") / 1000,
            discovery_s=10.0 if discovery is None else (duration_ms(
                discovery, f"{where}: 'scan.topic-partition-discovery.interval'") / 1000 or None),
            delivery=_DELIVERY[choose("sink.delivery-guarantee", _DELIVERY, "exactly-once")],
            transactional_prefix=d.option("sink.transactional-id-prefix"), client=client)


def _without_properties(table: TableEntry) -> TableEntry:
    definition = dataclasses.replace(table.definition, options=tuple(
        (k, v) for k, v in table.definition.options if not k.startswith(PROPERTIES)))
    return dataclasses.replace(table, definition=definition)
