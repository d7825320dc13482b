"""Kafka output, exactly once (or at least once), on the Sink V2 API (:mod:`.two_phase`).

``stream.sink_to_kafka(bootstrap_servers, topic)`` is
``sink_exactly_once(KafkaWriter, KafkaCommitter)``.

Exactly once (``delivery="exactly_once"``, the default), for consumers that read
with ``isolation.level=read_committed``: checkpoint ``n``'s records are in one
Kafka transaction that commits only after ``n`` completes.

Flink's KafkaSink writes each checkpoint's records in a transaction that the
committer later resumes by producer id and epoch; librdkafka cannot resume
another producer's transaction, so a crash after ``n`` completed and before
its transaction committed would leave ``n``'s records in a transaction no one
can finish. raystream closes that window with a *write-ahead* instead:

* :class:`KafkaWriter` (at the stream's parallelism) serializes records
  (:mod:`raystream.engine.formats`: JSON lines and keys through Arrow kernels,
  :mod:`raystream.engine.json_lines`; Avro or Protobuf, one value per row)
  and, before barrier ``n``, hands them over as committables: Arrow IPC
  (zstd), base64, with the writer's checkpoint label. They travel before
  barrier ``n`` and the committer's snapshot of ``n`` holds them, so they are
  in checkpoint storage once ``n`` completes.
* :class:`KafkaCommitter` (parallelism 1) commits on
  ``notify_checkpoint_complete(n)``: one transaction (fixed
  ``transactional.id`` ``<prefix>``) with every pending record, plus, in the
  same transaction, a *commit marker*: offset ``n`` committed for consumer
  group ``<prefix>.<incarnation>`` (``send_offsets_to_transaction``), so the
  records and the marker become visible together or not at all.
* After a failure, the restored committer's ``init_transactions`` fences any
  zombie and aborts a transaction left open by the dead one; the committables
  of every completed checkpoint are in the restored state; those whose label
  is at or below the marker were committed and are skipped, the rest are
  produced again and committed. So a crash anywhere between completion and
  commit (failpoint ``after_complete_before_commit``) neither loses nor
  duplicates ``n``.

Kafka cannot take a committed transaction back: restoring a snapshot older
than what its run already committed fails with a clear error instead of
duplicating that output.

At least once (``delivery="at_least_once"``): writers produce at once with an
idempotent producer and flush before every barrier; records are visible
right away and may repeat after a failure.

The writer's serialization, runnable without a broker:

    >>> import pyarrow as pa
    >>> keys, values = serialize(pa.record_batch({"user": [1, 2], "n": [10, None]}),
    ...                          key="user", value_format="json")
    >>> keys.to_pylist(), values.to_pylist()
    (['1', '2'], ['{"user":1,"n":10}', '{"user":2,"n":null}'])
"""

from __future__ import annotations

import base64
import logging
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from raystream.engine.errors import RaystreamError, choice
from raystream.engine.formats import FormatError, ValueFormat, value_format_of
from raystream.engine.kafka_client import BrokerCheck, client_config, serve_logs
from raystream.engine.operators.two_phase import Committer, SinkContext, SinkWriter

log = logging.getLogger(__name__)

_RECORDS = pa.schema([("key", pa.string()), ("value", pa.binary())])
_IPC = pa.ipc.IpcWriteOptions(compression="zstd")
# librdkafka's wait for more records to batch with (linger.ms), unless the job sets one
LINGER_MS = 5


