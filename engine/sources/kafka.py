"""Kafka topics as a split-based source: one split per topic partition (Flink ``KafkaSource``).

``env.read_kafka(bootstrap_servers, topics=[...])`` reads with the
``confluent-kafka`` client (librdkafka):

* :class:`KafkaSplitEnumerator` (the source's operator coordinator, in the job
  master) lists the partitions of the topics (or of every topic matching
  ``pattern``) on a worker thread, resolves where each starts (and, bounded,
  where it ends), and hands each partition to one reader: partition ``p`` of
  topic ``t`` to reader ``(crc32(t) + p) % parallelism``, so a topic's
  partitions are spread evenly. It lists again every ``discovery_interval_s``
  and hands out partitions that appeared meanwhile, read from their earliest
  offset. Its state is the partitions it has seen and those not handed out.
* :class:`~raystream.engine.sources.kafka_reader.KafkaReaderOperator` (each source
  subtask) reads its partitions with one consumer: a split's position is the next
  offset to read and lives in the checkpoint, which is the truth. Watermarks are per
  partition.

This module holds the source's configuration and errors, its splits and the enumerator
with its requests to the broker; the reader, the rows it emits and what becomes of a
value that does not decode are :mod:`raystream.engine.sources.kafka_reader`'s.

The broker's "latest" offset is never taken on trust (Tansu 0.6 answers
ListOffsets with a high watermark that lags behind what it has stored and
serves): a bounded read to ``"latest"`` ends where a fetch says the partition
ends (:func:`end_offsets`).

Values decode a batch at a time, with the source's format:

    >>> import pyarrow as pa
    >>> config = KafkaSourceConfig("127.0.0.1:9092", topics=("clicks",),
    ...                            schema=pa.schema([("user", pa.int64())]))
    >>> parsed, bad = config.format.decode(pa.array([b'{"user": 1}', b'{"user": 2}']))
    >>> parsed.to_pydict(), bad
    ({'user': [1, 2]}, [])
    >>> config.format.decode(pa.array([b'{"user": 1}', b'{"user": ']))[1]
    [(1, 'JSON parse error: Invalid value')]
"""


from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa

from raystream.engine.errors import RaystreamError
from raystream.engine.formats import ValueFormat, value_format_of
from raystream.engine.kafka_client import BrokerCheck, client_config, serve_logs
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.sources.files import OnError
from raystream.engine.sources.split_enumerator import SplitEnumerator, SplitEnumeratorContext


class KafkaError(RaystreamError):
    """The broker cannot be reached, a topic is missing, or the client failed: one line."""


class KafkaRecordError(RaystreamError):
    """A Kafka record's value could not be decoded: names topic, partition, offset and the
    cause."""

    def __init__(self, topic: str, partition: int, offset: int, cause: str) -> None:
        super().__init__(f"cannot parse the Kafka record at topic '{topic}' partition "
                         f"{partition} offset {offset}: {cause}")
        self.topic, self.partition, self.offset = topic, partition, offset


