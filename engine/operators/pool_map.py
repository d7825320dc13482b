"""``stream.map_batches(Model, concurrency=...)``: a model applied to each batch on a pool
of Ray actors of its own (Ray Data's ``map_batches`` with an actor pool), exactly once.

``Model`` is a class: each pool actor builds one ``Model(*constructor_args,
**constructor_kwargs)`` (the model loads once per actor) and calls it on batches
(:mod:`~raystream.engine.operators.pool_worker`: what it takes and may return). The
actors are not the subtask's: they ask Ray for their own ``num_cpus``/``num_gpus``, and
each subtask has a pool of ``concurrency`` actors, or between ``min`` and ``max`` of
them, growing while batches wait and shrinking when idle
(:mod:`~raystream.engine.operators.model_pool`).

The operator works as ``map_async`` does (:mod:`~raystream.engine.operators.async_io`),
with the pool's object refs in place of coroutines: each input batch (cut into
``batch_size`` rows at most; smaller batches go as they are, with no wait for more rows)
is a queue entry, submitted to the pool by object ref; at most ``max_in_flight`` entries
are queued per subtask (sent, waiting for an actor, or done and not yet emitted), and a
full queue blocks the subtask, which is backpressure upstream. Results leave in input
order (``ordered=True``, Flink's ordered async I/O) or as they complete, never across a
watermark. A call may return any number of rows.

Exactly once: the entries not yet emitted when a checkpoint is taken are the operator's
state (Arrow IPC, :mod:`~raystream.engine.operators.pending_inputs`; spread round-robin
over the subtasks at another parallelism); a restore submits them again before any new
input. A batch may be computed twice (before a failure and after it, or by an actor that
died and its replacement), its result is emitted once.

    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> from raystream.actors.operator import CollectingOutput, RuntimeContext
    >>> from raystream.core.ray_start import ensure_ray
    >>> class AddOne:
    ...     def __call__(self, batch):
    ...         return pa.record_batch({"y": pc.add(batch["x"], 1)})
    >>> ensure_ray(num_cpus=2)  # doctest: +SKIP
    >>> op = PoolMapOperator("add-one", PoolOptions(AddOne, concurrency=1, num_cpus=0.1))
    >>> out = CollectingOutput(); op.setup(RuntimeContext.local(), out)
    >>> op.initialize_state(None); op.open()  # doctest: +SKIP
    >>> op.process_batch(pa.record_batch({"x": [1, 2]})); op.finish(); op.close()  # doctest: +SKIP
    >>> [b.to_pydict() for b in out.batches]  # doctest: +SKIP
    [{'y': [2, 3]}]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pyarrow as pa

from raystream.actors.operator import Operator, OperatorSnapshot, RestoredState
from raystream.engine.errors import choice, describe_record
from raystream.engine.operators.async_queue import AsyncQueue, Watermark
from raystream.engine.operators.functions import MapBatchesOperator
from raystream.engine.operators.model_pool import ModelPool, PoolSize
from raystream.engine.operators.pending_inputs import decode_pending, encode_pending
from raystream.engine.operators.pool_worker import BatchFormat, ModelSpec

_POLL_MS = 2  # how soon the subtask looks again for results while any batch is queued
_WAIT_S = 0.05  # how long a full queue waits for a result before looking again


@dataclass(frozen=True)
class PoolOptions:
    """A ``map_batches`` model pool as the job asked for it (checked when it is built).

        >>> class Model:
        ...     def __call__(self, batch): return batch
        >>> PoolOptions(Model, concurrency=(1, 4)).capacity
        8
    """

    model: type
    concurrency: int | tuple[int, int] = 4
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    batch_size: int | None = None
    constructor_args: tuple[Any, ...] = ()
    constructor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    batch_format: BatchFormat | str = BatchFormat.PYARROW
    ordered: bool = True
    max_in_flight: int | None = None  # None: per_actor times the largest pool size
    per_actor: int = 2  # batches sent to one actor at a time
    idle_timeout_s: float = 10.0  # an actor idle this long stops while more than min run

    def __post_init__(self) -> None:
        where = f"map_batches({getattr(self.model, '__name__', self.model)!r})"
        # (every class is callable, through type.__call__: look for its instances' own)
        if not isinstance(self.model, type) or not any(
                "__call__" in vars(k) for k in self.model.__mro__[:-1]):
            raise TypeError(f"{where}: the model must be a class with __call__(batch)")
        PoolSize.of(self.concurrency)  # raises on a bad one
        choice(BatchFormat, self.batch_format, "batch_format")
        for name in ("batch_size", "max_in_flight"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{where}: {name} must be at least 1, got {value}")
        if self.per_actor < 1 or self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"{where}: per_actor must be at least 1 and num_cpus, num_gpus "
                             f"not negative")

    @property
    def capacity(self) -> int:
        """The most batches queued per subtask."""
        return self.max_in_flight or self.per_actor * PoolSize.of(self.concurrency).max

    def actor_options(self) -> dict[str, Any]:
        """The pool actors' resource request to Ray."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.resources:
            options["resources"] = dict(self.resources)
        return options


