"""Two-input keyed processing (Flink's ``KeyedCoProcessFunction`` / ``KeyedCoProcessOperator``).

``a.key_by(k).connect(b.key_by(k)).process(fn)``: rows of the first input go to
``fn.process_element1``, rows of the second to ``fn.process_element2``. Both see
the same keyed state and timers (one key space, the key groups both inputs were
partitioned by), and ``on_timer`` fires for either. The operator is a
:class:`~raystream.engine.operators.keyed.KeyedProcessOperator` with one key
selector per input, so state, timers, side outputs, snapshots per key group,
rescaling and watermark floors are the one-input operator's. Its watermark is
the minimum over the channels of both inputs (the subtask computes it).

    >>> import raystream as rs
    >>> class Enrich(rs.KeyedCoProcessFunction):
    ...     def open(self, ctx):
    ...         self.name = ctx.value_state("name")
    ...     def process_element1(self, order, ctx):  # orders
    ...         yield {"user": ctx.current_key, "amount": order["amount"], "name": self.name.value()}
    ...     def process_element2(self, user, ctx):   # user profiles
    ...         self.name.update(user["name"])
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> orders = env.from_collection([{"user": 1, "amount": 5.0}])
    >>> users = env.from_collection([{"id": 1, "name": "ann"}])
    >>> enriched = orders.key_by("user").connect(users.key_by("id")).process(Enrich())
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from raystream.engine.batches import capture_row
from raystream.engine.keys import KeySelector
from raystream.engine.operators.functions import call_user
from raystream.engine.operators.keyed import KeyedContext, KeyedProcessOperator


class KeyedCoProcessFunction:
    """Base class of two-input keyed functions: override ``process_element1`` (rows of
    the first stream), ``process_element2`` (rows of the second) and, if needed,
    ``open``, ``on_timer``, ``close``. ``ctx`` is a :class:`~raystream.KeyedContext`:
    state and timers of the current key, shared by both inputs; ``ctx.output(tag, row)``.

        >>> import raystream as rs
        >>> class LastSeen(rs.KeyedCoProcessFunction):
        ...     def open(self, ctx):
        ...         self.seen = ctx.value_state("seen", default=0)
        ...     def process_element1(self, row, ctx):
        ...         self.seen.update(self.seen.value() + 1)
        ...     def process_element2(self, row, ctx):
        ...         yield {"key": ctx.current_key, "seen": self.seen.value()}
        >>> LastSeen().on_timer(0, None) is None
        True
    """

    def open(self, ctx: KeyedContext) -> None:
        """Create state handles here; they follow the current key."""

    def process_element1(self, row: dict, ctx: KeyedContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element1")

    def process_element2(self, row: dict, ctx: KeyedContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element2")

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[dict] | None:
        """A timer of ``ctx.current_key`` fired (``ctx.time_domain`` says which clock),
        whichever input registered it."""

    def close(self) -> None:
        pass


class KeyedCoProcessOperator(KeyedProcessOperator):
    """Runs a :class:`KeyedCoProcessFunction`; input ``i`` is keyed by ``keys[i]``.

    Everything but the per-input dispatch is :class:`KeyedProcessOperator`'s: the
    two selectors must give equal keys for rows that belong together (the same
    values and types, so the same key groups), as the partitioner of each input
    used them.
    """

    def __init__(self, name: str, fn: KeyedCoProcessFunction,
                 keys: tuple[KeySelector, KeySelector], *,
                 schema: pa.Schema | None = None) -> None:
        if not isinstance(fn, KeyedCoProcessFunction):
            raise TypeError(f"operator '{name}': connect(...).process needs a "
                            f"rs.KeyedCoProcessFunction for keyed streams, got "
                            f"{type(fn).__name__}")
        super().__init__(name, fn, keys[0], schema=schema)  # type: ignore[arg-type]
        self.input_keys = keys

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        fn: Any = self.fn
        process = fn.process_element1 if input_index == 0 else fn.process_element2
        ctx, out = self.keyed_ctx, []
        ctx.time_domain = None
        for _key, row in self.keyed_rows(batch, self.input_keys[input_index]):
            produced = call_user(process, row, ctx)
            if produced is not None:
                out.extend(map(capture_row, produced))
        self._emit(out)