@dataclass(frozen=True)
class KafkaSourceConfig:
    """What :meth:`StreamEnvironment.read_kafka` reads; validated when built.

    ``starting_offsets``: ``"earliest"``, ``"latest"``, ``"committed"`` (the
    group's committed offsets, earliest where there are none) or
    ``{"timestamp": ms}`` (the first record at or after it).
    ``bounded_until``: None (unbounded), ``"latest"`` (where each partition
    ends when the job starts) or ``{(topic, partition): offset}`` (exclusive;
    a partition not named is not read; partitions are discovered until every
    named one has appeared). ``value_format``: ``"json"`` (with ``schema``, an
    Arrow schema, or inferred), ``"raw"``, ``"avro"`` or ``"protobuf"`` (with
    ``value_schema``: the Avro schema, or the message class), or a format of
    :mod:`raystream.engine.formats`; it is held as that format once built.

    >>> KafkaSourceConfig("127.0.0.1:9092", topics=("clicks",)).starting_offsets
    'earliest'
    >>> KafkaSourceConfig("127.0.0.1:9092")
    Traceback (most recent call last):
    ...
    ValueError: read_kafka: give topics=[...] or pattern=..., not neither
    """

    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    group_id: str | None = None
    starting_offsets: str | Mapping[str, int] = "earliest"
    bounded_until: str | Mapping[tuple[str, int], int] | None = None
    value_format: ValueFormat | str = "json"
    schema: pa.Schema | None = None
    value_schema: Any = None
    idleness_s: float | None = None
    discovery_interval_s: float | None = 10.0
    max_poll_records: int = 10_000
    errors: OnError = OnError.FAIL
    timeout_s: float = 10.0  # for the broker to answer metadata and offset requests
    client_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.topics) == (self.pattern is not None):
            raise ValueError("read_kafka: give topics=[...] or pattern=..., not "
                             + ("both" if self.topics else "neither"))
        if isinstance(self.starting_offsets, str):
            if self.starting_offsets not in ("earliest", "latest", "committed"):
                raise ValueError(f"read_kafka: starting_offsets must be 'earliest', 'latest', "
                                 f"'committed' or {{'timestamp': ms}}, not "
                                 f"{self.starting_offsets!r}")
        elif set(self.starting_offsets) != {"timestamp"}:
            raise ValueError("read_kafka: starting_offsets as a dict is {'timestamp': ms}")
        if isinstance(self.bounded_until, str) and self.bounded_until != "latest":
            raise ValueError(f"read_kafka: bounded_until must be None, 'latest' or "
                             f"{{(topic, partition): offset}}, not {self.bounded_until!r}")
        if self.idleness_s is not None and self.idleness_s <= 0:
            raise ValueError("read_kafka: idleness_s must be > 0")
        if self.discovery_interval_s is not None and self.discovery_interval_s <= 0:
            raise ValueError("read_kafka: discovery_interval_s must be > 0 or None")
        if self.starting_offsets == "committed" and not self.group_id:
            raise ValueError("read_kafka: starting_offsets='committed' needs a group_id")
        object.__setattr__(self, "value_format", value_format_of(
            self.value_format, schema=self.schema, value_schema=self.value_schema,
            where="read_kafka"))
        object.__setattr__(self, "value_schema", None)  # the format holds it (a message
        # class does not pickle: the format carries its descriptors instead)

    @property
    def format(self) -> ValueFormat:
        """The format values decode with (``value_format`` once built is one)."""
        if isinstance(self.value_format, str):  # __post_init__ made it a format
            raise RuntimeError("read_kafka: value_format was not resolved")
        return self.value_format

    def client(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for a client of this source (its log lines to the logger
        of :mod:`raystream.engine.kafka_client`)."""
        return client_config({"bootstrap.servers": self.bootstrap_servers, "log_level": 3,
                              "socket.connection.setup.timeout.ms": int(self.timeout_s * 1000),
                              **dict(self.client_config), **extra})

    @property
    def call(self) -> str:
        """The user's call, for messages."""
        what = (f"topics={list(self.topics)!r}" if self.topics
                else f"pattern={self.pattern!r}")
        return f"read_kafka({self.bootstrap_servers!r}, {what})"


def split_id(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def owner_of(topic: str, partition: int, parallelism: int) -> int:
    """The reader of a partition: a topic's partitions round-robin from a start that
    depends on the topic (Flink ``KafkaSourceEnumerator.getSplitOwner``).

    >>> [owner_of("clicks", p, 2) for p in range(4)]
    [1, 0, 1, 0]
    """
    return (zlib.crc32(topic.encode()) + partition) % parallelism


# -- talking to the broker (enumerator worker threads) -----------------------------
def list_partitions(config: KafkaSourceConfig, consumer: Any) -> list[tuple[str, int]]:
    """Every (topic, partition) the source reads now; a named topic that does not exist,
    or a broker that does not answer, is a :class:`KafkaError`."""
    from confluent_kafka import KafkaException

    try:
        metadata = consumer.list_topics(timeout=config.timeout_s)
    except KafkaException as exc:
        raise KafkaError(f"kafka source: cannot reach the broker at {config.bootstrap_servers} "
                         f"within {config.timeout_s:g} s: {exc.args[0].str()}") from None
    found = []
    if config.pattern is not None:
        regex = re.compile(config.pattern)
        names = sorted(t for t in metadata.topics if regex.fullmatch(t))
    else:
        names = list(config.topics)
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            why = topic.error.str() if topic is not None and topic.error else "no such topic"
            raise KafkaError(f"kafka source: topic '{name}' is not readable on "
                             f"{config.bootstrap_servers}: {why}")
        found.extend((name, p) for p in sorted(topic.partitions))
    return found


def end_offsets(consumer: Any, partitions: list[tuple[str, int]], timeout_s: float) -> dict:
    """Where each partition ends now, as a fetch sees it.

    ListOffsets' "latest" is not trusted (Tansu 0.6 lags behind what it stores):
    each partition is fetched from that offset on, and the high watermark of the
    fetch response (which a fetch always carries) is the end.
    """
    from confluent_kafka import KafkaError as CKError, TopicPartition

    if not partitions:
        return {}
    reported = {}
    for topic, p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s,
                                                   cached=False)
        reported[(topic, p)] = (low, high)
    consumer.assign([TopicPartition(t, p, max(reported[(t, p)][0], reported[(t, p)][1] - 1))
                     for t, p in partitions])
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(partitions):
        if time.monotonic() > deadline:
            raise KafkaError(f"kafka source: no fetch answer for {sorted(set(reported) - seen)} "
                             f"within {timeout_s:g} s")
        for m in consumer.consume(1000, 0.1):
            if m.error() is None or m.error().code() == CKError._PARTITION_EOF:
                seen.add((m.topic(), m.partition()))
    ends = {}
    for topic, p in partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        ends[(topic, p)] = max(high, reported[(topic, p)][1])
    consumer.unassign()
    return ends


def resolve_splits(config: KafkaSourceConfig, partitions: list[tuple[str, int]],
                   consumer: Any, *, initial: bool) -> list[dict]:
    """The splits of newly found partitions: where each starts and (bounded) ends.
    Partitions found after the first listing start at their earliest offset."""
    from confluent_kafka import TopicPartition

    if not partitions:
        return []
    timeout = config.timeout_s
    lows = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=timeout,
                                               cached=False)[0] for tp in partitions}
    how = config.starting_offsets if initial else "earliest"
    if how == "earliest":
        starts = lows
    elif how == "latest":
        starts = end_offsets(consumer, partitions, timeout)
    elif how == "committed":
        committed = consumer.committed([TopicPartition(*tp) for tp in partitions], timeout=timeout)
        starts = {(c.topic, c.partition): c.offset if c.offset >= 0 else lows[(c.topic, c.partition)]
                  for c in committed}
    elif isinstance(how, str):  # KafkaSourceConfig allows no other
        raise ValueError(f"read_kafka: unknown starting_offsets {how!r}")
    else:  # {"timestamp": ms}
        asked = [TopicPartition(t, p, int(how["timestamp"])) for t, p in partitions]
        found = consumer.offsets_for_times(asked, timeout=timeout)
        ends = None
        starts = {}
        for tp in found:
            if tp.offset < 0:  # no record at or after it: start at the end
                ends = ends or end_offsets(consumer, partitions, timeout)
                starts[(tp.topic, tp.partition)] = ends[(tp.topic, tp.partition)]
            else:
                starts[(tp.topic, tp.partition)] = tp.offset
    bound = config.bounded_until
    if bound is None:
        stops: dict = {}
    elif isinstance(bound, str):  # "latest", the one string KafkaSourceConfig allows
        stops = end_offsets(consumer, partitions, timeout)
    else:
        stops = {tp: int(bound.get(tp, starts[tp])) for tp in partitions}
    return [{"topic": t, "partition": p, "start": int(starts[(t, p)]),
             "stop": int(stops[(t, p)]) if (t, p) in stops else None} for t, p in partitions]


