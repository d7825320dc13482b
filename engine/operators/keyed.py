"""Keyed operators: user functions with per-key state (Flink's ``KeyedProcessFunction``).

State lives in a :class:`~raystream.checkpoint.state.KeyedStateBackend` that
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

from typing import Any, Callable, Iterable, Mapping

import pyarrow as pa

from raystream.checkpoint.keygroups import key_group_range
from raystream.checkpoint.state import AggregateFunction, KeyedStateBackend
from raystream.engine.errors import BadRecordError, describe_record
from raystream.engine.keys import KeySelector
from raystream.engine.operators.base import (Operator, OperatorSnapshot, RestoredState,
                                             RuntimeContext)
from raystream.engine.operators.functions import _call, _close_function, emit_rows


class KeyedContext:
    """What a keyed function sees: the current key, keyed state, and where it runs."""

    def __init__(self, runtime: RuntimeContext, backend: KeyedStateBackend) -> None:
        self.runtime = runtime
        self._backend = backend

    @property
    def current_key(self) -> Any:
        return self._backend.current_key

    @property
    def subtask_index(self) -> int:
        return self.runtime.subtask_index

    def value_state(self, name: str, default: Any = None):
        """One value per key (``value()``, ``update(v)``, ``clear()``)."""
        return self._backend.value_state(name, default)

    def list_state(self, name: str):
        """A list per key (``get()``, ``add(v)``, ``add_all(vs)``, ``update(vs)``, ``clear()``)."""
        return self._backend.list_state(name)

    def map_state(self, name: str):
        """A dict per key (``get``, ``put``, ``remove``, ``contains``, ``items``, ...)."""
        return self._backend.map_state(name)

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any]):
        """A value per key folded with ``reduce`` on every ``add``."""
        return self._backend.reducing_state(name, reduce)

    def aggregating_state(self, name: str, aggregate: AggregateFunction):
        """An accumulator per key driven by an :class:`AggregateFunction`."""
        return self._backend.aggregating_state(name, aggregate)


class KeyedProcessFunction:
    """Base class for keyed functions: override ``process_element`` (and ``open``)."""

    def open(self, ctx: KeyedContext) -> None:
        """Create state handles here; they follow the current key."""

    def process_element(self, row: dict, ctx: KeyedContext) -> Iterable[dict] | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _KeyedOperator(Operator):
    """An operator with a keyed state backend over its subtask's key-group range."""

    def __init__(self, name: str, keys: KeySelector) -> None:
        super().__init__(name)
        self.keys = keys

    def initialize_state(self, restored: RestoredState | None) -> None:
        ctx = self.ctx
        self.backend = KeyedStateBackend(
            max_parallelism=ctx.max_parallelism,
            key_groups=key_group_range(ctx.subtask_index, ctx.parallelism, ctx.max_parallelism))
        if restored is not None:
            self.backend.restore(restored.keyed_sections)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        return OperatorSnapshot(keyed_state=self.backend.snapshot())

    def keyed_rows(self, batch: pa.RecordBatch):
        """(key, row) per row, with the backend's current key set to it."""
        keys, groups = self.keys.keys_and_groups(batch, self.ctx.max_parallelism)
        backend = self.backend
        for key, group, row in zip(keys, groups.tolist(), batch.to_pylist()):
            backend.set_current_key(key, group)
            yield key, row


class KeyedProcessOperator(_KeyedOperator):
    def __init__(self, name: str, fn: KeyedProcessFunction, keys: KeySelector, *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name, keys)
        self.fn = fn
        self.schema = schema

    def open(self) -> None:
        self.keyed_ctx = KeyedContext(self.ctx, self.backend)
        self.fn.open(self.keyed_ctx)

    def close(self) -> None:
        _close_function(self.fn)

    def process_batch(self, batch, input_index=0):
        out: list[Any] = []
        process, ctx = self.fn.process_element, self.keyed_ctx
        for _key, row in self.keyed_rows(batch):
            produced = _call(process, row, ctx)
            if produced is not None:
                out.extend(produced)
        emit_rows(self, out, self.schema)


class ReduceOperator(_KeyedOperator):
    """Keyed running aggregate: ``fn(accumulated: dict, row: dict) -> dict`` per key.

    Emits the updated aggregate for every incoming row, as Flink's
    ``KeyedStream.reduce`` does; the first row of a key is its first aggregate.
    """

    def __init__(self, name: str, fn: Callable[[dict, dict], dict], keys: KeySelector, *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name, keys)
        self.fn = fn
        self.schema = schema

    def open(self) -> None:
        self.accumulated = self.backend.value_state("reduce")

    def process_batch(self, batch, input_index=0):
        fn, state = self.fn, self.accumulated
        out = []
        for key, row in self.keyed_rows(batch):
            previous = state.value()
            if previous is not None:
                row = _call(fn, previous, row)
                if not isinstance(row, Mapping):
                    raise BadRecordError(f"reduce '{self.name}' must return a dict, got "
                                         f"{type(row).__name__} for key {key!r}: "
                                         f"{describe_record(row)}")
            state.update(row)
            out.append(row)
        emit_rows(self, out, self.schema)
