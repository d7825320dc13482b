"""Broadcast state (Flink's ``BroadcastProcessFunction`` / ``KeyedBroadcastProcessFunction``).

``stream.connect(rules.broadcast(descriptor)).process(fn)``: every subtask of the
operator receives *every* row of ``rules`` (the second input, broadcast
partitioning) and its share of ``stream`` (the first input: by key when
``stream`` is keyed, else forward or round-robin). ``fn.process_broadcast_element``
sees the broadcast state -- a dict per :class:`MapStateDescriptor`, the same in
every subtask because every subtask processes the same broadcast rows -- and may
change it; ``fn.process_element`` sees it read-only (plus, in the keyed variant,
keyed state and timers of the row's key). There is no order between the two
inputs: a data row may arrive before or after a broadcast row sent "earlier"; to
apply rules by event time, buffer rows in keyed state and act in ``on_timer``
once the watermark (the minimum over both inputs) has passed them.

Each subtask checkpoints its copy of the broadcast state (serialized in the
synchronous part: broadcast state is meant to be small). On restore, at any
parallelism, subtask ``i`` takes the copy of old subtask ``i mod old
parallelism``: all copies are equal (Flink does the same).

    >>> import raystream as rs
    >>> THRESHOLDS = rs.MapStateDescriptor("thresholds")
    >>> class Alert(rs.KeyedBroadcastProcessFunction):
    ...     def process_broadcast_element(self, rule, ctx):
    ...         ctx.get_broadcast_state(THRESHOLDS).put(rule["sensor"], rule["max"])
    ...     def process_element(self, reading, ctx):
    ...         limit = ctx.get_broadcast_state(THRESHOLDS).get(ctx.current_key)
    ...         if limit is not None and reading["v"] > limit:
    ...             yield {"sensor": ctx.current_key, "v": reading["v"]}
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> readings = env.from_collection([{"sensor": "a", "v": 9}])
    >>> rules = env.from_collection([{"sensor": "a", "max": 5}])
    >>> alerts = readings.key_by("sensor").connect(rules.broadcast(THRESHOLDS)).process(Alert())
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

import pyarrow as pa

from raystream.actors.messages import MIN_WATERMARK
from raystream.engine.batches import capture_row, rows_to_batch
from raystream.engine.keys import KeySelector
from raystream.actors.operator import Operator, OperatorSnapshot, RestoredState
from raystream.engine.operators.functions import call_user, close_function, emit_rows
from raystream.engine.operators.keyed import KeyedContext, KeyedProcessOperator

__all__ = ["BroadcastContext", "BroadcastProcessFunction", "BroadcastState",
           "KeyedBroadcastContext", "KeyedBroadcastProcessFunction", "KeyedReadOnlyContext",
           "MapStateDescriptor", "ReadOnlyBroadcastState", "ReadOnlyContext"]


@dataclass(frozen=True)
class MapStateDescriptor:
    """Names one broadcast state: a dict replicated to every subtask.

        >>> MapStateDescriptor("rules")
        MapStateDescriptor(name='rules')
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"MapStateDescriptor: name must be a non-empty string, "
                             f"got {self.name!r}")


class ReadOnlyBroadcastState:
    """A broadcast state as ``process_element`` sees it. Values are the stored
    objects: do not mutate them here (every subtask must keep the same state)."""

    __slots__ = ("_d", "name")

    def __init__(self, name: str, d: dict) -> None:
        self.name, self._d = name, d

    def get(self, key: Any, default: Any = None) -> Any:
        return self._d.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._d

    def keys(self) -> list:
        return list(self._d)

    def values(self) -> list:
        return list(self._d.values())

    def items(self) -> list:
        return list(self._d.items())

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self._d)} entries)"


class BroadcastState(ReadOnlyBroadcastState):
    """A broadcast state as ``process_broadcast_element`` sees it: readable and writable.
    Change it only as a function of the broadcast rows (not of the subtask, the time
    or data rows), so that every subtask's copy stays equal."""

    __slots__ = ()

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value

    def put_all(self, mapping: dict) -> None:
        self._d.update(mapping)

    def remove(self, key: Any) -> None:
        self._d.pop(key, None)

    def clear(self) -> None:
        self._d.clear()


