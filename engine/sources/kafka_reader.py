"""The reader of a Kafka source: the operator of each source subtask (Flink ``KafkaSourceReader``).

:class:`KafkaReaderOperator` reads the partitions its enumerator
(:class:`~raystream.engine.sources.kafka.KafkaSplitEnumerator`) assigned to its subtask
with one consumer (``assign``, never a group subscription): a split's position is the
next offset to read and lives in the checkpoint, which is the truth. Offsets are
committed back to ``group_id`` when a checkpoint completes, for lag monitoring only.
Watermarks are per partition; a partition that had no record for ``idleness_s`` does not
hold the subtask's watermark back until records come again.

Rows are Arrow batches: the decoded value's columns (:mod:`raystream.engine.formats`:
``value_format="json"``, one pyarrow JSON read per polled batch; ``"avro"`` and
``"protobuf"``, one column per field; ``"raw"``, the bytes as ``value``), then
``key``, ``topic``, ``partition``, ``offset``, ``timestamp`` (int64 ms) and
``headers`` (:data:`METADATA`); a decoded field of the same name as one of these wins
over it.

A value that does not decode fails the job with a
:class:`~raystream.engine.sources.kafka.KafkaRecordError` naming topic, partition, offset
and cause, or with ``errors="dead_letter"`` goes to side output
``rs.sources.DEAD_LETTERS`` as one row (topic, partition, offset, key, value, error;
:data:`DEAD_LETTER_SCHEMA`) while the rest of its batch is read on.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raystream.actors.messages import MIN_WATERMARK
from raystream.actors.operator import OperatorSnapshot
from raystream.engine.operators.source import SourceReaderOperator
from raystream.engine.sources.files import OnError
from raystream.engine.sources.kafka import (KafkaError, KafkaRecordError, KafkaSource,
                                            KafkaSourceConfig, PartitionState, split_id)
from raystream.engine.sources.split_enumerator import SourceCoordinator
from raystream.engine.watermarks import BoundedOutOfOrderness

if TYPE_CHECKING:  # imported by jobs that use Kafka only
    from confluent_kafka import Consumer

    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment

__all__ = ["DEAD_LETTER_SCHEMA", "EMPTY_POLL_WAIT_S", "METADATA", "POLL_LINGER_S",
           "KafkaReaderOperator", "kafka_stream"]

log = logging.getLogger(__name__)

# The metadata columns every row carries after its value's columns.
METADATA = pa.schema([("key", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("timestamp", pa.int64()),
                      ("headers", pa.list_(pa.struct([("key", pa.string()),
                                                      ("value", pa.binary())])))])
DEAD_LETTER_SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                                ("offset", pa.int64()), ("key", pa.binary()),
                                ("value", pa.binary()), ("error", pa.string())])
# A poll that found nothing waits this long in librdkafka the next time (the GIL is
# released meanwhile): no busy loop, and control messages wait at most this long.
EMPTY_POLL_WAIT_S = 0.01
# A poll after one that found records waits up to this long for more (returning early
# when max_poll_records have come): every batch costs a parse, a route and a message
# whatever its size, and at a few thousand rows/s polls that return at once make batches
# of a handful of records whose fixed costs saturate the CPU (bench/kafka.py's latency
# job at 10,000 rows/s: p50 98 -> 40-44 ms, p99 438 -> 136-272 ms with it). Never longer
# than the output's buffer timeout: records wait in the consumer meanwhile, and the rows of
# the poll before wait in the output buffer.
POLL_LINGER_S = 0.005


class KafkaReaderOperator(SourceReaderOperator):
    """Reads the partitions assigned to this subtask with one consumer; see the module."""

    source: KafkaSource
    readers: dict[str, PartitionState]  # what its source's reader() makes

    def __init__(self, name: str, source: KafkaSource,
                 watermarks: BoundedOutOfOrderness | None = None, *,
                 shape: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None) -> None:
        super().__init__(name, source, watermarks)
        self.config = source.config
        self.shape = shape  # (a SQL table's columns, made before the watermark is taken)
        self.consumer: Consumer | None = None
        self._empty_polls = 0
        self._linger_s = POLL_LINGER_S
        self._snapshots: dict[int, dict[str, tuple[str, int, int]]] = {}
        self.bad_records = 0
        self._seen_watermark = MIN_WATERMARK  # the largest any partition of this reader reached

    def open(self) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(self.config.client(**{
            "group.id": self.config.group_id or f"raystream-{self.ctx.job_name}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest"}))
        timeout_ms = self.ctx.buffer_timeout_ms
        self._linger_s = POLL_LINGER_S if timeout_ms < 0 else min(POLL_LINGER_S,
                                                                  timeout_ms / 1000)
        super().open()

    def _opened(self) -> Consumer:
        if self.consumer is None:
            raise RuntimeError(f"kafka source '{self.name}': its consumer is used before open()")
        return self.consumer

    def add_split(self, split: dict, position: int = 0, max_ts: int = MIN_WATERMARK) -> None:
        super().add_split(split, position, max_ts)
        state = self.readers[self.source.split_id(split)]
        if not state.done:
            from confluent_kafka import TopicPartition

            self._opened().incremental_assign([TopicPartition(split["topic"], split["partition"],
                                                             state.position)])

    def _drop_split(self, sid: str) -> None:
        from confluent_kafka import TopicPartition

        state = self.readers.pop(sid)
        if self.watermarks is not None:
            self._seen_watermark = max(self._seen_watermark,
                                       self.watermarks.watermark_for(self.split_max_ts[sid]))
        self.split_max_ts.pop(sid)
        self.splits.pop(sid)
        self._order.remove(sid)
        try:
            self._opened().incremental_unassign([TopicPartition(state.split["topic"],
                                                               state.split["partition"])])
        except Exception:
            pass  # never assigned (it was done when added)

    def emit_next(self) -> bool:
        for sid in [s for s in self._order if self.readers[s].done]:  # bounded: read to its end
            self._drop_split(sid)
            self._advance_watermark()
        if not self._order:
            return super().emit_next()  # no split: ask for one, or end
        consumer = self._opened()
        if self._empty_polls:  # wait for the first record only, then take what is queued
            # (a batch consume with a timeout waits for all of its records or the timeout)
            messages = consumer.consume(1, EMPTY_POLL_WAIT_S)
            if messages:
                messages += consumer.consume(self.config.max_poll_records - 1, 0)
        else:
            messages = consumer.consume(self.config.max_poll_records, self._linger_s)
        if not messages:
            self._empty_polls += 1
            self._catch_up_bounded()
            self._advance_watermark()  # partitions may have gone idle
            return True
        self._empty_polls = 0
        self._emit_messages(messages)
        self._advance_watermark()
        return True

    def caught_up(self) -> bool:
        return self._empty_polls > 0

    def _catch_up_bounded(self) -> None:
        """A bounded partition's last offsets may hold no record for us (transaction
        markers, aborted records): the consumer's position, past them, says it ended."""
        from confluent_kafka import TopicPartition

        waiting = [self.readers[sid] for sid in self._order if self.readers[sid].stop is not None]
        if not waiting:
            return
        for tp in self._opened().position([TopicPartition(s.split["topic"], s.split["partition"])
                                          for s in waiting]):
            state = self.readers.get(split_id(tp.topic, tp.partition))
            # (each is one of the waiting: bounded)
            if state is not None and state.stop is not None and tp.offset >= 0:
                state.position = max(state.position, min(tp.offset, state.stop))

    def _emit_messages(self, messages: list) -> None:
        from confluent_kafka import KafkaError as CKError

        errors = [m for m in messages if m.error() is not None]
        if errors:
            fatal = [m for m in errors if m.error().code() != CKError._PARTITION_EOF]
            if fatal:
                m = fatal[0]
                raise KafkaError(f"kafka source: reading topic '{m.topic()}' partition "
                                 f"{m.partition()} failed: {m.error().str()}")
            messages = [m for m in messages if m.error() is None]
            if not messages:
                return
        topics = pa.array([m.topic() for m in messages], pa.string())
        partitions = np.fromiter((m.partition() for m in messages), np.int32, len(messages))
        offsets = np.fromiter((m.offset() for m in messages), np.int64, len(messages))
        # Keep what this reader still reads, from its position up to a bounded end: a
        # dropped partition's prefetched records, or records past the end, are not ours.
        keep = np.zeros(len(messages), dtype=bool)
        ids = pc.binary_join_element_wise(  # pyright: ignore[reportAttributeAccessIssue]
            topics, pa.array(partitions).cast(pa.string()), "-")
        ids_np = np.asarray(ids.to_pylist(), dtype=object)
        for sid in set(ids_np.tolist()):
            state = self.readers.get(sid)
            if state is None:
                continue
            mine = ids_np == sid
            ok = mine & (offsets >= state.position)
            if state.stop is not None:
                ok &= offsets < state.stop
            keep |= ok
            if mine.any():
                state.position = max(state.position, int(offsets[mine].max()) + 1)
                state.last_record_s = time.monotonic()
        if not keep.all():
            messages = [m for m, k in zip(messages, keep) if k]
            topics, partitions, offsets = topics.filter(pa.array(keep)), partitions[keep], offsets[keep]
            ids_np = ids_np[keep]
        if not messages:
            return
        values = pa.array([m.value() for m in messages], pa.binary())
        parsed, bad = self.config.format.decode(values)
        if bad:
            self._on_bad(bad, messages, values)
            good = np.ones(len(messages), dtype=bool)
            good[[i for i, _ in bad]] = False
            mask = pa.array(good)
        else:
            mask = None
        heads = [m.headers() for m in messages]
        headers = (pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in heads],
                            METADATA.field("headers").type) if any(heads)
                   else pa.nulls(len(messages), METADATA.field("headers").type))
        meta = [pa.array([m.key() for m in messages], pa.binary()), topics,
                pa.array(partitions), pa.array(offsets),
                pa.array(np.fromiter((m.timestamp()[1] for m in messages), np.int64,
                                     len(messages))), headers]
        if mask is not None:
            meta = [column.filter(mask) for column in meta]
            ids_np = ids_np[good]
        names = list(parsed.schema.names)
        columns = list(parsed.columns)
        for f, column in zip(METADATA, meta):
            if f.name not in names:  # a parsed field of the same name wins
                names.append(f.name)
                columns.append(column)
        batch = pa.RecordBatch.from_arrays(columns, names=names)
        if self.shape is not None:
            batch = self.shape(batch)
        if self.watermarks is not None and batch.num_rows:
            ts = self._timestamps(batch)
            for sid in set(ids_np.tolist()):
                mine = ids_np == sid
                self.split_max_ts[sid] = max(self.split_max_ts[sid], int(ts[mine].max()))
        if batch.num_rows:
            self.records_read += batch.num_rows
            self.output.emit(batch)

    def _timestamps(self, batch: pa.RecordBatch) -> np.ndarray:
        from raystream.engine.watermarks import timestamps_ms

        if self.watermarks is None:
            raise RuntimeError(f"source '{self.name}' has no watermarks to take timestamps for")
        return timestamps_ms(batch, self.watermarks.timestamp_column, where=f"source '{self.name}'")

    def _on_bad(self, bad: list[tuple[int, str]], messages: list, values: pa.Array) -> None:
        if self.config.errors is OnError.FAIL:
            i, cause = bad[0]
            m = messages[i]
            raise KafkaRecordError(m.topic(), m.partition(), m.offset(), cause)
        rows = [messages[i] for i, _ in bad]
        self.bad_records += len(rows)
        self.emit_side("dead_letters", pa.RecordBatch.from_arrays([
            pa.array([m.topic() for m in rows], pa.string()),
            pa.array([m.partition() for m in rows], pa.int32()),
            pa.array([m.offset() for m in rows], pa.int64()),
            pa.array([m.key() for m in rows], pa.binary()),
            pa.array([m.value() for m in rows], pa.binary()),
            pa.array([f"cannot parse the Kafka record at topic '{m.topic()}' partition "
                      f"{m.partition()} offset {m.offset()}: {cause}"
                      for m, (_, cause) in zip(rows, bad)], pa.string())],
            schema=DEAD_LETTER_SCHEMA))

    def _advance_watermark(self) -> None:
        if self.watermarks is None or not self._order:
            return
        now = time.monotonic()
        idle_after = self.config.idleness_s
        active = [sid for sid in self._order
                  if idle_after is None or now - self.readers[sid].last_record_s < idle_after]
        for sid in self._order:
            self._seen_watermark = max(self._seen_watermark,
                                       self.watermarks.watermark_for(self.split_max_ts[sid]))
        if not active:
            # Every partition left is idle. Flink would mark the output idle; the runtime
            # has no idle status for a channel, so go as far as this reader's partitions
            # (finished ones too) have: an idle partition's records that come back may be
            # late either way.
            self._emit_watermark(self._seen_watermark)
            return
        self._emit_watermark(min(self.watermarks.watermark_for(self.split_max_ts[sid])
                                 for sid in active))

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "bad_records": self.bad_records}

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        self._snapshots[checkpoint_id] = {
            sid: (s.split["topic"], s.split["partition"], s.position)
            for sid, s in self.readers.items()}
        return super().snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # Offsets go back to the group for lag monitoring only: the checkpoint is the truth.
        positions = self._snapshots.pop(checkpoint_id, None)
        for older in [c for c in self._snapshots if c < checkpoint_id]:
            del self._snapshots[older]
        if positions and self.config.group_id and self.consumer is not None:
            from confluent_kafka import TopicPartition

            try:
                self.consumer.commit(offsets=[TopicPartition(t, p, o)
                                              for t, p, o in positions.values()],
                                     asynchronous=True)
            except Exception as exc:  # monitoring only: never fails the job
                log.warning("%s: committing offsets to group %s failed: %s", self.name,
                            self.config.group_id, exc)

    def close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception:
                pass
            self.consumer = None


def kafka_stream(env: "StreamEnvironment", config: KafkaSourceConfig, *, name: str,
                 watermarks: BoundedOutOfOrderness | None, parallelism: int | None,
                 shape: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None) -> "DataStream":
    """A Kafka source's stream (``env.read_kafka``'s; a SQL table's ``shape`` makes its
    columns inside the reader, so that its rowtime may be a computed column and still be
    watermarked per partition)."""
    source = KafkaSource(config)
    stream = env.add_source(
        lambda op_name: KafkaReaderOperator(op_name, source, watermarks, shape=shape),
        name=name, parallelism=parallelism,
        coordinator=functools.partial(SourceCoordinator, source=source))
    stream.transformation.preflight = source.preflight
    return stream
