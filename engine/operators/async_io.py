"""Async I/O (Flink's ``AsyncWaitOperator``): ``stream.map_async(fn, ...)`` calls an
``async def`` per row (or per batch) without stalling the stream on each call.

Each subtask runs an asyncio event loop on a thread of its own. A row's call is issued
on it as the row arrives; at most ``capacity`` calls are in flight (or done and not yet
emitted): a full queue blocks the subtask, which is backpressure upstream. Results
leave in input order (``ordered=True``) or as they complete, never across a watermark
(:mod:`raystream.engine.operators.async_queue`). A call may time out (``timeout_s``,
all its retries included): the row fails the job with :class:`~raystream.AsyncTimeoutError`
naming it, or goes to ``on_timeout(row)``, whose rows are emitted instead. ``retry``
(:class:`AsyncRetry`) issues a call again, with backoff, when it raised one of the
exceptions named.

Exactly once: the inputs whose results were not emitted when a checkpoint is taken
are the operator's state (Arrow IPC, redistributed round-robin when the parallelism
changes, as Flink's union list state); a restore issues their calls again before any
new input, so every input has exactly one result in the output (a call itself may
run twice: once before the failure, once after).

    >>> import asyncio, pyarrow as pa
    >>> from raystream.actors.operator import CollectingOutput, RuntimeContext
    >>> async def double(row):
    ...     await asyncio.sleep(0.01)
    ...     return {"x": row["x"] * 2}
    >>> op = AsyncWaitOperator("double", double, capacity=10)
    >>> out = CollectingOutput(); op.setup(RuntimeContext.local(), out)
    >>> op.initialize_state(None); op.open()
    >>> op.process_batch(pa.record_batch({"x": [1, 2, 3]})); op.finish(); op.close()
    >>> [row for b in out.batches for row in b.to_pylist()]
    [{'x': 2}, {'x': 4}, {'x': 6}]
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pyarrow as pa

from raystream.actors.operator import Operator, OperatorSnapshot, RestoredState
from raystream.engine.batches import capture_row
from raystream.engine.errors import AsyncTimeoutError, BadRecordError, describe_record
from raystream.engine.operators.async_queue import AsyncQueue, Watermark
from raystream.engine.operators.functions import (as_record_batch, close_function, emit_rows,
                                                  open_function)
from raystream.engine.operators.pending_inputs import decode_pending, encode_pending

_POLL_MS = 2  # how soon the subtask looks again for completed calls while any is in flight
_WAIT_S = 0.05  # how long a full queue waits for a completion before looking again


@dataclass(frozen=True)
class AsyncRetry:
    """Issue a call again when it raised one of ``on`` (Flink's ``AsyncRetryStrategy``):
    at most ``attempts`` calls in all, waiting ``backoff_s`` before the second, then
    ``multiplier`` times longer each time, at most ``max_backoff_s``.

        >>> AsyncRetry(attempts=3, on=(ConnectionError,)).delays()
        [0.1, 0.2]
    """

    attempts: int = 3
    backoff_s: float = 0.1
    multiplier: float = 2.0
    max_backoff_s: float = 5.0
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff_s < 0 or self.multiplier < 1:
            raise ValueError(f"AsyncRetry needs attempts >= 1, backoff_s >= 0 and multiplier "
                             f">= 1, got {self}")

    def delays(self) -> list[float]:
        """The waits before the second and later calls."""
        return [min(self.backoff_s * self.multiplier ** i, self.max_backoff_s)
                for i in range(self.attempts - 1)]


def check_async_function(fn: Any, where: str) -> None:
    """Refuse, when the job is built, a function that is not ``async def``."""
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)
    if not inspect.iscoroutinefunction(call):
        raise TypeError(f"{where}: the function must be an `async def` (a coroutine "
                        f"function), got {type(fn).__name__} {fn!r}; use map() for a "
                        f"plain function")


@dataclass
class _Call:
    """What a completed call gave: its rows, or the exception it ended with."""

    entry: int
    rows: list[Any] | None = None
    error: BaseException | None = None
    retries: int = 0


class AsyncWaitOperator(Operator):
    """Calls ``fn`` per row (``batch=True``: per batch) on an event loop of its own; see
    the module docs."""

    def __init__(self, name: str, fn: Callable[[Any], Any], *, capacity: int = 100,
                 timeout_s: float | None = None, ordered: bool = True,
                 retry: AsyncRetry | None = None,
                 on_timeout: Callable[[Any], Any] | None = None, batch: bool = False,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name)
        if capacity < 1:
            raise ValueError(f"map_async '{name}': capacity must be at least 1, got {capacity}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"map_async '{name}': timeout_s must be positive, got {timeout_s}")
        check_async_function(fn, f"map_async '{name}'")
        self.fn, self.capacity, self.timeout_s = fn, capacity, timeout_s
        self.ordered, self.retry, self.on_timeout = ordered, retry, on_timeout
        self.batch, self.schema = batch, schema

    # -- lifecycle ---------------------------------------------------------------------
    def initialize_state(self, restored: RestoredState | None) -> None:
        self.queue = AsyncQueue(ordered=self.ordered)
        self._done: deque[_Call] = deque()  # filled by the loop's thread, drained here
        self._completion = threading.Condition()
        self._futures: dict[int, Future] = {}
        self.completed = self.timeouts = self.retries = 0
        # a restore's inputs without results: issued again in open(), before new input
        self._restored: list[pa.RecordBatch] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # started by open()
        if restored is not None:
            ctx = self.ctx
            for j, state in enumerate(restored.operator_states):
                if j % ctx.parallelism == ctx.subtask_index:  # round-robin over the subtasks
                    self._restored.extend(decode_pending(state, where=f"map_async '{self.name}'"))

    def open(self) -> None:
        open_function(self.fn, self.ctx)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True,
                                        name=f"raystream-async-{self.name}")
        self._thread.start()
        restored, self._restored = self._restored, []
        for batch in restored:
            self._issue(batch)

    @classmethod
    def factory(cls, fn: Callable[[Any], Any], **options: Any) -> Callable[[str], Operator]:
        """What ``map_async`` adds to the job: ``fn`` checked now, when the job is built,
        the operator made per subtask."""
        check_async_function(fn, "map_async(fn)")
        return lambda name: cls(name, fn, **options)

    def close(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None:
            # the calls still in flight are cancelled and awaited before the loop stops
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(timeout=5)
            except Exception:  # (closing either way)
                pass
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)
            loop.close()
            self._loop = None
        close_function(self.fn)

    # -- records and time --------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self._issue(batch)
        self._emit_ready()

    def process_watermark(self, watermark: int) -> None:
        self._drain()
        self.queue.add_watermark(watermark)
        self._emit_ready()

    def next_processing_time(self) -> int | None:
        return int(time.time() * 1000) + _POLL_MS if len(self.queue) else None

    def on_processing_time(self, now_ms: int) -> None:
        self._emit_ready()

    def finish(self) -> None:
        """The input ended: wait for every call and emit its result."""
        while len(self.queue):
            self._wait_for_room(limit=1)
        self._emit_ready()

    # -- checkpoints -------------------------------------------------------------------
    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._emit_ready()  # results at hand go before the barrier, not into the state

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        pending = [value for _, value in self.queue.pending()]  # batches, immutable
        # a row's one-row slices are written as a few batches; a batch's call stays one
        return OperatorSnapshot(
            operator_state=lambda: encode_pending(pending, combine=not self.batch))

    # -- calls -------------------------------------------------------------------------
    def _issue(self, batch: pa.RecordBatch) -> None:
        """Issue the calls of ``batch``'s rows (or of the batch), waiting for room in the
        queue before each: a full queue is backpressure."""
        if self.batch:
            inputs: list[tuple[pa.RecordBatch, Any]] = [(batch, batch)]
        else:  # a row's input kept as a one-row slice: the snapshot's part of it
            inputs = [(batch.slice(i, 1), row) for i, row in enumerate(batch.to_pylist())]
        for value, arg in inputs:
            if len(self.queue) >= self.capacity:
                self._wait_for_room(limit=self.capacity)
            entry = self.queue.add(value)
            loop = self._loop
            assert loop is not None, "open() starts the event loop before any call"
            future = asyncio.run_coroutine_threadsafe(self._call(arg), loop)
            self._futures[entry] = future
            future.add_done_callback(lambda f, entry=entry: self._completed(entry, f))

    async def _call(self, arg: Any) -> tuple[Any, int]:
        """The user's call with its retries, within the timeout: (what it returned, the
        number of retries it took)."""
        async def attempts() -> tuple[Any, int]:
            retry = self.retry
            delays = retry.delays() if retry is not None else []
            for retried, delay in enumerate([*delays, None]):
                try:
                    return await self.fn(arg), retried
                except Exception as exc:
                    if delay is None or retry is None or not isinstance(exc, retry.on):
                        raise
                await asyncio.sleep(delay)
            raise AssertionError("unreachable")  # the last attempt returns or raises
        if self.timeout_s is None:
            return await attempts()
        return await asyncio.wait_for(attempts(), self.timeout_s)

    def _completed(self, entry: int, future: Future) -> None:
        """On the loop's thread: note the outcome (converted on the subtask's thread)."""
        if future.cancelled():
            return
        error = future.exception()
        call = (_Call(entry, error=error) if error is not None
                else _Call(entry, rows=[future.result()[0]], retries=future.result()[1]))
        with self._completion:
            self._done.append(call)
            self._completion.notify()

    def _drain(self) -> None:
        """Hand the completed calls' results to the queue (on the subtask's thread)."""
        while self._done:
            call = self._done.popleft()
            self._futures.pop(call.entry, None)
            self.completed += 1
            self.retries += call.retries
            value = self.queue.input_of(call.entry)
            if value is None:  # (cannot happen: an entry leaves the queue once completed)
                continue
            if call.error is not None:
                self.queue.complete(call.entry, self._failed(value, call.error))
            else:
                self.queue.complete(call.entry, self._rows_of(value, call.rows or [None]))

    def _failed(self, value: pa.RecordBatch, error: BaseException) -> list[Any]:
        """A call that raised: a timeout goes to ``on_timeout`` if given; anything else
        fails the job naming the input."""
        described = describe_record(value.to_pylist() if self.batch else value.to_pylist()[0])
        if isinstance(error, (asyncio.TimeoutError, TimeoutError)) and self.timeout_s is not None:
            self.timeouts += 1
            if self.on_timeout is not None:
                arg = value if self.batch else value.to_pylist()[0]
                return self._rows_of(value, [self.on_timeout(arg)])
            raise AsyncTimeoutError(
                f"map_async '{self.name}': no result within {self.timeout_s:g} s for "
                f"{'batch' if self.batch else 'record'} {described}; raise timeout_s, or "
                f"give on_timeout= to emit something else for it", record=described)
        error.add_note(f"record: {described}")
        raise error

    def _rows_of(self, value: pa.RecordBatch, produced: list[Any]) -> list[Any]:
        """What a call returned, as rows (dicts) or, with ``batch=True``, batches."""
        (result,) = produced
        if self.batch:
            return [] if result is None else as_record_batch(
                result, where=f"map_async '{self.name}'")
        if result is None:
            return []
        results = [result] if isinstance(result, Mapping) else list(result)
        for row in results:
            if not isinstance(row, Mapping):
                raise BadRecordError(
                    f"map_async '{self.name}' must give a dict, a list of dicts or None per "
                    f"record, got {type(row).__name__} {describe_record(row)} for record "
                    f"{describe_record(value.to_pylist()[0])}", record=value.to_pylist()[0])
        return [capture_row(row) for row in results]

    def _wait_for_room(self, *, limit: int) -> None:
        """Block until fewer than ``limit`` entries are queued, emitting what is ready."""
        while len(self.queue) >= limit:
            with self._completion:
                if not self._done:
                    self._completion.wait(_WAIT_S)
            self._emit_ready()

    def _emit_ready(self) -> None:
        """Emit what the queue lets go now: rows of consecutive results as one batch."""
        self._drain()
        rows: list[Any] = []
        for item in self.queue.ready():
            if isinstance(item, Watermark):
                self._flush(rows)
                self.output.emit_watermark(item.watermark)
            elif self.batch:
                self._flush(rows)
                for batch in item.rows:
                    self.output.emit(batch)
            else:
                rows.extend(item.rows)
        self._flush(rows)

    def _flush(self, rows: list[Any]) -> None:
        if rows:
            emit_rows(self, rows, self.schema)
            rows.clear()

    def metrics(self) -> dict[str, float]:
        return {"async_in_flight": float(len(getattr(self, "queue", ()))),
                "async_completed": float(getattr(self, "completed", 0)),
                "async_timeouts": float(getattr(self, "timeouts", 0)),
                "async_retries": float(getattr(self, "retries", 0))}


async def _cancel_tasks() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
