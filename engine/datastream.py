"""The job API: streams and the operations that build a job's logical graph.

Per-row operations (``map``, ``filter``, ``flat_map``, ``reduce``) call a
Python function on dict rows; per-batch operations (``map_batches``,
``filter_batches``) call it on a whole ``pyarrow.RecordBatch`` and are the
fast path.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> clicks = env.from_collection([{"user": "a", "n": 1}, {"user": "b", "n": 2}, {"user": "a", "n": 3}])
    >>> totals = clicks.key_by("user").reduce(lambda acc, row: {"user": row["user"], "n": acc["n"] + row["n"]})
    >>> sink = totals.collect()
    >>> result = env.execute("doc-example")  # doctest: +SKIP
    >>> sorted(result.table(sink).to_pylist(), key=lambda r: (r["user"], r["n"]))  # doctest: +SKIP
    [{'user': 'a', 'n': 1}, {'user': 'a', 'n': 4}, {'user': 'b', 'n': 2}]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, overload

import pyarrow as pa

from raystream.actors.record_writer import check_buffer_timeout
from raystream.checkpoint.operator_coordinator import OperatorCoordinator
from raystream.actors.partitioners import PartitionSpec
from raystream.actors.resources import Resources
from raystream.engine.columns import described, require
from raystream.engine.graph import InputEdge, Transformation
from raystream.engine.keys import KeySelector, KeySpec
from raystream.actors.operator import Operator, SinkOperator
from raystream.engine.operators.async_io import AsyncRetry, AsyncWaitOperator
from raystream.engine.operators.functions import (FilterBatchesOperator, FilterOperator,
                                                  FlatMapOperator, MapBatchesOperator,
                                                  MapOperator, UnionOperator)
from raystream.engine.operators.pool_map import map_batches_operator
from raystream.engine.operators.keyed import (KeyedProcessFunction, KeyedProcessOperator,
                                              ReduceOperator)
from raystream.engine.operators.broadcast import (BroadcastProcessFunction,
                                                  BroadcastProcessOperator,
                                                  KeyedBroadcastProcessFunction,
                                                  KeyedBroadcastProcessOperator,
                                                  MapStateDescriptor)
from raystream.engine.operators.co_process import KeyedCoProcessFunction, KeyedCoProcessOperator
from raystream.engine.interval_join_stream import IntervalJoin
from raystream.engine.operators.sinks import CollectSink, DiscardSink, PrintSink
from raystream.engine.operators.file_sink import (FileFormat, ParquetCommitter, ParquetSinkConfig,
                                                  ParquetSinkHandle, ParquetWriter)
from raystream.engine.operators.two_phase import (Committer, CommitterOperator, SinkWriter,
                                                  SinkWriterOperator)
from raystream.engine.sink_handle import SinkHandle
from raystream.engine.windows.join import TwoStreams, WindowJoinKind
from raystream.engine.windows.stream import (ALL_KEY, CountWindowedStream, WindowedStream,
                                             with_all_key)

if TYPE_CHECKING:
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.formats import ValueFormat
    from raystream.engine.windows.assigners import WindowAssigner
    from raystream.engine.windows.triggers import Trigger

Row = dict[str, Any]


class DataStream:
    """A stream of record batches produced by one transformation.

    A stream may carry a pending partitioning (``rebalance()``,
    ``broadcast()``, ``key_by()``) that applies to the edge into whatever
    consumes it next.

    ``default_timestamp``: the event-time column a ``window(...)``/``window_all(...)``
    on this stream uses when given no ``timestamp=`` (``rs.WINDOW_TIME`` for the
    results of an event-time window, else None).
    """

    default_timestamp: str | None = None

    def __init__(self, env: "StreamEnvironment", transformation: Transformation,
                 partitioning: PartitionSpec | None = None, side_output: str | None = None) -> None:
        self.env = env
        self.transformation = transformation
        self.partitioning = partitioning
        self.side_output_tag = side_output

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The names of this stream's columns where known when the job is built (its
        source declares them, and every operator since keeps them or declares its own),
        else None; names a job uses are checked against them (:mod:`raystream.engine.columns`).

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment()
            >>> env.from_collection([{"user": "a", "ts": 5}]).filter(lambda r: True).columns
            ('user', 'ts')
        """
        return None if self.side_output_tag is not None else self.transformation.columns

    def side_output(self, tag: str) -> "DataStream":
        """The records this stream's operator emits on side output ``tag`` (e.g. late
        records of a window with ``late_output=tag``)."""
        return DataStream(self.env, self.transformation, None, side_output=tag)

    def plain(self) -> "DataStream":
        """This stream without a pending partitioning (what the next operator chains to)."""
        return DataStream(self.env, self.transformation, None, self.side_output_tag)

    def _edge(self, input_index: int = 0) -> InputEdge:
        return InputEdge(self.transformation.id, self.partitioning, input_index,
                         self.side_output_tag)

    # -- configuration of the producing operator ------------------------------------
    def name(self, name: str) -> "DataStream":
        """Rename the operator that produces this stream (names show in errors and actor names)."""
        self.transformation.name = name
        return self

    def set_parallelism(self, parallelism: int) -> "DataStream":
        self.transformation.parallelism = parallelism
        return self

    def set_resources(self, *, num_cpus: float | None = None, memory: int | None = None,
                      resources: dict[str, float] | None = None) -> "DataStream":
        """Resources each subtask of this operator asks Ray for (a cluster feature)."""
        current = self.transformation.resources
        self.transformation.resources = Resources(
            num_cpus if num_cpus is not None else current.num_cpus,
            memory if memory is not None else current.memory,
            tuple(sorted((resources or dict(current.custom)).items())))
        return self

    def set_buffer_timeout(self, timeout_ms: float) -> "DataStream":
        """How long rows of this operator may wait in its output buffer before they are
        sent to the next operator (overrides the job's ``buffer_timeout_ms``): 0 sends
        after every batch (lowest latency), -1 only when the buffer is full."""
        self.transformation.buffer_timeout_ms = check_buffer_timeout(timeout_ms)
        return self

    def disable_chaining(self) -> "DataStream":
        """Run this operator in subtasks of its own (never chained to its neighbours)."""
        self.transformation.chainable = False
        return self

    # -- partitioning ------------------------------------------------------------------
    def rebalance(self) -> "DataStream":
        """Distribute batches round-robin over the next operator's subtasks."""
        return DataStream(self.env, self.transformation, PartitionSpec("rebalance"),
                          self.side_output_tag)

    def broadcast(self, *descriptors: MapStateDescriptor) -> "DataStream | BroadcastStream":
        """Send every batch to every subtask of the next operator. Given broadcast
        state descriptors, a :class:`BroadcastStream` to ``connect`` a stream to
        (see :mod:`raystream.engine.operators.broadcast`)."""
        stream = DataStream(self.env, self.transformation, PartitionSpec("broadcast"),
                            self.side_output_tag)
        return BroadcastStream(stream, descriptors) if descriptors else stream

    def forward(self) -> "DataStream":
        """Subtask i feeds subtask i (equal parallelism required)."""
        return DataStream(self.env, self.transformation, PartitionSpec("forward"),
                          self.side_output_tag)

    def key_by(self, key: KeySpec | KeySelector) -> "KeyedStream":
        """Partition by key: a column, a list of columns, or a function of a row.

        Every key goes to exactly one subtask, chosen by its key group.
        """
        selector = KeySelector.of(key, where=f"key_by after '{self.transformation.name}'")
        if selector.columns is not None:
            require(selector.columns, self.columns, call=f"key_by({described(selector.columns)})",
                    stream=self.transformation.name)
        keyed = KeyedStream(self.env, self.transformation, selector, self.side_output_tag)
        if self.side_output_tag is None:  # a side output has rows of another kind
            keyed.default_timestamp = self.default_timestamp
        return keyed

    def window_all(self, assigner: "WindowAssigner", *, timestamp: str | None = None,
                   allowed_lateness_ms: int = 0, late_output: str | None = None,
                   pre_aggregate: bool = True,
                   trigger: "Trigger | None" = None) -> "WindowedStream":
        """Windows over the whole stream, not per key (Flink's ``windowAll``): one window
        operator subtask (parallelism 1) sees every record; built-in aggregates are still
        pre-aggregated per window upstream, at this stream's parallelism. Results have
        no key column. Arguments as for :meth:`KeyedStream.window`.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=2)
            >>> events = env.from_collection([{"user": "a", "ts": 5}, {"user": "b", "ts": 7}])
            >>> per_second = events.window_all(rs.TumblingEventTimeWindows(size_ms=1000),
            ...                                timestamp="ts").count()
            >>> sorted(env.execute("all").table(per_second.collect()).to_pylist(), key=str)  # doctest: +SKIP
            [{'window_start': 0, 'window_end': 1000, 'count': 2}]
        """
        tagged = self.map_batches(with_all_key, name="window_all-key",
                                  parallelism=self.transformation.parallelism)
        tagged.transformation.columns = None if self.columns is None else (*self.columns,
                                                                           ALL_KEY)
        keyed = KeyedStream(self.env, tagged.transformation, KeySelector.of(ALL_KEY),
                            None)
        if self.side_output_tag is None:
            keyed.default_timestamp = self.default_timestamp
        return WindowedStream(keyed, assigner,
                              timestamp=timestamp or keyed.default_timestamp,
                              allowed_lateness_ms=allowed_lateness_ms, late_output=late_output,
                              pre_aggregate=pre_aggregate, all_windows=True, trigger=trigger)

    # -- operators -----------------------------------------------------------------------
    def _add(self, kind: str, default_name: str, create: Callable[[str], Operator], *,
             name: str | None = None, parallelism: int | None = None,
             inputs: list[InputEdge] | None = None,
             coordinator: Callable[[Any], Any] | None = None,
             columns: tuple[str, ...] | None = None) -> "DataStream":
        """A new operator fed by this stream (or ``inputs``); ``columns``: those of its
        output, if known."""
        op_name = self.env._unique_name(name or default_name)
        t = self.env._add_transformation(
            kind, op_name, lambda: create(op_name),
            parallelism or self.env.parallelism,
            inputs if inputs is not None else [self._edge()], coordinator=coordinator)
        t.columns = columns
        return DataStream(self.env, t)

    def map(self, fn: Callable[[Row], Row], *, name: str | None = None,
            schema: pa.Schema | None = None, parallelism: int | None = None) -> "DataStream":
        """Apply ``fn`` to every row (a dict) and emit the dict it returns."""
        return self._add("operator", "map", lambda n: MapOperator(n, [fn], schema=schema),
                         name=name, parallelism=parallelism, columns=_names(schema))

    def flat_map(self, fn: Callable[[Row], Iterable[Row]], *, name: str | None = None,
                 schema: pa.Schema | None = None, parallelism: int | None = None) -> "DataStream":
        """Apply ``fn`` to every row and emit each row of the iterable it returns."""
        return self._add("operator", "flat_map",
                         lambda n: FlatMapOperator(n, [fn], schema=schema),
                         name=name, parallelism=parallelism, columns=_names(schema))

    def filter(self, fn: Callable[[Row], bool], *, name: str | None = None,
               parallelism: int | None = None) -> "DataStream":
        """Keep the rows for which ``fn(row)`` is true."""
        return self._add("operator", "filter", lambda n: FilterOperator(n, [fn]),
                         name=name, parallelism=parallelism, columns=self.columns)

    def map_batches(self, fn: Callable[[pa.RecordBatch], Any] | type, *,
                    name: str | None = None, parallelism: int | None = None,
                    concurrency: int | tuple[int, int] | None = None,
                    num_cpus: float | None = None, num_gpus: float | None = None,
                    resources: dict[str, float] | None = None, batch_size: int | None = None,
                    constructor_args: tuple[Any, ...] | None = None,
                    constructor_kwargs: dict[str, Any] | None = None,
                    batch_format: str | None = None, ordered: bool | None = None,
                    max_in_flight: int | None = None) -> "DataStream":
        """Apply ``fn`` to whole batches (returns a RecordBatch, a Table or a dict of columns).

        ``fn`` a class (Ray Data's callable class): a pool of Ray actors per subtask, each
        building one ``fn(*constructor_args, **constructor_kwargs)`` and calling it on
        batches of at most ``batch_size`` rows (``batch_format`` "pyarrow" or "numpy"),
        exactly once, in input order unless ``ordered=False``; ``concurrency`` actors or
        ``(min, max)``, each asking Ray for ``num_cpus`` (default 1), ``num_gpus`` and
        ``resources``; at most ``max_in_flight`` batches queued per subtask. See
        :mod:`raystream.engine.operators.pool_map`.

            >>> import raystream as rs
            >>> class Model:
            ...     def __call__(self, batch): return {"y": batch["x"] * 2}
            >>> env = rs.StreamEnvironment()
            >>> scored = env.from_sequence(10, lambda i: {"x": i}).map_batches(
            ...     Model, concurrency=(1, 2), num_cpus=0.1, batch_format="numpy")
        """
        return self._add("operator", "map_batches", map_batches_operator(
            fn, concurrency=concurrency, num_cpus=num_cpus, num_gpus=num_gpus,
            resources=resources, batch_size=batch_size, constructor_args=constructor_args,
            constructor_kwargs=constructor_kwargs, batch_format=batch_format, ordered=ordered,
            max_in_flight=max_in_flight), name=name, parallelism=parallelism)

    def map_async(self, fn: Callable[[Any], Any], *, capacity: int = 100,
                  timeout_s: float | None = None, ordered: bool = True,
                  retry: AsyncRetry | None = None, on_timeout: Callable[[Any], Any] | None = None,
                  batch: bool = False, name: str | None = None, schema: pa.Schema | None = None,
                  parallelism: int | None = None) -> "DataStream":
        """Await ``async def fn(row)`` (``batch=True``: ``fn(batch)``) for every row, at most
        ``capacity`` calls in flight per subtask, each giving a dict, a list of dicts or
        None (a batch, with ``batch=True``); see :mod:`raystream.engine.operators.async_io`
        for ``ordered``, ``timeout_s``, ``on_timeout`` and ``retry``."""
        return self._add("operator", "map_async", AsyncWaitOperator.factory(
            fn, capacity=capacity, timeout_s=timeout_s, ordered=ordered, retry=retry,
            on_timeout=on_timeout, batch=batch, schema=schema), name=name,
            parallelism=parallelism, columns=_names(schema))

    def filter_batches(self, fn: Callable[[pa.RecordBatch], Any], *, name: str | None = None,
                       parallelism: int | None = None) -> "DataStream":
        """Keep the rows where the boolean mask ``fn(batch)`` is true."""
        return self._add("operator", "filter_batches", lambda n: FilterBatchesOperator(n, [fn]),
                         name=name, parallelism=parallelism, columns=self.columns)

    def transform(self, name: str, create_operator: Callable[[str], Operator], *,
                  parallelism: int | None = None,
                  coordinator: Callable[[Any], OperatorCoordinator] | None = None) -> "DataStream":
        """Add a custom :class:`~raystream.actors.operator.Operator` (created per subtask).

        ``coordinator(context)`` creates its :class:`~raystream.OperatorCoordinator` in the
        job master; the operator exchanges events with it (``handle_operator_event``,
        ``self.ctx.send_event_to_coordinator``)."""
        return self._add("operator", name, create_operator, name=name, parallelism=parallelism,
                         coordinator=coordinator)

    def union(self, *others: "DataStream") -> "DataStream":
        """One stream of the records of this and ``others`` (schemas should match)."""
        inputs = [s._edge() for s in (self, *others)]
        known = {s.columns for s in (self, *others)}
        return self._add("operator", "union", UnionOperator, inputs=inputs,
                         columns=known.pop() if len(known) == 1 else None)

    @overload
    def connect(self, other: "BroadcastStream") -> "BroadcastConnectedStream": ...

    @overload
    def connect(self, other: "DataStream") -> "ConnectedStreams": ...

    def connect(self, other: "DataStream | BroadcastStream"
                ) -> "ConnectedStreams | BroadcastConnectedStream":
        """Two streams processed together by one two-input operator (``other`` a
        :class:`BroadcastStream`: with broadcast state)."""
        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self, other)
        return ConnectedStreams(self, other)

    def join(self, other: "DataStream") -> "TwoStreams":
        """Window join with ``other`` (Flink's ``JoinedStreams``): continue with
        ``.where(key).equal_to(other_key).window(assigner, timestamp=...)``, then
        ``.join()`` (joined rows, vectorized) or ``.apply(fn)`` (``fn(left, right)`` per
        pair). See :mod:`raystream.engine.windows.join`.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> a = env.from_collection([{"k": 1, "ts": 10, "x": 1}])
            >>> b = env.from_collection([{"k": 1, "ts": 12, "y": 2}])
            >>> pairs = a.join(b).where("k").equal_to("k") \\
            ...     .window(rs.TumblingEventTimeWindows(size_ms=100), timestamp="ts").join()
        """
        return TwoStreams(WindowJoinKind.JOIN, self, other)

    def co_group(self, other: "DataStream") -> "TwoStreams":
        """Window co-group with ``other`` (Flink's ``CoGroupedStreams``): as :meth:`join`,
        finished with ``.apply(fn)``: ``fn(key, left_rows, right_rows, window)`` per key
        and window with rows on either side (``pyarrow.Table`` s, one may be empty).

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> a = env.from_collection([{"k": 1, "ts": 10}])
            >>> b = env.from_collection([{"k": 2, "ts": 12}])
            >>> counts = a.co_group(b).where("k").equal_to("k") \\
            ...     .window(rs.TumblingEventTimeWindows(size_ms=100), timestamp="ts") \\
            ...     .apply(lambda key, left, right, window: [
            ...         {"k": key, "left": left.num_rows, "right": right.num_rows}])
        """
        return TwoStreams(WindowJoinKind.CO_GROUP, self, other)

    # -- sinks ---------------------------------------------------------------------------
    def sink_to(self, create_sink: Callable[[str], SinkOperator], *, name: str = "sink",
                parallelism: int | None = None) -> "SinkHandle":
        stream = self._add("sink", name, create_sink, name=name, parallelism=parallelism)
        return SinkHandle(stream.transformation.id, stream.transformation.name)

    def collect(self, *, name: str = "collect", parallelism: int | None = None) -> "SinkHandle":
        """Collect every record; ``env.execute(...).table(handle)`` returns them as a Table.

        With checkpoints on, exactly once: a writer ``name`` hands each checkpoint's
        rows over as one file in checkpoint storage and a committer
        (``<name>-committer``, parallelism 1) commits them when the checkpoint
        completes; see :mod:`raystream.engine.operators.collect_sink`.
        """
        checkpoints = self.env.checkpoints
        if checkpoints is None:
            return self.sink_to(CollectSink, name=name, parallelism=parallelism)
        from raystream.engine.operators.collect_sink import CollectCommitter, CollectWriter

        return self.sink_exactly_once(CollectWriter(checkpoints.storage),
                                      CollectCommitter(checkpoints.storage), name=name,
                                      parallelism=parallelism or self.env.parallelism)

    def print(self, prefix: str | None = None, *, parallelism: int | None = None) -> "SinkHandle":
        """Print every record (``prefix:subtask> row``)."""
        return self.sink_to(lambda n: PrintSink(n, prefix), name="print", parallelism=parallelism)

    def discard(self, *, name: str = "discard", parallelism: int | None = None) -> "SinkHandle":
        """Drop every record, counting them (``result.table`` is not available; use ``result.count``)."""
        return self.sink_to(DiscardSink, name=name, parallelism=parallelism)

    def sink_to_parquet(self, path: str, *, partition_by: str | list[str] | None = None,
                        max_rows_per_file: int | None = None,
                        max_bytes_per_file: int | None = 128 * 1024 * 1024,
                        name: str = "parquet") -> "SinkHandle":
        """Write Parquet files under ``path`` (a directory or ``pyarrow.fs`` URI), exactly once.

        A writer at this stream's parallelism (named ``name``) writes the files
        and a committer (parallelism 1, ``<name>-committer``) lists them in the
        commit log ``<path>/_raystream_log/`` when a checkpoint completes
        (without checkpoints: when the job finishes). Read the committed rows
        with ``rs.spark.read_committed(path)`` or ``handle.read()``; see
        :mod:`raystream.engine.operators.file_sink`.
        """
        return self.sink_to_files(path, format="parquet", partition_by=partition_by,
                                  max_rows_per_file=max_rows_per_file,
                                  max_bytes_per_file=max_bytes_per_file, name=name)

    def sink_to_files(self, path: str, *, format: str = "parquet",
                      partition_by: str | list[str] | None = None,
                      max_rows_per_file: int | None = None,
                      max_bytes_per_file: int | None = 128 * 1024 * 1024,
                      csv_delimiter: str = ",", name: str = "files") -> "SinkHandle":
        """Write files of ``format`` under ``path``, exactly once, as :meth:`sink_to_parquet`
        does: ``"parquet"``, ``"csv"`` (no header, as Flink's ``csv`` format; the commit
        log keeps the columns' types) or ``"json"`` (JSON lines, timestamps as
        ``yyyy-MM-dd HH:mm:ss.SSS``). ``handle.read()`` and ``rs.spark.read_committed(path)``
        read what was committed.

            >>> totals.sink_to_files("/data/totals", format="csv", partition_by="day")  # doctest: +SKIP
        """
        formats = {"parquet": FileFormat.PARQUET, "csv": FileFormat.CSV, "json": FileFormat.JSON}
        if format not in formats:
            raise ValueError(f"sink_to_files: format must be one of {', '.join(formats)} (Avro: "
                             f"sink_to_avro), not {format!r}")
        config = ParquetSinkConfig.of(path, partition_by, max_rows_per_file, max_bytes_per_file,
                                      format=formats[format], csv_delimiter=csv_delimiter)
        handle = self.sink_exactly_once(ParquetWriter(config), ParquetCommitter(config.path),
                                        name=name)
        return ParquetSinkHandle(handle.transformation_id, handle.name, config.path)

    def sink_to_avro(self, path: str, schema: Any, *, partition_by: str | list[str] | None = None,
                     max_rows_per_file: int | None = None,
                     max_bytes_per_file: int | None = 128 * 1024 * 1024,
                     codec: str = "deflate", name: str = "avro") -> "SinkHandle":
        """Write Avro container files (``.avro``) of record ``schema`` (a dict, a JSON
        string, an ``.avsc`` path or an ``rs.formats.Avro``) under ``path``, exactly once:
        :meth:`sink_to_parquet` with Avro files (``codec``: ``"deflate"`` or ``"null"``).
        The schema's fields are written from the columns of the same name (others are left
        out; with ``partition_by``, the partition columns are in the directory names, not
        the records). ``rs.spark.read_committed(path)`` and ``handle.read()`` read them.

            >>> schema = {"type": "record", "name": "Total", "fields": [
            ...     {"name": "user", "type": "long"}, {"name": "total", "type": "long"}]}
            >>> totals.sink_to_avro("/data/totals", schema)                 # doctest: +SKIP
        """
        from raystream.engine.formats import Avro

        avro = schema if isinstance(schema, Avro) else Avro(schema)
        if avro.confluent_schema_id is not None:
            raise ValueError("sink_to_avro: Confluent's framing is for Kafka values; an Avro "
                             "file carries its schema in its header")
        config = ParquetSinkConfig.of(path, partition_by, max_rows_per_file, max_bytes_per_file,
                                      avro=avro, avro_codec=codec)
        handle = self.sink_exactly_once(ParquetWriter(config), ParquetCommitter(config.path),
                                        name=name)
        return ParquetSinkHandle(handle.transformation_id, handle.name, config.path)

    def sink_to_kafka(self, bootstrap_servers: str, topic: str, *, key: str | None = None,
                      value_format: str | ValueFormat = "json", value_schema: Any = None,
                      delivery: str = "exactly_once",
                      transactional_id_prefix: str | None = None, timeout_s: float = 30.0,
                      name: str = "kafka", **client_config: Any) -> "SinkHandle":
        """Write every row to Kafka ``topic``: as a JSON object (``value_format="json"``:
        floats in their shortest exact form, NaN and infinities as null, timestamps as
        epoch milliseconds, see :mod:`raystream.engine.json_lines`), column ``value``
        (``"raw"``), plain Avro binary (``"avro"``, ``value_schema`` the Avro schema: a
        dict, a JSON string or an ``.avsc`` path) or a Protobuf message
        (``"protobuf"``, ``value_schema`` the generated message class), or a format
        such as ``rs.formats.Avro(schema, confluent_schema_id=7)`` (see
        :mod:`raystream.engine.formats`); keyed by column ``key`` (as a string).

        ``delivery="exactly_once"``: each checkpoint's rows are in one Kafka
        transaction that commits when the checkpoint completes (read them with
        ``isolation.level=read_committed``); ``transactional_id_prefix`` (default
        ``raystream.<name>.<topic>``) must be unique among the jobs writing at
        once. ``"at_least_once"``: produced at once, flushed before every barrier.
        Other keyword arguments are librdkafka settings (dots as underscores). See
        :mod:`raystream.engine.operators.kafka_sink`. ``execute()`` checks that the broker
        answers and the topic is there (or that the broker creates it, as it would for
        the first record) before the job starts, where the job runs on this machine.

            >>> totals.sink_to_kafka("127.0.0.1:9092", "totals", key="user")    # doctest: +SKIP
        """
        from raystream.engine.operators.kafka_sink import (Delivery, KafkaCommitter,
                                                           KafkaSinkConfig, KafkaWriter)

        config = KafkaSinkConfig(
            bootstrap_servers, topic,
            transactional_id_prefix=transactional_id_prefix or f"raystream.{name}.{topic}",
            key=key, value_format=value_format, value_schema=value_schema,
            delivery=Delivery.of(delivery),
            timeout_s=timeout_s,
            client_config={k.replace("_", "."): v for k, v in client_config.items()})
        handle = self.sink_exactly_once(KafkaWriter(config), KafkaCommitter(config), name=name)
        # checked by execute() before the job starts (engine/preflight.py)
        next(t for t in self.env.transformations
             if t.id == handle.transformation_id).preflight = config.preflight
        return handle

    def sink_exactly_once(self, writer: SinkWriter, committer: Committer, *,
                          name: str = "sink", parallelism: int | None = None) -> "SinkHandle":
        """An exactly-once sink from a :class:`SinkWriter` and a :class:`Committer` (Sink V2).

        The writer runs at ``parallelism`` (default: this stream's; operator
        ``name``) and hands over committables before every barrier; one
        committer (``<name>-committer``, parallelism 1) commits them when their
        checkpoint completes. See :mod:`raystream.engine.operators.two_phase`.
        """
        stream = self._add("operator", name, lambda n: SinkWriterOperator(n, writer), name=name,
                           parallelism=parallelism or self.transformation.parallelism)
        sink = stream._add("sink", f"{stream.transformation.name}-committer",
                           lambda n: CommitterOperator(n, committer), parallelism=1)
        sink.transformation.committer = True
        return SinkHandle(sink.transformation.id, sink.transformation.name)


