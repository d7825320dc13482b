"""Keyed operators: user functions with per-key state (Flink's ``KeyedProcessFunction``).

State lives in a :class:`~raystream.checkpoint.state_backend.KeyedStateBackend` that
is partitioned by key group and snapshotted consistently in every
checkpoint, so keyed state survives failover exactly once and can be restored
at another parallelism.

    >>> import raystream as rs
    >>> class CountPerUser(rs.KeyedProcessFunction):
    ...     def open(self, ctx):
    ...         self.count = ctx.value_state("count", default=0)
    ...     def process_element(self, row, ctx):
    ...         self.count.update(self.count.value() + 1)
    ...         yield {"user": ctx.current_key, "count": self.count.value()}
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> sink = env.from_collection([{"user": "a"}, {"user": "b"}, {"user": "a"}]).key_by("user").process(
    ...     CountPerUser()).collect()
    >>> sorted(env.execute("count").table(sink).to_pylist(), key=str)  # doctest: +SKIP
    [{'user': 'a', 'count': 1}, {'user': 'a', 'count': 2}, {'user': 'b', 'count': 1}]
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Protocol, cast

import numpy as np
import pyarrow as pa

from raystream.actors.messages import MIN_WATERMARK
from raystream.checkpoint.disk_incremental import IncrementalSnapshot
from raystream.checkpoint.disk_sections import section_state_kinds
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.entry_keys import EntryKeys
from raystream.checkpoint.envelope import is_keyed_state
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.heap_changelog import HeapIncrementalSnapshot
from raystream.checkpoint.keygroups import key_group_range
from raystream.checkpoint.sections import decode_parts, encode_parts
from raystream.checkpoint.state import AggregateFunction
from raystream.checkpoint.state_backend import create_keyed_state_backend, is_disk
from raystream.checkpoint.ttl import StateTtlConfig
from raystream.engine.errors import BadRecordError, describe_record
from raystream.engine.keys import KeySelector
from raystream.actors.operator import (Operator, OperatorSnapshot, RestoredState,
                                       RuntimeContext)
from raystream.engine.batches import capture_row, rows_to_batch
from raystream.engine.operators.functions import call_user, close_function, emit_rows
from raystream.engine.operators.moved_disk_state import MovedDiskState
from raystream.timers.disk_service import DiskTimerService, restore_heap_timers
from raystream.timers.protocol import Timers
from raystream.timers.service import TimerService


class KeyedContext:
    """What a keyed function sees: the current key, keyed state, timers, and where it runs."""

    def __init__(self, runtime: RuntimeContext, operator: "KeyedOperator") -> None:
        self.runtime = runtime
        self._operator = operator
        self._backend = operator.backend
        self.time_domain: str | None = None  # in on_timer: "event_time" or "processing_time"
        self.side_rows: dict[str, list[dict]] = {}  # ctx.output() since the last emit

    def output(self, tag: str, row: dict) -> None:
        """Emit ``row`` on side output ``tag`` (read it with ``stream.side_output(tag)``),
        beside what the function yields on its main output."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"a side output tag is a non-empty string, got {tag!r}")
        self.side_rows.setdefault(tag, []).append(capture_row(row))

    @property
    def current_key(self) -> Any:
        return self._backend.current_key

    @property
    def subtask_index(self) -> int:
        return self.runtime.subtask_index

    @property
    def current_watermark(self) -> int:
        """The operator's event time for the current key: the minimum watermark over its
        inputs (after a restore, at least what the key's group had reached before)."""
        group = self._backend.current_key_group
        operator = self._operator
        return operator.current_watermark if group is None else operator.watermark_of_group(group)

    @staticmethod
    def current_processing_time() -> int:
        """The wall clock, in ms since the epoch (what processing-time timers compare to)."""
        return int(time.time() * 1000)

    # ``ttl``: a rs.StateTtlConfig to expire the state's values (heap state backend)
    def value_state(self, name: str, default: Any = None, *, ttl: StateTtlConfig | None = None):
        """One value per key (``value()``, ``update(v)``, ``clear()``)."""
        return self._backend.value_state(name, default, ttl=ttl)

    def list_state(self, name: str, *, ttl: StateTtlConfig | None = None):
        """A list per key (``get()``, ``add(v)``, ``add_all(vs)``, ``update(vs)``, ``clear()``)."""
        return self._backend.list_state(name, ttl=ttl)

    def map_state(self, name: str, *, ttl: StateTtlConfig | None = None):
        """A dict per key (``get``, ``put``, ``remove``, ``contains``, ``items``, ...)."""
        return self._backend.map_state(name, ttl=ttl)

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: StateTtlConfig | None = None):
        """A value per key folded with ``reduce`` on every ``add``."""
        return self._backend.reducing_state(name, reduce, ttl=ttl)

    def aggregating_state(self, name: str, aggregate: AggregateFunction, *,
                          ttl: StateTtlConfig | None = None):
        """An accumulator per key driven by an :class:`AggregateFunction`."""
        return self._backend.aggregating_state(name, aggregate, ttl=ttl)

    # -- timers of the current key (unique per timestamp and key) ---------------------
    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the watermark reaches it."""
        self._operator.timers.register_event_time_timer(self._current_key_id(), 0, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._operator.timers.delete_event_time_timer(self._current_key_id(), 0, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the wall clock reaches it."""
        self._operator.timers.register_processing_time_timer(self._current_key_id(), 0,
                                                             int(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._operator.timers.delete_processing_time_timer(self._current_key_id(), 0,
                                                           int(timestamp))

    def _current_key_id(self) -> int:
        backend = self._backend
        if backend.current_key_group is None:
            raise RuntimeError("timers belong to a key: register them while processing a record "
                               "or firing a timer")
        return self._operator.timers.key_id(backend.current_key, backend.current_key_group)


class KeyedProcessFunction:
    """Base class for keyed functions: override ``process_element`` (and ``open``, ``on_timer``).

        >>> import raystream as rs
        >>> class SessionEnd(rs.KeyedProcessFunction):
        ...     def process_element(self, row, ctx):
        ...         ctx.register_event_time_timer(row["ts"] + 1000)  # 1 s of inactivity
        ...     def on_timer(self, timestamp, ctx):
        ...         yield {"user": ctx.current_key, "fired_at": timestamp}
    """

    def open(self, ctx: KeyedContext) -> None:
        """Create state handles here; they follow the current key."""

    def process_element(self, row: dict, ctx: KeyedContext) -> Iterable[dict] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[dict] | None:
        """A timer of ``ctx.current_key`` fired (``ctx.time_domain`` says which clock).

        Event-time timers all fire at the end of a bounded input (the watermark
        goes to +inf); processing-time timers still pending then do not, as in Flink.
        """

    def close(self) -> None:
        pass


class KeyedOperator(Operator):
    """An operator with keyed state and timers over its subtask's key-group range.

    Both are snapshotted per key group: one section per key group holds the
    parts ``"state"`` and ``"timers"`` (and any a subclass adds through
    :meth:`keyed_snapshot_parts`), so restore works at any parallelism.
    """

    # May this operator keep its state in the disk backend? Every built-in keyed operator
    # may; a subclass that keeps state of its own beside the backend's may not.
    supports_disk_state = False
    # Layouts of the operator's own in the disk backend's database, by the prefix of their
    # state kind (window panes, count windows, join rows): a heap job cannot read them.
    disk_only_kinds: tuple[str, ...] = ()
    label = "operator"  # what error messages call the operator
    # Does the operator keep no timer-service key id across batches and firings? Then on
    # the disk backend the key table is emptied between them once it grows past its
    # limit (release_key_ids, which an operator with more to reset overrides), so it
    # stays bounded however many keys.
    key_ids_are_transient = False

    def __init__(self, name: str, keys: KeySelector) -> None:
        super().__init__(name)
        self.keys = keys
        self.current_watermark = MIN_WATERMARK
        # after a restore: the watermark each of our key groups had reached at the
        # checkpoint (indexed by group - first group), until current_watermark passes them
        self._floors: np.ndarray | None = None

    def initialize_state(self, restored: RestoredState | None) -> None:
        ctx = self.ctx
        groups = key_group_range(ctx.subtask_index, ctx.parallelism, ctx.max_parallelism)
        if is_disk(ctx.state_backend) and not self.supports_disk_state:
            raise ValueError(
                f"operator '{self.name}' ({type(self).__name__}) keeps state of its own beside "
                f"the keyed state backend, so it cannot run on the disk state backend; run "
                f"this job with CheckpointConfig(state_backend='heap')")
        # a disk savepoint's layouts of this operator, for a heap job: moved by the subclass
        self.moved_disk_state: MovedDiskState | None = None
        moves = False  # does this heap job restore layouts of ours from a disk savepoint?
        if restored is not None and self.disk_only_kinds and not is_disk(ctx.state_backend):
            restored = replace(restored, keyed_sections=list(restored.keyed_sections))
            moves = self._holds_disk_only_state(restored)
        self.backend = create_keyed_state_backend(ctx.state_backend,
                                                  max_parallelism=ctx.max_parallelism,
                                                  key_groups=groups,
                                                  checkpointing=ctx.checkpointing)
        self._first_group = groups.start
        if restored is not None and restored.watermark_floors is not None:
            # event time never goes back: what was late before the checkpoint stays late
            floors = restored.watermark_floors
            self.current_watermark = max(self.current_watermark, floors.minimum())
            mine = floors.of_groups(groups)
            if len(mine) and mine.max() > self.current_watermark:
                self._floors = mine
        parts: dict[str, list[tuple[int, bytes]]] = {}
        for group, section in restored.keyed_sections if restored is not None else ():
            if self.backend.owns_section(section):  # a section of keyed state only
                parts.setdefault("state", []).append((group, section))
                continue
            for name, data in decode_parts(section).items():
                parts.setdefault(name, []).append((group, data))
        timer_sections = parts.pop("timers", [])  # a heap job's
        state = parts.pop("state", [])
        dbs = restored.keyed_dbs if restored is not None else []
        if isinstance(self.backend, DiskKeyedStateBackend):
            if dbs:  # first: it replaces the database of an empty backend
                self.backend.restore_db(dbs)
            self.backend.restore(state)  # a disk job's timers come with its entries
            # After the restore: the timers' state ids are declared in the restored backend.
            self.timers: Timers = DiskTimerService(self.backend)
            self.timers.restore(timer_sections)
        else:
            if dbs:
                raise ValueError(
                    f"operator '{self.name}': the checkpoint holds incremental checkpoints "
                    f"of the disk state backend, which only that backend restores; restore "
                    f"with state_backend='disk', or from a savepoint (always full)")
            self.timers = timers = TimerService(max_parallelism=ctx.max_parallelism,
                                                key_groups=groups)
            timers.restore(timer_sections)  # first: it builds the key table
            restore_heap_timers(timers, state)  # a disk job's savepoint: in its entries
            if moves:  # the subclass moves them (restore_keyed_parts)
                self.moved_disk_state = MovedDiskState.load(
                    state, max_parallelism=ctx.max_parallelism, key_groups=groups)
            assert isinstance(self.backend, HeapKeyedStateBackend)
            self.backend.restore(state, skip_kinds=self.disk_only_kinds)
            if restored is not None and restored.heap_chain is not None:
                assert isinstance(self.backend, HeapKeyedStateBackend)
                self.backend.extend_restored(restored.heap_chain)
        if restored is not None:
            try:
                self.restore_keyed_parts(parts)
            finally:
                if self.moved_disk_state is not None:
                    self.moved_disk_state.close()
                    self.moved_disk_state = None

    def _holds_disk_only_state(self, restored: RestoredState) -> bool:
        """Do ``restored``'s sections hold layouts of :attr:`disk_only_kinds`?"""
        for group, section in restored.keyed_sections:
            state = section if is_keyed_state(section) else decode_parts(section).get("state")
            if state is not None and any(
                    kind.startswith(self.disk_only_kinds)
                    for kind in section_state_kinds(group, state, self.ctx.max_parallelism)):
                return True
        return False

    def advance_watermark(self, watermark: int) -> None:
        """The operator's event time moves to ``watermark`` (never back)."""
        if watermark > self.current_watermark:
            self.current_watermark = watermark
            if self._floors is not None and watermark >= self._floors.max():
                self._floors = None

    def watermarks_of_key_ids(self, key_ids: np.ndarray) -> np.ndarray | int:
        """The watermark that judges lateness for each of the timer service's ``key_ids``:
        the operator's, or where it is further the one its key group had restored."""
        if self._floors is None:
            return self.current_watermark
        groups = self.timers.key_groups_of(key_ids)
        return np.maximum(self.current_watermark, self._floors[groups - self._first_group])

    def watermark_of_group(self, group: int) -> int:
        if self._floors is None:
            return self.current_watermark
        return max(self.current_watermark, int(self._floors[group - self._first_group]))

    def keyed_snapshot_parts(self) -> dict[str, Callable[[], dict[int, bytes]]]:
        """Synchronous part: per named part, a callable giving its sections by key group."""
        if isinstance(self.timers, DiskTimerService):  # its timers are in the state's
            return {"state": self.backend.snapshot()}
        return {"state": self.backend.snapshot(), "timers": self.timers.snapshot()}

    @property
    def disk_timers(self) -> DiskTimerService:
        """The timer service of an operator on the disk backend."""
        if not isinstance(self.timers, DiskTimerService):
            raise RuntimeError(f"operator '{self.name}' runs on the heap state backend")
        return self.timers

    def release_key_ids(self) -> bool:
        """A safe point between batches and firings: on the disk backend, an operator
        whose key ids are transient lets the timer service empty a full key table. True
        if it did (every key id given before is invalid)."""
        return (self.key_ids_are_transient and isinstance(self.timers, DiskTimerService)
                and self.timers.release_keys())

    def restore_keyed_parts(self, parts: dict[str, list[tuple[int, bytes]]]) -> None:
        """Restore the parts a subclass added to :meth:`keyed_snapshot_parts`."""
        if parts:
            raise ValueError(f"operator '{self.name}': unexpected keyed state parts {sorted(parts)}")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)  # its next increment starts here

    def metrics(self) -> dict[str, float]:
        """On the disk backend, RocksDB's own figures (``rocksdb.<property>``, see
        :data:`~raystream.checkpoint.disk_state.NATIVE_METRICS`)."""
        backend = getattr(self, "backend", None)  # read from the monitor thread, any time
        return backend.native_metrics() if isinstance(backend, DiskKeyedStateBackend) else {}

    def end_attempt(self) -> None:
        backend = getattr(self, "backend", None)  # none if the attempt failed before it
        if isinstance(backend, DiskKeyedStateBackend):
            backend.release_memory()  # closed once collected: a snapshot may still read

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        parts = self.keyed_snapshot_parts()
        state = parts.get("state")

        def sections() -> dict[int, bytes]:
            by_group: dict[int, dict[str, bytes]] = {}
            for name, part in parts.items():
                for group, data in part().items():
                    by_group.setdefault(group, {})[name] = data
            return {group: encode_parts(named) for group, named in by_group.items()}
        return OperatorSnapshot(keyed_state=sections, keyed_db=state if isinstance(
            state, (IncrementalSnapshot, HeapIncrementalSnapshot)) else None)

    def keyed_rows(self, batch: pa.RecordBatch, keys: KeySelector | None = None):
        """(key, row) per row, with the backend's current key set to it (``keys``: the
        selector of this input when it is not the operator's, as in a two-input operator)."""
        row_keys, groups = (keys or self.keys).keys_and_groups(batch, self.ctx.max_parallelism)
        backend = self.backend
        for key, group, row in zip(row_keys, groups.tolist(), batch.to_pylist()):
            backend.set_current_key(key, group)
            yield key, row


class KeyedProcessOperator(KeyedOperator):
    supports_disk_state = True
    key_ids_are_transient = True  # ids live within one batch or firing only

    def __init__(self, name: str, fn: KeyedProcessFunction, keys: KeySelector, *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name, keys)
        self.fn = fn
        self.schema = schema

    def open(self) -> None:
        self.keyed_ctx = KeyedContext(self.ctx, self)
        self.fn.open(self.keyed_ctx)

    def close(self) -> None:
        close_function(self.fn)

    def process_batch(self, batch, input_index=0):
        out: list[Any] = []
        process, ctx = self.fn.process_element, self.keyed_ctx
        ctx.time_domain = None
        for _key, row in self.keyed_rows(batch):
            produced = call_user(process, row, ctx)
            if produced is not None:
                out.extend(map(capture_row, produced))
        self._emit(out)

    def _emit(self, rows: list[Any]) -> None:
        """Emit what a batch or a firing produced: the end of both, a safe point."""
        emit_rows(self, rows, self.schema)
        side, self.keyed_ctx.side_rows = self.keyed_ctx.side_rows, {}
        for tag, tagged in side.items():
            self.emit_side(tag, rows_to_batch(
                tagged, schema=None, where=f"side output {tag!r} of operator '{self.name}'"))
        self.release_key_ids()

    def process_watermark(self, watermark: int) -> None:
        self.advance_watermark(watermark)
        self._fire("event_time", lambda: self.timers.advance_watermark(watermark))
        self.output.emit_watermark(watermark)

    def next_processing_time(self) -> int | None:
        return self.timers.next_processing_time()

    def on_processing_time(self, now_ms: int) -> None:
        self._fire("processing_time", lambda: self.timers.fire_processing_time(now_ms))

    def _fire(self, domain: str, pop: Callable[[], tuple]) -> None:
        """Call ``on_timer`` for every due timer, in timestamp order, until none is due
        (``on_timer`` may register timers that are due already). Each pop's output is
        emitted before the next pop (on disk a pop is a bounded chunk): a safe point."""
        ctx, timers, backend = self.keyed_ctx, self.timers, self.backend
        ctx.time_domain = domain
        while True:
            timestamps, key_ids, _namespaces = pop()
            if not len(timestamps):
                break
            out: list[Any] = []
            for timestamp, key_id in zip(timestamps.tolist(), key_ids.tolist()):
                backend.set_current_key(timers.key(key_id), timers.key_group(key_id))
                produced = call_user(self.fn.on_timer, timestamp, ctx)
                if produced is not None:
                    out.extend(map(capture_row, produced))
            self._emit(out)
        ctx.time_domain = None


class _BatchValueState(Protocol):
    """A value state that reads and writes many keys at once (the disk backend's)."""

    def entry_keys(self, keys: list[Any], groups: np.ndarray) -> EntryKeys: ...
    def values_at(self, keys: EntryKeys) -> list[Any]: ...
    def update_at(self, keys: EntryKeys, values: Iterable[Any]) -> None: ...


class ReduceOperator(KeyedOperator):
    """Keyed running aggregate: ``fn(accumulated: dict, row: dict) -> dict`` per key.

    Emits the updated aggregate for every incoming row, as Flink's
    ``KeyedStream.reduce`` does; the first row of a key is its first aggregate.
    On the disk backend a batch reads its keys' aggregates with one multi-get and
    writes them back with one write batch.
    """

    supports_disk_state = True

    def __init__(self, name: str, fn: Callable[[dict, dict], dict], keys: KeySelector, *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name, keys)
        self.fn = fn
        self.schema = schema

    def open(self) -> None:
        self.accumulated = self.backend.value_state("reduce")

    def process_batch(self, batch, input_index=0):
        if hasattr(self.accumulated, "values_at"):
            return self._process_batch_vectorized(batch)
        fn, state = self.fn, self.accumulated
        out = []
        for key, row in self.keyed_rows(batch):
            previous = state.value()
            if previous is not None:
                row = self._reduce(fn, previous, row, key)
            state.update(row)
            out.append(capture_row(row))
        emit_rows(self, out, self.schema)

    def _reduce(self, fn: Callable[[dict, dict], dict], previous: dict, row: dict,
                key: Any) -> dict:
        row = call_user(fn, previous, row)
        if type(row) is not dict and not isinstance(row, Mapping):  # typing.Mapping is slow
            raise BadRecordError(f"reduce '{self.name}' must return a dict, got "
                                 f"{type(row).__name__} for key {key!r}: "
                                 f"{describe_record(row)}")
        return row

    def _process_batch_vectorized(self, batch: pa.RecordBatch) -> None:
        """One multi-get for the batch's distinct keys, the rows folded in order in
        Python, one write batch of the keys' last aggregates."""
        # process_batch comes here when the state has values_at (the disk backend's)
        fn, state = self.fn, cast(_BatchValueState, self.accumulated)
        distinct = self.keys.distinct_keys(batch, self.ctx.max_parallelism)
        keys = distinct.keys
        stored = state.entry_keys(keys, distinct.groups)  # encoded once
        current = state.values_at(stored)
        out = []
        for i, row in zip(distinct.inverse.tolist(), batch.to_pylist()):
            previous = current[i]
            if previous is not None:
                row = self._reduce(fn, previous, row, keys[i])
            current[i] = row
            out.append(capture_row(row))
        state.update_at(stored, current)
        emit_rows(self, out, self.schema)