# -- the source ---------------------------------------------------------------------------------
class KafkaSource(Source):
    """Topic partitions as splits ``{"topic", "partition", "start", "stop"}``."""

    def __init__(self, config: KafkaSourceConfig) -> None:
        self.config = config

    def split_id(self, split: dict) -> str:
        return split_id(split["topic"], split["partition"])

    def preflight(self) -> None:
        """The broker answers and every topic named is there (a pattern may match none
        yet: its topics are discovered while the job runs, as in Flink)."""
        from confluent_kafka import Consumer

        config = self.config
        check = BrokerCheck(config.call, config.bootstrap_servers, config.timeout_s)
        # a consumer's metadata request never creates a topic
        metadata = check.metadata(lambda settings: Consumer(config.client(**{
            "group.id": config.group_id or "raystream-preflight", **settings})))
        for name in config.topics:
            topic = metadata.topics.get(name)
            if topic is None or topic.error is not None or not topic.partitions:
                why = (f"is not readable ({topic.error.str()})" if topic is not None
                       and topic.error is not None else "does not exist")
                raise check.missing_topic(name, metadata, why)

    def create_enumerator(self, context: SplitEnumeratorContext, state: Any | None) -> SplitEnumerator:
        return KafkaSplitEnumerator(context, self.config, state)

    def reader(self, split: dict, position: int = 0) -> "PartitionState":
        return PartitionState(split, position)