class KeyedStream(DataStream):
    """A stream partitioned by key: keyed operators see every record of a key."""

    def __init__(self, env, transformation, keys: KeySelector,
                 side_output: str | None = None) -> None:
        super().__init__(env, transformation, PartitionSpec("hash", keys), side_output)
        self.keys = keys

    def window(self, assigner: "WindowAssigner", *, timestamp: str | None = None,
               allowed_lateness_ms: int = 0, late_output: str | None = None,
               pre_aggregate: bool = True,
               trigger: "Trigger | None" = None) -> "WindowedStream":
        """Cut each key's records into windows (``rs.TumblingEventTimeWindows``,
        ``rs.SlidingEventTimeWindows``, ``rs.CumulativeEventTimeWindows``,
        ``rs.EventTimeSessionWindows``, with a gap per
        record ``rs.EventTimeSessionWindows.with_dynamic_gap(...)``,
        ``rs.TumblingProcessingTimeWindows``); see :class:`WindowedStream`.
        Without ``timestamp=``, the stream's ``default_timestamp``: a window's results
        carry event time ``window_end - 1`` (``rs.WINDOW_TIME``), so windows chain.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> events = env.from_collection([{"user": "a", "ts": 5, "x": 1.0}])
            >>> hourly = events.key_by("user").window(
            ...     rs.TumblingEventTimeWindows(size_ms=3_600_000), timestamp="ts").sum("x")
            >>> daily = hourly.key_by("user").window(
            ...     rs.TumblingEventTimeWindows(size_ms=86_400_000)).sum("x")
        """
        return WindowedStream(self, assigner, timestamp=timestamp or self.default_timestamp,
                              allowed_lateness_ms=allowed_lateness_ms, late_output=late_output,
                              pre_aggregate=pre_aggregate, trigger=trigger)

    def count_window(self, size: int, slide: int | None = None) -> "CountWindowedStream":
        """Count windows per key (Flink's ``countWindow``): a window every ``size`` records
        of a key, or with ``slide`` every ``slide`` records over its last ``size``; finish
        with built-in aggregates. See :mod:`raystream.engine.windows.count`.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> events = env.from_collection([{"user": "a", "x": 1.0}, {"user": "a", "x": 2.0}])
            >>> pairs = events.key_by("user").count_window(2).sum("x")
            >>> env.execute("pairs").table(pairs.collect()).to_pylist()  # doctest: +SKIP
            [{'user': 'a', 'x': 3.0}]
        """
        return CountWindowedStream(self, size, slide)

    def reduce(self, fn: Callable[[Row, Row], Row], *, name: str | None = None,
               schema: pa.Schema | None = None, parallelism: int | None = None) -> DataStream:
        """Running aggregate per key: ``fn(accumulated, row) -> new accumulated``.

        Emits the new aggregate for every record (the first record of a key is
        its first aggregate), like Flink's ``KeyedStream.reduce``.
        """
        keys = self.keys
        return self._add("operator", "reduce",
                         lambda n: ReduceOperator(n, fn, keys, schema=schema),
                         name=name, parallelism=parallelism, columns=_names(schema))

    def process(self, fn: KeyedProcessFunction, *, name: str | None = None,
                schema: pa.Schema | None = None, parallelism: int | None = None) -> DataStream:
        """Run a :class:`KeyedProcessFunction` with keyed state on every row.

        Each subtask gets its own copy of ``fn``; ``process_element(row, ctx)``
        returns (or yields) the rows to emit.
        """
        keys = self.keys
        return self._add("operator", "process",
                         lambda n: KeyedProcessOperator(n, fn, keys, schema=schema),
                         name=name, parallelism=parallelism, columns=_names(schema))

    def interval_join(self, other: "KeyedStream", *, timestamp: str | None = None,
                      left_timestamp: str | None = None,
                      right_timestamp: str | None = None) -> "IntervalJoin":
        """Join with ``other`` (keyed the same way) on equal keys and timestamps within an
        interval: continue with ``.between(lower_ms, upper_ms)``. ``timestamp`` names the
        event-time column of both sides (or ``left_timestamp`` / ``right_timestamp``).
        See :mod:`raystream.engine.operators.interval_join`.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> a = env.from_collection([{"k": 1, "ts": 10, "x": 1}])
            >>> b = env.from_collection([{"k": 1, "ts": 12, "y": 2}])
            >>> joined = a.key_by("k").interval_join(b.key_by("k"), timestamp="ts") \\
            ...     .between(0, 5).join()
        """
        if not isinstance(other, KeyedStream):
            raise TypeError("interval_join: key the other stream too (other.key_by(...))")
        left_ts, right_ts = left_timestamp or timestamp, right_timestamp or timestamp
        if left_ts is None or right_ts is None:
            raise ValueError("interval_join: name the event-time column of both sides "
                             "(timestamp=..., or left_timestamp=... and right_timestamp=...)")
        return IntervalJoin(self, other, (left_ts, right_ts))


