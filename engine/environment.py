"""The stream environment: where a job is built and from where it runs.

    >>> import pyarrow.compute as pc, raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> doubled = env.from_sequence(1000, num_splits=4).map_batches(
    ...     lambda b: {"id": b.column("id"), "twice": pc.multiply(b.column("id"), 2)})
    >>> sink = doubled.collect()
    >>> env.execute("doubling").table(sink).num_rows  # doctest: +SKIP
    1000
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence as SequenceT, TextIO

import numpy as np
import pyarrow as pa
import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raystream.actors.credit_limit import DEFAULT_IN_FLIGHT_MS
from raystream.actors.record_writer import DEFAULT_BUFFER_TIMEOUT_MS, check_buffer_timeout
from raystream.checkpoint.config import CheckpointConfig, RestartStrategy
from raystream.checkpoint.keygroups import DEFAULT_MAX_PARALLELISM
from raystream.checkpoint.storage import CheckpointStorage
from raystream.engine import actor_pool, preflight
from raystream.engine import progress as progress_display
from raystream.core.failpoints import Failpoint
from raystream.core.ray_start import ensure_ray
from raystream.engine.client import JobClient, JobResult
from raystream.engine.datastream import DataStream
from raystream.engine import registry
from raystream.engine.errors import InsufficientResourcesError, JobStillRunningError
from raystream.engine.failover import FailoverStrategy
from raystream.engine.formats import ValueFormat
from raystream.actors.resources import Resources
from raystream.engine.graph import InputEdge, Transformation
from raystream.engine.master_pool import MASTER_RESOURCES, MASTERS, new_job_id
from raystream.engine.job_master import NAMESPACE, JobMaster
from raystream.engine.job_options import (JobOptions, MasterAssignment, master_actor_name,
                                          master_restarts)
from raystream.checkpoint.operator_coordinator import OperatorCoordinator
from raystream.actors.operator import SourceOperator
from raystream.engine.operators.source import SourceReaderOperator
from raystream.engine.plan import JobPlan, build_plan
from raystream.engine.sources.base import Source
from raystream.engine.sources.split_enumerator import SourceCoordinator
from raystream.engine.sql.session import SqlResult, SqlSession, Table
from raystream.engine.sql.udf import ScalarFunction
from raystream.engine.sources.arrow import ArrowTable
from raystream.engine.sources.collection import Collection
from raystream.engine.sources.files import Files, OnError
from raystream.engine.sources.sequence import Sequence
from raystream.engine.watermarks import BoundedOutOfOrderness
from raystream.engine.columns import require

# The job master (and its checkpoint coordinator) needs no CPU of its own and runs on
# the head node, which lives as long as the cluster: losing a worker node loses
# subtasks, which the master restores, never the master.
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray gives it to the head node only


@dataclass
class RunDefaults:
    """What ``raystream run`` sets for the jobs of the script it runs (Flink: ``flink run -s``)."""

    restore_from: str | None = None  # for every job that does not name its own
    # seconds between progress lines off a terminal (raystream run --progress-every)
    progress_every: float | None = None
    # where the job's page and progress lines go off a terminal (None: stderr; raystream
    # run: stdout, its report, leaving stderr to errors)
    progress_to: TextIO | None = None
    resume: bool = False  # every job resumes from its newest checkpoint (raystream run --resume)
    detach: bool = False  # every job outlives its driver (raystream run --detach)


_run_defaults = RunDefaults()
log = logging.getLogger(__name__)


@contextlib.contextmanager
def run_defaults(restore_from: str | None = None, progress_every: float | None = None,
                 resume: bool = False, detach: bool = False,
                 progress_to: TextIO | None = None) -> Iterator[None]:
    """Within the block, jobs restore from ``restore_from`` (or ``resume``) and show their
    progress every ``progress_every`` seconds off a terminal.

        >>> with run_defaults(restore_from="/savepoints/sp1"):  # doctest: +SKIP
        ...     env.execute("orders")   # as env.execute("orders", restore_from="/savepoints/sp1")
    """
    global _run_defaults
    previous, _run_defaults = _run_defaults, RunDefaults(
        restore_from=restore_from, progress_every=progress_every, progress_to=progress_to,
        resume=resume, detach=detach)
    try:
        yield
    finally:
        _run_defaults = previous


class StreamEnvironment:
    """Builds a job and runs it on Ray.

    Ray starts in this process with the machine's CPUs unless it is already
    running or ``address=`` names a cluster (``"auto"`` or ``"ray://host:10001"``).

    Args:
        parallelism: default number of subtasks of each operator.
        max_parallelism: number of key groups; fixes the largest parallelism a
            keyed job can ever be restored at.
        credits: unconsumed batches a channel may have in flight (backpressure bound).
        in_flight_ms: how long the data in flight to a subtask may take to process
            (as Flink's buffer debloating bounds it): each subtask measures the rate
            it consumes its input at and lets each sender hold only the credits
            (at least 1) that many milliseconds of it need, so aligned checkpoints,
            failovers and backpressured records wait about that long rather than
            for ``credits`` full messages; None: every sender holds ``credits``.
        buffer_timeout_ms: how long a row may wait in an operator's output buffer
            before it is sent on (Flink's buffer timeout): lower is lower latency and
            more, smaller messages; 0 sends after every batch, -1 only when the buffer
            is full (and, as always, before watermarks, barriers and end of input, and
            when the subtask is idle). ``stream.set_buffer_timeout`` sets one operator's.
        address: Ray cluster to connect to; None starts or reuses a local Ray.
        checkpoints: periodic checkpoints (exactly-once state and sinks); None: off.
        restart: what to do after a failure (default with checkpoints: 3 restarts,
            0.5 s apart; without checkpoints a failure fails the job).
        failover: ``"region"`` (default): a failure restarts the failed subtask's
            pipelined region alone where the job has several and nothing is in doubt
            (docs/architecture.md, Failover); ``"full"``: every failure restarts the
            whole job.
        failpoints: failures placed at named points, for tests.
        actor_start_timeout_s: how long subtask actors may take to start.
        stop_timeout_s: how long a job that ends waits for every subtask to stop
            (and so for every final commit to be confirmed) before it fails over.
    """

    def __init__(self, parallelism: int = 1, max_parallelism: int = DEFAULT_MAX_PARALLELISM, *,
                 credits: int = 8, buffer_timeout_ms: float = DEFAULT_BUFFER_TIMEOUT_MS,
                 in_flight_ms: float | None = DEFAULT_IN_FLIGHT_MS,
                 address: str | None = None,
                 checkpoints: CheckpointConfig | None = None,
                 restart: RestartStrategy | None = None,
                 failover: FailoverStrategy | str = FailoverStrategy.REGION,
                 failpoints: SequenceT[Failpoint] = (),
                 actor_start_timeout_s: float = 120.0,
                 stop_timeout_s: float = 30.0,
                 ray_init_kwargs: Mapping[str, Any] | None = None) -> None:
        if parallelism < 1:
            raise ValueError("parallelism must be >= 1")
        if credits < 1:
            raise ValueError("credits must be >= 1")
        if in_flight_ms is not None and not in_flight_ms > 0:
            raise ValueError(f"in_flight_ms must be > 0 (or None: every sender holds all "
                             f"its credits), got {in_flight_ms}")
        if not stop_timeout_s > 0:
            raise ValueError(f"stop_timeout_s must be > 0, got {stop_timeout_s}")
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.credits = credits
        self.in_flight_ms = in_flight_ms
        self.buffer_timeout_ms = check_buffer_timeout(buffer_timeout_ms)
        self.address = address
        self.actor_start_timeout_s = actor_start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.checkpoints = checkpoints
        # With checkpoints a job restarts by default (as Flink does); without, it cannot.
        self.restart = restart or (RestartStrategy.fixed_delay(3, 0.5) if checkpoints
                                   else RestartStrategy.none())
        self.failover = FailoverStrategy(failover)
        self.failpoints = tuple(failpoints)
        self.ray_init_kwargs = dict(ray_init_kwargs or {})
        self.transformations: list[Transformation] = []
        self._names: set[str] = set()
        self._sql: SqlSession | None = None

    # -- graph building (used by DataStream) ---------------------------------------------
    def _unique_name(self, name: str) -> str:
        if name not in self._names:
            self._names.add(name)
            return name
        for i in itertools.count(2):
            if f"{name}-{i}" not in self._names:
                self._names.add(f"{name}-{i}")
                return f"{name}-{i}"
        raise AssertionError

    def _add_transformation(self, kind: str, name: str, create: Callable, parallelism: int,
                            inputs: list[InputEdge], *,
                            coordinator: Callable[[Any], Any] | None = None) -> Transformation:
        t = Transformation(len(self.transformations), name, kind, create, parallelism, inputs,
                           coordinator=coordinator)
        self.transformations.append(t)
        return t

    # -- sources -------------------------------------------------------------------------
    def from_source(self, source: Source, *, name: str = "source",
                    watermarks: BoundedOutOfOrderness | None = None,
                    parallelism: int | None = None) -> DataStream:
        """A stream read from ``source``'s splits, with optional event-time watermarks."""
        stream = self.add_source(
            lambda op_name: SourceReaderOperator(op_name, source, watermarks), name=name,
            parallelism=parallelism, coordinator=functools.partial(SourceCoordinator,
                                                                   source=source))
        columns = stream.transformation.columns = source.produced_columns()
        stream.transformation.preflight = source.preflight
        if watermarks is not None:
            require([watermarks.timestamp_column], columns,
                    call=f"watermarks=BoundedOutOfOrderness({watermarks.timestamp_column!r})",
                    stream=stream.transformation.name)
        return stream

    def add_source(self, create_operator: Callable[[str], SourceOperator], *,
                   name: str = "source", parallelism: int | None = None,
                   coordinator: Callable[[Any], OperatorCoordinator] | None = None) -> DataStream:
        """A stream from a source operator of your own (created per subtask with its name),
        optionally with an operator coordinator (``coordinator(context)``) that sends it
        events: a split enumerator, say.

            >>> import pyarrow as pa, raystream as rs
            >>> class Once(rs.SourceOperator):
            ...     def emit_next(self):
            ...         if getattr(self, "done", False): return False
            ...         self.output.emit(pa.record_batch({"x": [self.ctx.subtask_index]}))
            ...         self.done = True; return True
            >>> env = rs.StreamEnvironment(parallelism=2)                  # doctest: +SKIP
            >>> sink = env.add_source(Once, name="once").collect()          # doctest: +SKIP
            >>> sorted(env.execute("once").table(sink)["x"].to_pylist())    # doctest: +SKIP
            [0, 1]
        """
        op_name = self._unique_name(name)
        t = self._add_transformation("source", op_name, lambda: create_operator(op_name),
                                     parallelism or self.parallelism, [], coordinator=coordinator)
        return DataStream(self, t)

    def from_sequence(self, n: int, columns: Callable[[np.ndarray], Mapping[str, Any]] | None = None,
                      *, batch_size: int = 8192, num_splits: int = 4, name: str = "sequence",
                      watermarks: BoundedOutOfOrderness | None = None,
                      parallelism: int | None = None) -> DataStream:
        """Deterministic generated rows ``0..n-1``; see :class:`~raystream.sources.Sequence`."""
        kwargs = {"columns": columns} if columns is not None else {}
        return self.from_source(Sequence(n, batch_size=batch_size, num_splits=num_splits, **kwargs),
                                name=name, watermarks=watermarks, parallelism=parallelism)

    def from_collection(self, rows: SequenceT[Mapping[str, Any]], *, schema: pa.Schema | None = None,
                        batch_size: int = 1024, num_splits: int = 1, name: str = "collection",
                        watermarks: BoundedOutOfOrderness | None = None,
                        parallelism: int | None = None) -> DataStream:
        """Rows from a Python list of dicts."""
        return self.from_source(Collection(rows, schema=schema, batch_size=batch_size,
                                           num_splits=num_splits),
                                name=name, watermarks=watermarks, parallelism=parallelism)

    def from_arrow(self, table: pa.Table | list[pa.RecordBatch], *, batch_size: int = 65536,
                   num_splits: int = 4, name: str = "arrow",
                   watermarks: BoundedOutOfOrderness | None = None,
                   parallelism: int | None = None) -> DataStream:
        """The rows of an in-memory Arrow table (shared through Ray's object store).

            >>> import pyarrow as pa, raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=2)
            >>> stream = env.from_arrow(pa.table({"user": [1, 2, 1], "ts": [10, 20, 30]}))
        """
        return self.from_source(ArrowTable(table, batch_size=batch_size, num_splits=num_splits),
                                name=name, watermarks=watermarks, parallelism=parallelism)

    def read_files(self, path: str, *, format: str = "parquet", batch_size: int = 65536,
                   schema: pa.Schema | None = None, monitor_interval_s: float | None = None,
                   errors: OnError | str = OnError.FAIL,
                   name: str = "files", watermarks: BoundedOutOfOrderness | None = None,
                   parallelism: int | None = None) -> DataStream:
        """Parquet, CSV, JSON-lines or Avro (container) files under ``path`` (``format``:
        ``"parquet"``, ``"csv"``, ``"jsonl"``, ``"avro"``; a file per split, a Parquet
        file with several row groups a split per row group), handed to the subtasks as
        they ask. Bounded: the files there are at the start. With ``monitor_interval_s``,
        continuous: the directory is listed again at that interval and new files are
        read as they appear (see :class:`~raystream.sources.Files`).

        ``errors``: ``"fail"`` (a file that cannot be read fails the job, naming it)
        or ``"dead_letter"`` (an unreadable file or row group is skipped whole and
        described on side output ``rs.sources.DEAD_LETTERS``).

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment()                                      # doctest: +SKIP
            >>> rows = env.read_files("s3://bucket/clicks/", format="jsonl",      # doctest: +SKIP
            ...                       monitor_interval_s=5.0, schema=CLICK_SCHEMA,
            ...                       errors="dead_letter")
            >>> bad_files = rows.side_output(rs.sources.DEAD_LETTERS)            # doctest: +SKIP
        """
        return self.from_source(Files(path, format=format, batch_size=batch_size, schema=schema,
                                      monitor_interval_s=monitor_interval_s, errors=errors),
                                name=name, watermarks=watermarks, parallelism=parallelism)

    def read_kafka(self, bootstrap_servers: str, *, topics: SequenceT[str] | str = (),
                   pattern: str | None = None, group_id: str | None = None,
                   starting_offsets: str | Mapping[str, int] = "earliest",
                   bounded_until: str | Mapping[tuple[str, int], int] | None = None,
                   value_format: str | ValueFormat = "json", schema: pa.Schema | None = None,
                   value_schema: Any = None, idleness_s: float | None = None, discovery_interval_s: float | None = 10.0,
                   errors: OnError | str = OnError.FAIL, timeout_s: float = 10.0,
                   max_poll_records: int = 10_000, name: str = "kafka",
                   watermarks: BoundedOutOfOrderness | None = None,
                   parallelism: int | None = None, **client_config: Any) -> DataStream:
        """Records of Kafka topics: one split per partition, positions in checkpoints,
        watermarks per partition (an idle one, no record for ``idleness_s``, does not
        hold them back). See :mod:`raystream.engine.sources.kafka_reader` for the columns.

        ``starting_offsets``: ``"earliest"``, ``"latest"``, ``"committed"`` (of
        ``group_id``) or ``{"timestamp": ms}``; ``bounded_until``: None, ``"latest"``
        (where each partition ends at the start) or ``{(topic, partition): offset}``.
        ``value_format``: ``"json"`` (columns typed by ``schema``, an Arrow schema, or
        inferred), ``"raw"`` (column ``value``), ``"avro"`` (``value_schema``: the
        Avro schema as a dict, a JSON string or an ``.avsc`` path), ``"protobuf"``
        (``value_schema``: the generated message class), or a format such as
        ``rs.formats.Avro(schema, confluent_schema_id=7)`` (see
        :mod:`raystream.engine.formats`).
        ``errors="dead_letter"``: a value that does not decode goes to side output
        ``rs.sources.DEAD_LETTERS`` instead of failing the job. Other keyword
        arguments are librdkafka settings (dots as underscores: ``security_protocol``).
        ``execute()`` checks that the broker answers and the topics are there before
        the job starts (where the job runs on this machine: :mod:`raystream.engine.preflight`),
        each a one-line :class:`~raystream.engine.errors.JobSetupError`.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=2)                        # doctest: +SKIP
            >>> clicks = env.read_kafka("127.0.0.1:9092", topics=["clicks"],       # doctest: +SKIP
            ...                         schema=CLICKS, idleness_s=5.0,
            ...                         watermarks=rs.BoundedOutOfOrderness("ts", 2000))
        """
        from raystream.engine.sources.kafka import KafkaSourceConfig
        from raystream.engine.sources.kafka_reader import kafka_stream

        config = KafkaSourceConfig(
            bootstrap_servers, topics=(topics,) if isinstance(topics, str) else tuple(topics),
            pattern=pattern, group_id=group_id, starting_offsets=starting_offsets,
            bounded_until=bounded_until, value_format=value_format,
            schema=schema, value_schema=value_schema, idleness_s=idleness_s, discovery_interval_s=discovery_interval_s,
            max_poll_records=max_poll_records, errors=OnError.of(errors), timeout_s=timeout_s,
            client_config={k.replace("_", "."): v for k, v in client_config.items()})
        return kafka_stream(self, config, name=name, watermarks=watermarks,
                            parallelism=parallelism)

    # -- SQL -----------------------------------------------------------------------------
    def sql(self, text: str) -> SqlResult:
        """Run Flink SQL statements (docs/sql.md): DDL at once, ``INSERT INTO`` (or a
        statement set of them) added to this job, to run with :meth:`execute`; the result
        names each INSERT's sink (``job_result.table(result["table"])`` for a ``collect``
        table). A statement that does not plan raises ``SqlError`` and adds nothing."""
        return self._sql_session().execute(text)

    def sql_query(self, text: str) -> Table:
        """A SELECT's rows as a :class:`~raystream.engine.sql.session.Table`
        (``.to_stream()`` to go on with them, ``.explain()`` for the plan)."""
        return self._sql_session().query(text)

    def create_temporary_view(self, name: str, stream: DataStream, *, schema: pa.Schema,
                              rowtime: str | None = None) -> None:
        """Make ``stream`` a table SQL can read as ``name``: ``schema`` its columns' types,
        ``rowtime`` the column holding its event time (the stream's watermarks are the
        table's), for window table functions."""
        self._sql_session().register_stream(name, stream, schema, rowtime)

    def create_temporary_function(self, name: str, function: ScalarFunction) -> None:
        """Make ``function`` (a vectorized ``@rs.udf(result_type=...)`` function) one SQL
        calls as ``name``."""
        self._sql_session().add_function(name, function)

    def _sql_session(self) -> SqlSession:
        if self._sql is None:
            self._sql = SqlSession(self)
        return self._sql

    # -- running -------------------------------------------------------------------------
    def plan(self) -> JobPlan:
        """The physical plan (chains, edges) this job would run."""
        return build_plan(self.transformations, self.max_parallelism,
                          buffer_timeout_ms=self.buffer_timeout_ms)

    def execute_async(self, name: str = "job", *, restore_from: str | None = None,
                      resume: bool = False, detach: bool = False) -> JobClient:
        """Deploy the job and return at once with a client to wait on, watch or cancel it.

        ``restore_from``: a savepoint (or a retained checkpoint directory) to
        start from, at this job's parallelism; operators are matched by name.

        ``resume``: start from the newest completed checkpoint that a run of the job
        named ``name`` left in this environment's checkpoint storage (a job that
        crashed, was cancelled or lost its driver), like a Spark query restarted on
        its ``checkpointLocation``; with none there, start from the beginning.
        Refused while a run of that name is still running.

        ``detach``: the job outlives this driver: it keeps running when the driver
        exits, is killed or loses its connection to the cluster (its job master is a
        detached Ray actor, and its subtasks are the master's). Watch it, stop it or
        savepoint it from anywhere with ``raystream`` or ``rs.JobClient.attach``.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(checkpoints=rs.CheckpointConfig(storage="/ckpt"))
            >>> client = env.execute_async("orders", resume=True)  # doctest: +SKIP

        The address of the job's page in the web UI goes to stderr
        (``RAYSTREAM_UI=0``: not).
        """
        client = self._deploy(name, restore_from, resume, detach)
        _announce_page(client)
        return client

    def _deploy(self, name: str, restore_from: str | None, resume: bool,
                detach: bool) -> JobClient:
        resume = resume or (_run_defaults.resume and restore_from is None)
        detach = detach or _run_defaults.detach
        if restore_from is None and not resume:
            restore_from = _run_defaults.restore_from
        if resume and restore_from is not None:
            raise ValueError("resume=True and restore_from both name where to start: pass one")
        if (restore_from is not None or resume) and self.checkpoints is None:
            raise ValueError("restore_from and resume need checkpoints: pass StreamEnvironment("
                             "checkpoints=rs.CheckpointConfig(...))")
        plan = self.plan()
        # (on a cluster, the job master checks them)
        if preflight.runs_here(self.address, connected_gcs=preflight.connected_gcs()):
            preflight.check([t.preflight for t in self.transformations if t.preflight],
                            storage=self.checkpoints.storage if self.checkpoints else None,
                            restore_from=restore_from)
        ensure_ray(self.address, **self.ray_init_kwargs)
        if resume and self.checkpoints is not None:  # (without checkpoints: raised above)
            restore_from = resume_point(self.checkpoints.storage, name)
        check_resources(plan, name)
        head = on_head_node()
        # a job of this driver runs on its warm master; a detached one on its own
        warm = None if detach or not actor_pool.POOL.enabled() else MASTERS.take(head)
        job_id = new_job_id(name, warm.hex if warm else None)
        # subtasks with the default resources run on the driver's pooled actors, one more
        # for the warm spare of a job that may restart
        pooled = sum(v.parallelism for v in plan.vertices if v.resources == Resources()) + int(
            self.checkpoints is not None and self.restart.attempts > 0)
        # the pool's actors belong to this driver: a detached job has its own
        leased = () if detach else tuple(actor_pool.POOL.lease(pooled, job_id, head))
        options = JobOptions(credits=self.credits,
                             in_flight_s=(None if self.in_flight_ms is None
                                          else self.in_flight_ms / 1000),
                             actor_start_timeout_s=self.actor_start_timeout_s,
                             stop_timeout_s=self.stop_timeout_s,
                             checkpoints=self.checkpoints, restart=self.restart,
                             failover=self.failover, failpoints=self.failpoints, restore_from=restore_from,
                             submission_id=_submission_id(),
                             pool_keeper=actor_pool.POOL.keeper_name() if leased or warm
                             else None,
                             detached=detach,
                             input_extent=progress_display.input_extent(self.transformations))
        assignment = MasterAssignment(job_id, name, plan, options)
        master = None
        if warm is not None:
            try:
                MASTERS.hand_over(warm.actor, assignment)
                master = warm.actor
            except RayActorError:  # it died for good (its node was lost): one of its own
                ray.kill(warm.actor)
        if master is None:
            # (ray's typed remote() misses concurrency_groups, so pyright sees the plain class)
            master = JobMaster.options(  # pyright: ignore[reportAttributeAccessIssue]
                name=master_actor_name(job_id), namespace=NAMESPACE, scheduling_strategy=head,
                lifetime="detached" if detach else None, **master_restarts(options),
                **MASTER_RESOURCES.ray_options()).remote(assignment)
        return JobClient(job_id, name, master, plan, leased=leased)

    def execute(self, name: str = "job", *, restore_from: str | None = None,
                resume: bool = False, detach: bool = False,
                progress: bool | None = None) -> JobResult:
        """Run the job until it ends and return its result (raises JobFailedError on failure).
        ``restore_from``, ``resume`` and ``detach`` as for :meth:`execute_async`.

        The address of the job's page in the web UI goes to stderr, and below it the job's
        progress (:mod:`raystream.engine.progress`): redrawn in place on a terminal, a
        line every few seconds elsewhere (a notebook, a log). ``progress``: False hides
        it, True shows it even with ``RAYSTREAM_PROGRESS=0``."""
        client = self._deploy(name, restore_from, resume, detach)
        _announce_page(client)
        with progress_display.shown(client, self.transformations, _progress_stream(),
                                    show=progress, every_s=_run_defaults.progress_every):
            return client.wait()


def resume_point(storage: str, name: str) -> str | None:
    """The checkpoint directory ``env.execute(name, resume=True)`` restores from: the
    newest completed checkpoint of any run of ``name`` under ``storage`` (None: none).
    A run of ``name`` that is still running is refused: two runs would write twice."""
    for summary in registry.all_jobs():
        if summary["name"] != name or summary["status"] in registry.TERMINAL_STATUSES:
            continue
        try:
            ray.get_actor(master_actor_name(summary["job_id"]), namespace=NAMESPACE)
        except ValueError:
            continue  # its job master is gone: the status is the last one it published
        raise JobStillRunningError(
            f"job '{name}' is still running (id {summary['job_id']}): stop it first "
            f"(raystream stop {summary['job_id']} --savepoint PATH, or cancel it), then resume")
    found = CheckpointStorage(storage).newest_checkpoint_of_job(name)
    if found is None:
        log.warning("no checkpoint of job '%s' under %s: it starts from the beginning",
                    name, storage)
        return None
    job_key, checkpoint_id = found
    log.info("job '%s' resumes from checkpoint %d of run %s", name, checkpoint_id, job_key)
    return f"{storage.rstrip('/')}/{job_key}"


def _announce_page(client: JobClient) -> None:
    """The job's page on stderr (off a terminal under ``raystream run``: stdout; none with
    ``RAYSTREAM_UI=0``)."""
    page = job_page(client)
    if page is not None:
        print(f"raystream: job {client.job_id}: {page}", file=_progress_stream(), flush=True)


def _progress_stream() -> TextIO:
    """stderr, a terminal's or not; off a terminal where ``raystream run`` says (stdout)."""
    if progress_display.is_terminal() or _run_defaults.progress_to is None:
        return sys.stderr
    return _run_defaults.progress_to


def job_page(client: JobClient) -> str | None:
    """The address of the job's page in the web UI, served from this driver (on
    loopback, started once); None with ``RAYSTREAM_UI=0`` or if it cannot start (a UI
    that cannot start never stops the job)."""
    if os.environ.get("RAYSTREAM_UI", "1") == "0":
        return None
    try:
        from raystream.engine.ui.server import start_in_background

        return f"{start_in_background()}#job={client.job_id}"
    except Exception as exc:
        log.warning("the web UI did not start: %s: %s", type(exc).__name__, exc)
        return None


def on_head_node() -> NodeAffinitySchedulingStrategy | None:
    """A strategy that places an actor on the cluster's head node (None: no head found)."""
    for node in ray.nodes():
        if node.get("Alive") and HEAD_NODE_RESOURCE in node.get("Resources", {}):
            return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    return None


def _submission_id() -> str | None:
    """The Ray Jobs API submission running this driver, if any."""
    config = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not config:
        return None
    try:
        return json.loads(config).get("metadata", {}).get("job_submission_id")
    except (ValueError, AttributeError):
        return None


def check_resources(plan: JobPlan, job_name: str) -> None:
    """Fail fast, before creating any actor, if the cluster cannot host the job."""
    needed: dict[str, float] = {}
    largest: dict[str, float] = {}
    demands = [(v.resources, v.parallelism, v.name) for v in plan.vertices]
    demands.append((MASTER_RESOURCES, 1, "job master"))
    for resources, count, _ in demands:
        for key, amount in _resource_dict(resources).items():
            needed[key] = needed.get(key, 0.0) + amount * count
            largest[key] = max(largest.get(key, 0.0), amount)
    available = ray.available_resources()
    per_node = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    problems = []
    for key, amount in needed.items():
        have = available.get(key, 0.0)
        if amount > have + 1e-9:
            problems.append(f"{key}: needs {amount:g}, {have:g} available")
        elif not any(node.get(key, 0.0) + 1e-9 >= largest[key] for node in per_node):
            problems.append(f"{key}: one subtask needs {largest[key]:g}, no node has that much")
    if problems:
        raise InsufficientResourcesError(
            f"job '{job_name}' cannot be deployed ({plan.num_subtasks()} subtasks): "
            + "; ".join(problems)
            + ". Lower the parallelism or the operators' resources, or add nodes to the cluster.")


def _resource_dict(resources: Resources) -> dict[str, float]:
    out = {"CPU": resources.num_cpus}
    if resources.memory:
        out["memory"] = float(resources.memory)
    out.update(dict(resources.custom))
    return out