class PartitionState(SplitReader):
    """One partition of a reader: ``position`` is the next offset to read."""

    def __init__(self, split: dict, position: int) -> None:
        self.split = split
        self.position = max(int(position), int(split["start"]))
        self.stop = split.get("stop")
        self.last_record_s = time.monotonic()  # for idleness

    @property
    def done(self) -> bool:
        return self.stop is not None and self.position >= self.stop

    def next_batch(self) -> None:  # the reader operator polls all its partitions at once
        return None


class KafkaSplitEnumerator(SplitEnumerator):
    """Lists partitions (then every ``discovery_interval_s``, unless bounded) on a worker
    thread and hands each to its owner (:func:`owner_of`) once the owner registered."""

    def __init__(self, context: SplitEnumeratorContext, config: KafkaSourceConfig,
                 state: dict | None) -> None:
        self.context, self.config = context, config
        self.seen: set[str] = set(state["seen"]) if state else set()
        self.pending: list[dict] = list(state["pending"]) if state else []
        self.bounded = config.bounded_until is not None
        # Whether a bounded read has listed every partition it reads is state of its own: a
        # checkpoint taken before the first listing returned holds no partition, and a
        # restore that took that for "listed" would end the job at once with nothing read.
        # (A checkpoint of an older version without it: listed if it saw partitions.)
        self.listed = (bool(state["listed"]) if state and "listed" in state
                       else bool(self.seen) and self._bound_seen())
        self.no_more_sent: set[int] = set()
        self._consumer = None

    def start(self) -> None:
        if not self.listed:
            self._discover()
        else:
            self._hand_out()

    def _client(self) -> Any:  # only ever used by one worker-thread call at a time
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self.config.client(**{
                "group.id": self.config.group_id or "raystream-enumerator",
                "enable.auto.commit": False, "enable.partition.eof": True}))
        return self._consumer

    def _discover(self) -> None:
        config, seen, initial = self.config, frozenset(self.seen), not self.seen

        def new_splits() -> list[dict]:  # on a worker thread
            consumer = self._client()
            found = [tp for tp in list_partitions(config, consumer) if split_id(*tp) not in seen]
            try:
                return resolve_splits(config, found, consumer, initial=initial)
            finally:
                serve_logs(consumer)  # (assigned nothing: resolve_splits unassigns)
        self.context.call_async(new_splits, self._on_discovered)

    def _on_discovered(self, splits: list[dict] | None, error: BaseException | None) -> None:
        if error is not None:
            raise error if isinstance(error, KafkaError) else KafkaError(
                f"kafka source: listing partitions failed: {type(error).__name__}: {error}")
        for split in splits or []:
            sid = split_id(split["topic"], split["partition"])
            if sid not in self.seen:
                self.seen.add(sid)
                self.pending.append(split)
        self.listed = self._bound_seen()
        self._hand_out()
        if not self.listed and self.config.discovery_interval_s is not None:
            self.context.call_later(self.config.discovery_interval_s, self._discover)

    def _bound_seen(self) -> bool:
        """A bounded read lists once; with explicit end offsets, until every partition
        named there has appeared (a topic created while the job runs, say)."""
        bound = self.config.bounded_until
        # a string bound is "latest" (KafkaSourceConfig allows no other)
        return bound is not None and (isinstance(bound, str) or all(
            split_id(t, p) in self.seen for t, p in bound))

    def _hand_out(self) -> None:
        registered = self.context.registered_readers()
        p = self.context.parallelism
        for subtask in sorted(registered):
            mine = [s for s in self.pending if owner_of(s["topic"], s["partition"], p) == subtask]
            if mine:
                self.pending = [s for s in self.pending if s not in mine]
                self.context.assign_splits(mine, subtask)
            if self.listed and subtask not in self.no_more_sent:
                self.no_more_sent.add(subtask)
                self.context.signal_no_more_splits(subtask)

    def add_reader(self, subtask: int) -> None:
        self.no_more_sent.discard(subtask)  # a new attempt's reader
        self._hand_out()

    def handle_split_request(self, subtask: int) -> None:
        self._hand_out()  # a reader without splits waits for new partitions (or the end)

    def add_splits_back(self, splits: list[Any], subtask: int) -> None:
        self.pending.extend(splits)  # to their owner again once it registers

    def snapshot_state(self, checkpoint_id: int) -> dict:
        return {"seen": sorted(self.seen), "pending": list(self.pending), "listed": self.listed}

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                pass