class _BroadcastStates:
    """The broadcast states of one subtask, by descriptor name; snapshot and restore."""

    def __init__(self, operator: str, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        self.operator = operator
        self.states: dict[str, dict] = {d.name: {} for d in descriptors}

    def view(self, descriptor: MapStateDescriptor, writable: bool) -> ReadOnlyBroadcastState:
        name = descriptor.name if isinstance(descriptor, MapStateDescriptor) else None
        if name not in self.states:
            raise KeyError(f"operator '{self.operator}': no broadcast state {descriptor!r}; "
                           f"declare it in broadcast(...) (declared: {sorted(self.states)})")
        return (BroadcastState if writable else ReadOnlyBroadcastState)(name, self.states[name])

    def snapshot(self) -> Callable[[], bytes]:
        data = pickle.dumps(self.states, protocol=5)  # now: later changes must not show
        return lambda: data

    def restore(self, restored: RestoredState | None, subtask_index: int) -> None:
        blobs = [b for b in (restored.operator_states if restored else []) if b]
        if not blobs:
            return
        old = pickle.loads(blobs[subtask_index % len(blobs)])  # all copies are equal
        for name, d in old.items():
            if name in self.states:  # a descriptor the job no longer declares is dropped
                self.states[name] = d


_Op = TypeVar("_Op", "BroadcastProcessOperator", "KeyedBroadcastProcessOperator")


class _OperatorView(Generic[_Op]):
    """The operator's watermark, subtask and clock, as both broadcast-side contexts (keyed
    and not) show them."""

    def __init__(self, operator: _Op) -> None:
        self._operator = operator

    @property
    def current_watermark(self) -> int:
        return self._operator.current_watermark

    @property
    def subtask_index(self) -> int:
        return self._operator.ctx.subtask_index

    current_processing_time = staticmethod(KeyedContext.current_processing_time)


class ReadOnlyContext(_OperatorView["BroadcastProcessOperator"]):
    """What ``BroadcastProcessFunction.process_element`` sees: broadcast state read-only,
    side outputs, the operator's watermark and where it runs."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return self._operator.broadcast.view(descriptor, writable=False)

    def output(self, tag: str, row: dict) -> None:
        """Emit ``row`` on side output ``tag`` (``stream.side_output(tag)``)."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"a side output tag is a non-empty string, got {tag!r}")
        self._operator.side_rows.setdefault(tag, []).append(capture_row(row))


class BroadcastContext(ReadOnlyContext):
    """What ``process_broadcast_element`` sees: broadcast state writable."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return self._operator.broadcast.view(descriptor, writable=True)  # type: ignore[return-value]


class KeyedReadOnlyContext(KeyedContext):
    """What ``KeyedBroadcastProcessFunction.process_element``, ``on_timer`` and ``open``
    see: a :class:`~raystream.KeyedContext` (keyed state, timers) plus broadcast state,
    read-only."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return self._operator.broadcast.view(descriptor, writable=False)  # type: ignore[attr-defined]


class KeyedBroadcastContext(_OperatorView["KeyedBroadcastProcessOperator"]):
    """What ``KeyedBroadcastProcessFunction.process_broadcast_element`` sees: broadcast
    state writable, side outputs, and :meth:`apply_to_keyed_state`. A broadcast row
    has no key: keyed state and timers are not available here."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return self._operator.broadcast.view(descriptor, writable=True)  # type: ignore[return-value]

    def output(self, tag: str, row: dict) -> None:
        self._operator.keyed_ctx.output(tag, row)

    def apply_to_keyed_state(self, state: Any, function: Callable[[Any, Any], None]) -> None:
        """Call ``function(key, state)`` for every key of this subtask that has a value
        in ``state`` (a handle made in ``open``), with ``state`` scoped to that key."""
        backend = self._operator.backend
        for key in list(backend.keys(state.name)):
            backend.set_current_key(key)
            function(key, state)


class BroadcastProcessFunction:
    """Base class for a non-keyed stream connected to a broadcast stream: override
    ``process_element`` (rows of the stream, broadcast state read-only) and
    ``process_broadcast_element`` (rows of the broadcast stream, state writable).

        >>> class Tag(BroadcastProcessFunction):
        ...     def process_broadcast_element(self, row, ctx):
        ...         ctx.get_broadcast_state(MapStateDescriptor("tags")).put("tag", row["tag"])
        ...     def process_element(self, row, ctx):
        ...         yield {**row, "tag": ctx.get_broadcast_state(MapStateDescriptor("tags")).get("tag")}
    """

    def open(self, ctx: ReadOnlyContext) -> None:
        pass

    def process_element(self, row: dict, ctx: ReadOnlyContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def process_broadcast_element(self, row: dict,
                                  ctx: BroadcastContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement "
                                  f"process_broadcast_element")

    def close(self) -> None:
        pass


class KeyedBroadcastProcessFunction:
    """Base class for a keyed stream connected to a broadcast stream: as
    :class:`BroadcastProcessFunction`, and ``process_element``/``on_timer`` have the
    row's keyed state and timers (``ctx`` is a :class:`KeyedReadOnlyContext`);
    ``process_broadcast_element`` may visit keyed state with
    ``ctx.apply_to_keyed_state``. See the module docstring for an example."""

    def open(self, ctx: KeyedReadOnlyContext) -> None:
        """Create keyed state handles here; they follow the current key."""

    def process_element(self, row: dict, ctx: KeyedReadOnlyContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def process_broadcast_element(self, row: dict,
                                  ctx: KeyedBroadcastContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement "
                                  f"process_broadcast_element")

    def on_timer(self, timestamp: int, ctx: KeyedReadOnlyContext) -> Iterable[dict] | None:
        """A timer of ``ctx.current_key`` fired (``ctx.time_domain`` says which clock)."""

    def close(self) -> None:
        pass


def _rows(process: Callable, rows: list[dict], ctx: Any) -> list[Any]:
    """What ``process(row, ctx)`` returns or yields, over ``rows``."""
    out: list[Any] = []
    for row in rows:
        produced = call_user(process, row, ctx)
        if produced is not None:
            out.extend(map(capture_row, produced))
    return out


class BroadcastProcessOperator(Operator):
    """Runs a :class:`BroadcastProcessFunction`: input 0 is the data, input 1 the
    broadcast rows. Its watermark is the minimum over both inputs (the subtask's)."""

    def __init__(self, name: str, fn: BroadcastProcessFunction,
                 descriptors: tuple[MapStateDescriptor, ...], *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name)
        self.fn, self.schema = fn, schema
        self.broadcast = _BroadcastStates(name, descriptors)
        self.current_watermark = MIN_WATERMARK
        self.side_rows: dict[str, list[dict]] = {}  # ctx.output() since the last emit

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.broadcast.restore(restored, self.ctx.subtask_index)

    def open(self) -> None:
        self.read_ctx, self.write_ctx = ReadOnlyContext(self), BroadcastContext(self)
        self.fn.open(self.read_ctx)

    def close(self) -> None:
        close_function(self.fn)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if input_index == 0:
            out = _rows(self.fn.process_element, batch.to_pylist(), self.read_ctx)
        else:
            out = _rows(self.fn.process_broadcast_element, batch.to_pylist(),
                        self.write_ctx)
        emit_rows(self, out, self.schema)
        side, self.side_rows = self.side_rows, {}
        for tag, tagged in side.items():
            self.emit_side(tag, rows_to_batch(
                tagged, schema=None, where=f"side output {tag!r} of operator '{self.name}'"))

    def process_watermark(self, watermark: int) -> None:
        self.current_watermark = max(self.current_watermark, watermark)
        self.output.emit_watermark(watermark)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        return OperatorSnapshot(operator_state=self.broadcast.snapshot())


class KeyedBroadcastProcessOperator(KeyedProcessOperator):
    """Runs a :class:`KeyedBroadcastProcessFunction`: input 0 is keyed by ``keys``
    (keyed state and timers as in :class:`KeyedProcessOperator`, snapshotted per key
    group), input 1 the broadcast rows."""

    def __init__(self, name: str, fn: KeyedBroadcastProcessFunction, keys: KeySelector,
                 descriptors: tuple[MapStateDescriptor, ...], *,
                 schema: pa.Schema | None = None) -> None:
        if not isinstance(fn, KeyedBroadcastProcessFunction):
            raise TypeError(f"operator '{name}': a keyed stream connected to a broadcast "
                            f"stream needs a rs.KeyedBroadcastProcessFunction, got "
                            f"{type(fn).__name__}")
        super().__init__(name, fn, keys, schema=schema)  # type: ignore[arg-type]
        self.broadcast = _BroadcastStates(name, descriptors)

    def initialize_state(self, restored: RestoredState | None) -> None:
        super().initialize_state(restored)
        self.broadcast.restore(restored, self.ctx.subtask_index)

    def open(self) -> None:
        self.keyed_ctx = KeyedReadOnlyContext(self.ctx, self)
        self.broadcast_ctx = KeyedBroadcastContext(self)
        self.fn.open(self.keyed_ctx)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if input_index == 0:
            super().process_batch(batch)
            return
        self.keyed_ctx.time_domain = None
        fn: Any = self.fn
        self._emit(_rows(fn.process_broadcast_element, batch.to_pylist(),
                         self.broadcast_ctx))

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        snapshot = super().snapshot_state(checkpoint_id)
        snapshot.operator_state = self.broadcast.snapshot()
        return snapshot