class ConnectedStreams:
    """Two streams feeding one two-input operator; keyed when both sides are keyed."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        if isinstance(first, KeyedStream) != isinstance(second, KeyedStream):
            raise ValueError("connect: key both streams (key_by on each side) or neither")
        self.first, self.second = first, second

    def _add(self, default_name, create, name, parallelism) -> DataStream:
        inputs = [self.first._edge(0), self.second._edge(1)]
        return self.first._add("operator", default_name, create, name=name,
                               parallelism=parallelism, inputs=inputs)

    def map(self, fn1: Callable[[Row], Row], fn2: Callable[[Row], Row], *,
            name: str | None = None, schema: pa.Schema | None = None,
            parallelism: int | None = None) -> DataStream:
        """``fn1`` for rows of the first stream, ``fn2`` for rows of the second."""
        return self._add("co_map", lambda n: MapOperator(n, [fn1, fn2], schema=schema),
                         name, parallelism)

    def flat_map(self, fn1: Callable[[Row], Iterable[Row]], fn2: Callable[[Row], Iterable[Row]],
                 *, name: str | None = None, schema: pa.Schema | None = None,
                 parallelism: int | None = None) -> DataStream:
        return self._add("co_flat_map", lambda n: FlatMapOperator(n, [fn1, fn2], schema=schema),
                         name, parallelism)

    def map_batches(self, fn1: Callable[[pa.RecordBatch], Any], fn2: Callable[[pa.RecordBatch], Any],
                    *, name: str | None = None, parallelism: int | None = None) -> DataStream:
        return self._add("co_map_batches", lambda n: MapBatchesOperator(n, [fn1, fn2]),
                         name, parallelism)

    def process(self, fn: KeyedCoProcessFunction, *, name: str | None = None,
                schema: pa.Schema | None = None, parallelism: int | None = None) -> DataStream:
        """Run a :class:`~raystream.KeyedCoProcessFunction` on two keyed streams:
        ``process_element1`` per row of the first, ``process_element2`` per row of the
        second, with keyed state and timers shared by both."""
        if not isinstance(self.first, KeyedStream):
            raise TypeError("connect(...).process needs two keyed streams: key_by both sides")
        if not isinstance(fn, KeyedCoProcessFunction):
            raise TypeError(f"connect(...).process needs a rs.KeyedCoProcessFunction, "
                            f"got {type(fn).__name__}")
        keys = (self.first.keys, self.second.keys)  # type: ignore[attr-defined]
        return self._add("co_process",
                         lambda n: KeyedCoProcessOperator(n, fn, keys, schema=schema),
                         name, parallelism)


class BroadcastStream:
    """``stream.broadcast(descriptor, ...)``: rows for every subtask, to ``connect`` to."""

    def __init__(self, stream: DataStream, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise TypeError(f"broadcast(...) takes rs.MapStateDescriptor, got {d!r}")
        if len({d.name for d in descriptors}) != len(descriptors):
            raise ValueError(f"broadcast(...): descriptor names repeat: {descriptors}")
        self.stream, self.descriptors = stream, descriptors


class BroadcastConnectedStream:
    """A stream connected to a :class:`BroadcastStream`: call :meth:`process`."""

    def __init__(self, stream: DataStream, broadcast: BroadcastStream) -> None:
        self.stream, self.broadcast = stream, broadcast

    def process(self, fn: "KeyedBroadcastProcessFunction | BroadcastProcessFunction", *,
                name: str | None = None, schema: pa.Schema | None = None,
                parallelism: int | None = None) -> DataStream:
        """Run ``fn``: a :class:`~raystream.KeyedBroadcastProcessFunction` when the
        stream is keyed, else a :class:`~raystream.BroadcastProcessFunction`."""
        keyed = isinstance(self.stream, KeyedStream)
        want = KeyedBroadcastProcessFunction if keyed else BroadcastProcessFunction
        if not isinstance(fn, want):
            raise TypeError(f"connect(broadcast).process on a {'keyed' if keyed else 'non-keyed'}"
                            f" stream needs a rs.{want.__name__}, got {type(fn).__name__}")
        descriptors = self.broadcast.descriptors
        keys = self.stream.keys if keyed else None  # type: ignore[attr-defined]

        def create(n: str) -> Operator:
            if keys is not None:
                return KeyedBroadcastProcessOperator(n, fn, keys, descriptors,  # type: ignore
                                                     schema=schema)
            return BroadcastProcessOperator(n, fn, descriptors, schema=schema)  # type: ignore
        inputs = [self.stream._edge(0), self.broadcast.stream._edge(1)]
        return self.stream._add("operator", "broadcast_process", create, name=name,
                                parallelism=parallelism, inputs=inputs)



def _names(schema: pa.Schema | None) -> tuple[str, ...] | None:
    return None if schema is None else tuple(schema.names)