def map_batches_operator(fn: Callable[[pa.RecordBatch], Any] | type,
                         **pool: Any) -> Callable[[str], Operator]:
    """What ``map_batches`` adds: a model pool for a class, a per-batch function
    otherwise (which takes no pool options)."""
    given = {k: v for k, v in pool.items() if v is not None}
    if isinstance(fn, type):
        options = PoolOptions(fn, **given)
        return lambda name: PoolMapOperator(name, options)
    if given:
        raise TypeError(f"map_batches: {', '.join(sorted(given))} apply to a model pool: pass "
                        f"a class (its __call__ takes the batch), not {type(fn).__name__}")
    return lambda name: MapBatchesOperator(name, [fn])


class PoolMapOperator(Operator):
    """Applies a model on a pool of Ray actors; see the module docs."""

    def __init__(self, name: str, options: PoolOptions) -> None:
        super().__init__(name)
        self.options = options
        self.batch_format = choice(BatchFormat, options.batch_format, "batch_format")

    # -- lifecycle ---------------------------------------------------------------------
    def initialize_state(self, restored: RestoredState | None) -> None:
        self.queue = AsyncQueue(ordered=self.options.ordered)
        self.pool: ModelPool | None = None  # started by open()
        self._restored: list[pa.RecordBatch] = []  # submitted in open(), before new input
        if restored is not None:
            ctx = self.ctx
            for j, state in enumerate(restored.operator_states):
                if j % ctx.parallelism == ctx.subtask_index:  # round-robin over the subtasks
                    self._restored.extend(decode_pending(state, where=self._where))

    @property
    def _where(self) -> str:
        return f"map_batches '{self.name}'"

    def open(self) -> None:
        o = self.options
        spec = ModelSpec(o.model, o.constructor_args, dict(o.constructor_kwargs),
                         self.batch_format)
        self.pool = ModelPool(self._where, spec, PoolSize.of(o.concurrency),
                              actor_options=o.actor_options(), per_actor=o.per_actor,
                              idle_timeout_s=o.idle_timeout_s)
        self.pool.start()
        restored, self._restored = self._restored, []
        for batch in restored:
            self._submit(batch)

    def close(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()
            self.pool = None

    # -- records and time --------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        size = self.options.batch_size or max(batch.num_rows, 1)
        for start in range(0, batch.num_rows, size):
            self._submit(batch.slice(start, size))
        self._emit_ready()

    def process_watermark(self, watermark: int) -> None:
        self._emit_ready()
        self.queue.add_watermark(watermark)
        self._emit_ready()

    def next_processing_time(self) -> int | None:
        now = int(time.time() * 1000)
        if len(self.queue):
            return now + _POLL_MS
        pool = self.pool
        if pool is not None and pool.can_shrink():  # an idle pool shrinks on these ticks
            return now + max(int(self.options.idle_timeout_s * 250), _POLL_MS)
        return None

    def on_processing_time(self, now_ms: int) -> None:
        self._emit_ready()

    def finish(self) -> None:
        """The input ended: wait for every batch and emit its result."""
        while len(self.queue):
            self._wait_for_room(limit=1)

    # -- checkpoints -------------------------------------------------------------------
    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._emit_ready()  # results at hand go before the barrier, not into the state

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        pending = [value for _, value in self.queue.pending()]  # batches, immutable
        return OperatorSnapshot(operator_state=lambda: encode_pending(pending, combine=False))

    # -- the pool ----------------------------------------------------------------------
    def _submit(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for the pool, once there is room: a full queue is backpressure."""
        if len(self.queue) >= self.options.capacity:
            self._wait_for_room(limit=self.options.capacity)
        assert self.pool is not None, "open() starts the pool before any batch"
        self.pool.submit(self.queue.add(batch), batch)

    def _wait_for_room(self, *, limit: int) -> None:
        while len(self.queue) >= limit:
            self._emit_ready(timeout_s=_WAIT_S)

    def _emit_ready(self, timeout_s: float = 0.0) -> None:
        """Take the pool's results (waiting up to ``timeout_s`` for one) and emit what
        the queue lets go, in its order."""
        if self.pool is None:
            return
        for done in self.pool.poll(timeout_s):
            batch = self.queue.input_of(done.entry)
            if batch is None:  # (cannot happen: an entry leaves the queue once emitted)
                continue
            if done.error is not None:
                error = done.error
                error.add_note(f"{self._where}: in a batch of {batch.num_rows} rows, the "
                               f"first {describe_record(batch.slice(0, 1).to_pylist()[0])}")
                raise error
            self.queue.complete(done.entry, done.batches or [])
        for item in self.queue.ready():
            if isinstance(item, Watermark):
                self.output.emit_watermark(item.watermark)
            else:
                for out in item.rows:
                    self.output.emit(out)

    def metrics(self) -> dict[str, float]:
        pool = getattr(self, "pool", None)
        figures = pool.metrics() if pool is not None else {}
        return {**figures, "pool_in_flight": float(len(getattr(self, "queue", ())))}

    def waiting_for(self) -> str | None:
        pool = getattr(self, "pool", None)
        return pool.describe() if pool is not None and len(self.queue) else None