class Delivery(Enum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"

    @classmethod
    def of(cls, value: "Delivery | str") -> "Delivery":
        return choice(cls, value, "delivery")


class KafkaSinkError(RaystreamError):
    """The Kafka sink could not write or commit; names the topic and the cause."""


@dataclass(frozen=True)
class KafkaSinkConfig:
    """What :meth:`DataStream.sink_to_kafka` writes.

    >>> KafkaSinkConfig("127.0.0.1:9092", "out", transactional_id_prefix="job-out").delivery
    <Delivery.EXACTLY_ONCE: 'exactly_once'>
    """

    bootstrap_servers: str
    topic: str
    transactional_id_prefix: str
    key: str | None = None
    # "json": the row as a JSON object; "raw": column "value"; "avro", "protobuf" (with
    # value_schema) or a format of raystream.engine.formats: held as that format once built
    value_format: ValueFormat | str = "json"
    value_schema: Any = None
    delivery: Delivery = Delivery.EXACTLY_ONCE
    timeout_s: float = 30.0
    client_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "value_format", value_format_of(
            self.value_format, value_schema=self.value_schema, where="sink_to_kafka"))
        object.__setattr__(self, "value_schema", None)  # the format holds it (a message
        # class does not pickle: the format carries its descriptors instead)
        if not self.topic:
            raise ValueError("sink_to_kafka: topic must be a non-empty string")

    def client(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for a client of this sink (its log lines to the logger of
        :mod:`raystream.engine.kafka_client`)."""
        return client_config({"bootstrap.servers": self.bootstrap_servers, "log_level": 3,
                              "linger.ms": LINGER_MS, "queue.buffering.max.messages": 1_000_000,
                              **dict(self.client_config), **extra})

    def preflight(self) -> None:
        """Before the job starts: the broker answers and the topic is there, or the broker
        creates it now (``auto.create.topics.enable``), as it would for the sink's first
        record: this asks for the topic's metadata as the sink's producer will, as Flink's
        KafkaSink relies on the broker to create a topic it writes to."""
        from confluent_kafka import Producer

        check = BrokerCheck(f"sink_to_kafka({self.bootstrap_servers!r}, {self.topic!r})",
                            self.bootstrap_servers, self.timeout_s)
        metadata = check.metadata(lambda settings: Producer(self.client(**settings)),
                                  topic=self.topic)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            why = topic.error.str() if topic is not None and topic.error else "no answer"
            raise check.missing_topic(self.topic, metadata,
                                      f"does not exist, and the broker did not create it "
                                      f"({why})")


def linger_ms(client_config: Mapping[str, Any], buffer_timeout_ms: float) -> float:
    """How long the at-least-once producer lets a record wait for others: ``linger.ms``
    when the job sets it, else :data:`LINGER_MS` but never longer than the sink's buffer
    timeout (-1: none), which bounds every other wait of a row on its way out.

    >>> linger_ms({}, 1.0), linger_ms({}, 50.0), linger_ms({}, -1), linger_ms({"linger.ms": 20}, 1.0)
    (1.0, 5, 5, 20)
    """
    if "linger.ms" in client_config:
        return client_config["linger.ms"]
    return LINGER_MS if buffer_timeout_ms < 0 else min(LINGER_MS, buffer_timeout_ms)


def serialize(batch: pa.RecordBatch, *, key: str | None,
              value_format: ValueFormat | str) -> tuple[pa.Array | None, pa.Array]:
    """Keys (strings, or None) and values of a batch (as ``value_format`` writes them)."""
    keys = None
    if key is not None:
        if key not in batch.schema.names:
            raise KafkaSinkError(f"sink_to_kafka: key column '{key}' is missing (columns: "
                                 f"{', '.join(batch.schema.names)})")
        column = batch.column(key)
        keys = column if pa.types.is_string(column.type) else pc.cast(column, pa.string())
    fmt = value_format_of(value_format, where="sink_to_kafka") if isinstance(
        value_format, str) else value_format
    try:
        values = fmt.encode(batch, where="sink_to_kafka")
    except FormatError as e:
        raise KafkaSinkError(str(e)) from None
    return keys, values


def _encode(keys: pa.Array | None, values: pa.Array) -> str:
    n = len(values)
    table = pa.table([keys if keys is not None else pa.nulls(n, pa.string()),
                      values.cast(pa.binary())], schema=_RECORDS)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _RECORDS, options=_IPC) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def _decode(data: str) -> pa.Table:
    return pa.ipc.open_stream(pa.BufferReader(base64.b64decode(data))).read_all()


class _Delivery:
    """Collects the first delivery error of a producer (reports on errors only)."""

    def __init__(self, topic: str) -> None:
        self.topic, self.error = topic, None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None and self.error is None:
            self.error = err

    def check(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise KafkaSinkError(f"kafka sink: producing to topic '{self.topic}' failed: "
                                 f"{err.str()}")


def _produce_all(producer: Any, topic: str, keys: list, values: list) -> None:
    produce = producer.produce
    for k, v in zip(keys, values):
        try:
            produce(topic, v, k)
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)
            produce(topic, v, k)
    producer.poll(0)


class KafkaWriter(SinkWriter):
    """Serializes rows; exactly once: hands them to the committer as committables before
    every barrier; at least once: produces them at once and flushes before a barrier."""

    def __init__(self, config: KafkaSinkConfig) -> None:
        self.config = config

    def open(self, ctx: SinkContext) -> None:
        self.ctx = ctx
        self.buffered: list[tuple[pa.Array | None, pa.Array]] = []
        self.producer = None
        if self.config.delivery is Delivery.AT_LEAST_ONCE:
            from confluent_kafka import Producer

            self.delivery = _Delivery(self.config.topic)
            self.producer = Producer(self.config.client(**{
                "enable.idempotence": True, "delivery.report.only.error": True,
                "on_delivery": self.delivery,
                "linger.ms": linger_ms(self.config.client_config,
                                       ctx.runtime.buffer_timeout_ms)}))

    def write(self, batch: pa.RecordBatch) -> None:
        keys, values = serialize(batch, key=self.config.key, value_format=self.config.value_format)
        if self.producer is None:
            self.buffered.append((keys, values))
            return
        _produce_all(self.producer, self.config.topic,
                     keys.to_pylist() if keys is not None else [None] * len(values),
                     values.to_pylist())
        self.delivery.check()

    def prepare_commit(self, checkpoint_id: int | None) -> list[dict]:
        if self.producer is not None:  # at least once: everything so far is in Kafka
            left = self.producer.flush(self.config.timeout_s)
            self.delivery.check()
            if left:
                raise KafkaSinkError(f"kafka sink: {left} records to topic "
                                     f"'{self.config.topic}' not delivered within "
                                     f"{self.config.timeout_s:g} s")
            return []
        if not self.buffered:
            return []
        parts, self.buffered = self.buffered, []
        keys = (pa.concat_arrays([k if k is not None else pa.nulls(len(v), pa.string())
                                  for k, v in parts])
                if any(k is not None for k, _ in parts) else None)
        values = pa.concat_arrays([v.cast(pa.binary()) for _, v in parts])
        label = checkpoint_id if checkpoint_id is not None else self.ctx.next_checkpoint_id
        rt = self.ctx.runtime
        return [{"id": f"{label}-{rt.subtask_index}-{rt.attempt}-{uuid.uuid4().hex[:8]}",
                 "checkpoint": label, "rows": len(values), "records": _encode(keys, values)}]

    def abort(self) -> None:
        self.buffered = []
        if self.producer is not None:
            self.producer.flush(1.0)


class _UpTo:
    """The committables (``"<label>:<id>"``) at or below a committed checkpoint: what a
    commit marker says was committed, as a set to test membership in."""

    def __init__(self, *marks: int) -> None:
        self.marks = marks

    def __contains__(self, committable_id: object) -> bool:
        label = int(str(committable_id).split(":", 1)[0])
        return any(label <= m for m in self.marks)

    def __or__(self, other: "_UpTo") -> "_UpTo":
        return _UpTo(*self.marks, *other.marks)

    __ior__ = __or__

    def __bool__(self) -> bool:
        return any(m >= 0 for m in self.marks)


class KafkaCommitter(Committer):
    """Commits checkpoints' records in one transaction each, with a commit marker in it."""

    def __init__(self, config: KafkaSinkConfig) -> None:
        self.config = config

    def open(self, ctx: SinkContext) -> None:
        from confluent_kafka import KafkaException, Producer

        self.ctx = ctx
        self.markers: dict[str, int] = {}
        self._groups: dict[str, Any] = {}
        self.delivery = _Delivery(self.config.topic)
        self.producer = None
        if self.config.delivery is Delivery.AT_LEAST_ONCE:
            return  # the writers produce; nothing is ever committed here
        self.producer = Producer(self.config.client(**{
            "transactional.id": self.config.transactional_id_prefix,
            "transaction.timeout.ms": max(60_000, int(self.config.timeout_s * 2000)),
            "delivery.report.only.error": True, "on_delivery": self.delivery}))
        try:
            # Fences a zombie of an older attempt and aborts what it left open.
            self.producer.init_transactions(self.config.timeout_s)
        except KafkaException as exc:
            raise KafkaSinkError(f"kafka sink: cannot start transactions on "
                                 f"{self.config.bootstrap_servers} for topic "
                                 f"'{self.config.topic}': {exc.args[0].str()}") from None

    def _group(self, incarnation: str) -> Any:
        if incarnation not in self._groups:
            from confluent_kafka import Consumer

            self._groups[incarnation] = Consumer(self.config.client(**{
                "group.id": f"{self.config.transactional_id_prefix}.{incarnation}",
                "enable.auto.commit": False}))
        return self._groups[incarnation]

    def marker(self, incarnation: str) -> int:
        """The last checkpoint ``incarnation`` committed to the topic (-1: none)."""
        if self.producer is None:
            return -1  # at least once: no transactions, no markers
        if incarnation not in self.markers:
            from confluent_kafka import TopicPartition

            group = self._group(incarnation)
            (tp,) = group.committed([TopicPartition(self.config.topic, 0)],
                                    timeout=self.config.timeout_s)
            serve_logs(group)  # (it is assigned no partition: it only keeps the marker)
            self.markers[incarnation] = tp.offset if tp.offset >= 0 else -1
        return self.markers[incarnation]

    def committable_id(self, committable: dict) -> str:
        return f"{committable['checkpoint']}:{committable['id']}"

    def committed_ids(self, incarnation: str) -> _UpTo:  # type: ignore[override]
        return _UpTo(self.marker(incarnation))

    def truncate(self, incarnation: str, above: int) -> list[int]:
        committed = self.marker(incarnation)
        if committed > above:
            raise KafkaSinkError(
                f"kafka sink: run {incarnation} already committed checkpoint {committed} to "
                f"topic '{self.config.topic}', after checkpoint {above} being restored; Kafka "
                f"transactions cannot be undone, so restoring it would duplicate that output")
        return []

    def commit(self, incarnation: str, checkpoint_id: int, committables: list[dict]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        done = self.marker(incarnation)
        if checkpoint_id <= done:
            return  # committed before a failure: its marker says so
        todo = [c for c in committables if c["checkpoint"] > done]
        # The window the write-ahead closes: checkpoint n is complete, its records are
        # not in Kafka yet. A death here is repaired by the restored committer.
        self.ctx.failpoint("after_complete_before_commit")
        producer = self.producer
        if producer is None:
            raise RuntimeError("kafka sink: a commit without the transactional producer "
                               "(an at-least-once sink commits nothing)")
        try:
            producer.begin_transaction()
            for c in todo:
                records = _decode(c["records"])
                _produce_all(producer, self.config.topic, records.column("key").to_pylist(),
                             records.column("value").to_pylist())
            self.ctx.failpoint("mid_commit")
            group = self._group(incarnation).consumer_group_metadata()
            producer.send_offsets_to_transaction(
                [TopicPartition(self.config.topic, 0, checkpoint_id)], group,
                self.config.timeout_s)
            producer.commit_transaction(self.config.timeout_s)
        except KafkaException as exc:
            raise KafkaSinkError(f"kafka sink: committing checkpoint {checkpoint_id} to topic "
                                 f"'{self.config.topic}' failed: {exc.args[0].str()}") from None
        self.delivery.check()
        self.markers[incarnation] = checkpoint_id
