"""The operator contract and the plumbing that chains operators in one subtask.

The subtask actor runs operators, so the runtime defines what it runs (as Flink's
``StreamOperator`` lives with its task runtime): :class:`Operator`, and its two
kinds the subtask treats apart, :class:`SourceOperator` (a chain head the
subtask asks for output) and :class:`SinkOperator` (whose result goes back to the
driver). The engine's operators (``raystream.engine.operators``) implement them.

An operator receives whole ``pyarrow.RecordBatch`` es, watermarks and
end-of-input, and emits batches and watermarks to its :class:`Output`. Every
parallel instance runs inside one subtask actor, chained with its neighbours
(Flink's ``OperatorChain``): a chained hand-over is a plain function call.

Writing a custom operator (used with ``DataStream.transform``):

    >>> import pyarrow as pa
    >>> class AddOne(Operator):
    ...     def process_batch(self, batch, input_index=0):
    ...         self.output.emit(batch.set_column(0, "x", pa.compute.add(batch.column(0), 1)))
    >>> op = AddOne("add-one"); out = CollectingOutput(); op.setup(RuntimeContext.local(), out)
    >>> op.process_batch(pa.record_batch({"x": [1, 2]})); out.batches[0].to_pydict()
    {'x': [2, 3]}
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

import pyarrow as pa

from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK
from raystream.actors.record_writer import DEFAULT_BUFFER_TIMEOUT_MS
from raystream.checkpoint.disk_incremental import IncrementalSnapshot, RestoredDb
from raystream.checkpoint.heap_changelog import Chain, HeapIncrementalSnapshot
from raystream.checkpoint.state_backend import StateBackend, StateBackendChoice

if TYPE_CHECKING:
    from raystream.checkpoint.watermark_floors import WatermarkFloors


@dataclass(frozen=True)
class RuntimeContext:
    """What an operator instance knows about where it runs."""

    job_name: str
    operator_name: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    checkpointing: bool = False
    # this run of the job (a fresh start, a restore from a savepoint): the same across its
    # failovers; empty for an operator run by hand
    job_id: str = ""
    # sends an operator event to this operator's coordinator (None: it has none)
    coordinator_events: Callable[[Any], None] | None = field(default=None, compare=False)
    # where a keyed operator keeps its state (CheckpointConfig.state_backend)
    state_backend: StateBackendChoice = StateBackend.HEAP
    # how long its output may wait to be sent (the job's or its own buffer_timeout_ms; -1:
    # until a buffer is full): an operator that waits for input (a source's poll) or
    # buffers output of its own (a producer's linger) waits no longer than this
    buffer_timeout_ms: float = DEFAULT_BUFFER_TIMEOUT_MS

    def send_event_to_coordinator(self, event: Any) -> None:
        """Send ``event`` (any picklable value) to the operator's coordinator, which gets it
        in ``handle_event_from_subtask(subtask_index, event)``."""
        if self.coordinator_events is None:
            raise RuntimeError(f"operator '{self.operator_name}' has no operator coordinator: "
                               f"give it one with transform(..., coordinator=...) or "
                               f"add_source(..., coordinator=...)")
        self.coordinator_events(event)

    @classmethod
    def local(cls, operator_name: str = "operator") -> "RuntimeContext":
        """A context for running an operator by hand (tests, docs)."""
        return cls("local", operator_name, 0, 1, 128, 0)


@dataclass
class OperatorSnapshot:
    """The synchronous part of one operator's snapshot for a checkpoint.

    Each field is a callable that the subtask runs in its background thread
    (the asynchronous part) and that must return the state *as of the
    synchronous snapshot*, whatever the operator does meanwhile.

    * ``operator_state``: opaque bytes; on restore every subtask gets the
      states of all old subtasks and picks its share (Flink's union state).
    * ``keyed_state``: bytes per key group; on restore every subtask gets the
      key groups of its range.
    * ``make_durable``: output the operator handed over before the barrier
      that must be durable before the checkpoint is acknowledged (a sink
      writer's files, see ``SinkWriter.make_durable``); if it raises, the
      checkpoint is declined.
    """

    operator_state: Callable[[], bytes] | None = None
    keyed_state: Callable[[], dict[int, bytes]] | None = None
    make_durable: Callable[[], None] | None = None
    # the backend's state, when it checkpoints incrementally (the disk backend's database,
    # the heap backend's chain of changes): a checkpoint uploads it (keyed_db.upload)
    # before keyed_state() runs, which then leaves the backend's part out; a savepoint
    # only runs keyed_state(), which writes it whole
    keyed_db: IncrementalSnapshot | HeapIncrementalSnapshot | None = None


@dataclass
class RestoredState:
    """An operator's state from the checkpoint a job restores from."""

    checkpoint_id: int
    operator_states: list[bytes] = field(default_factory=list)
    keyed_sections: Iterable[tuple[int, bytes]] = ()
    # the watermark each key group had reached at the checkpoint (keyed operators judge
    # lateness by it until their own watermark passes it); None: the minimum everywhere
    watermark_floors: "WatermarkFloors | None" = None
    # databases of the disk backend's incremental checkpoints overlapping the subtask's
    # key groups (their keyed state is not in keyed_sections)
    keyed_dbs: list[RestoredDb] = field(default_factory=list)
    # the heap backend's chain of incremental checkpoints that keyed_sections restore
    # whole (a failover at the same key groups): the next checkpoint extends it
    heap_chain: Chain | None = None


class Output(Protocol):
    def emit(self, batch: pa.RecordBatch) -> None: ...

    def emit_watermark(self, watermark: int) -> None: ...


class OperatorFailure(Exception):
    """A user function or operator raised; carries which operator and the original traceback."""

    def __init__(self, operator: str, cause: BaseException) -> None:
        self.operator = operator
        self.cause = cause
        self.traceback = "".join(traceback.format_exception(cause))
        super().__init__(f"operator '{operator}' failed: {type(cause).__name__}: {cause}")


class Operator:
    """Base class of all operators. Subclasses override what they need.

    Defaults: watermarks are forwarded unchanged; nothing is done at the end of
    input.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def setup(self, ctx: RuntimeContext, output: Output, failpoints: Any = None) -> None:
        self.ctx = ctx
        self.output = output
        self.failpoints = failpoints  # the subtask's seeded failpoints (tests), or None

    def open(self) -> None:
        """Called once before the first record."""

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        raise NotImplementedError

    def process_watermark(self, watermark: int) -> None:
        self.output.emit_watermark(watermark)

    def end_input(self, input_index: int = 0) -> None:
        """All channels of input ``input_index`` have ended (Flink ``BoundedMultiInput``)."""

    def finish(self) -> None:
        """All inputs ended: flush what is buffered (Flink ``StreamOperator.finish``)."""

    def handle_operator_event(self, event: Any) -> None:
        """An event from this operator's coordinator. It is handled on the subtask's
        processing thread, before any barrier that arrives after it, so what it changes
        is part of the next snapshot; the operator may emit records here."""
        raise NotImplementedError(f"operator '{self.name}' got an operator event but does not "
                                  f"implement handle_operator_event")

    def close(self) -> None:
        """Release resources; called on success and on failure."""

    def end_attempt(self) -> None:
        """The subtask's attempt is over (after :meth:`close`, whatever the outcome):
        give back memory that an asynchronous checkpoint part still running can do
        without. A new attempt may start in the same process right away."""

    def metrics(self) -> dict[str, float] | None:
        """Figures this operator reports in its subtask's metrics (read while running)."""
        return None

    def waiting_for(self) -> str | None:
        """What this operator waits for before its input can end, in a few words (read
        from another thread while running, for a job that does not finish); None when it
        waits for nothing of its own."""
        return None

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` on side output ``tag`` (a no-op when nothing consumes it)."""
        route = getattr(self.output, "emit_side", None)
        if route is not None:
            route(tag, batch)

    # -- processing time ---------------------------------------------------------------
    def next_processing_time(self) -> int | None:
        """Wall-clock ms of this operator's earliest processing-time timer, or None."""
        return None

    def on_processing_time(self, now_ms: int) -> None:
        """Fire the processing-time timers due at ``now_ms`` (the subtask's clock)."""

    # -- checkpoints (Flink's order: pre-barrier, barrier, snapshot, notify) --
    def initialize_state(self, restored: RestoredState | None) -> None:
        """Called before ``open``; ``restored`` is None on a fresh start."""

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Last chance to emit records that belong before barrier ``checkpoint_id``."""

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        """Synchronous part of the snapshot: cheap, consistent; None if stateless."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is durable: side effects up to it may be committed."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def upstream_restarted(self, upstream: int, attempt: int, checkpoint_id: int) -> None:
        """Upstream subtask ``upstream`` alone was restored to ``checkpoint_id`` as
        ``attempt`` (a region failover) while this operator runs on: what its failed
        attempt sent after that checkpoint will be sent again by ``attempt``. Only an
        operator that can drop it survives (an exactly-once sink's committer)."""
        raise NotImplementedError(f"operator '{self.name}' cannot outlive a restart of its "
                                  f"upstream")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SourceOperator(Operator):
    """A chain head without input: the subtask asks it for output.

    The subtask calls :meth:`emit_next` whenever the operator :meth:`is_available`
    and its output has credit, and ends the input when ``emit_next`` returns False.
    A source that waits for something (an operator event with a split, a file to
    appear) says so with ``is_available() == False``; the subtask then sleeps until
    a control message (an operator event) or a short poll wakes it.

    A source of its own (used with ``StreamEnvironment.add_source``):

        >>> import pyarrow as pa
        >>> class Countdown(SourceOperator):
        ...     def open(self): self.left = 3
        ...     def emit_next(self):
        ...         if self.left == 0: return False
        ...         self.output.emit(pa.record_batch({"n": [self.left]})); self.left -= 1
        ...         return True
        >>> op = Countdown("countdown"); out = CollectingOutput()
        >>> op.setup(RuntimeContext.local(), out)
        >>> op.open(); [op.emit_next() for _ in range(4)], [b["n"][0].as_py() for b in out.batches]
        ([True, True, True, False], [3, 2, 1])
    """

    def process_batch(self, batch, input_index=0):
        raise RuntimeError(f"source '{self.name}' has no input")

    def is_available(self) -> bool:
        """False while the source has nothing to emit now (it waits for an event or
        for data to appear); the subtask then waits instead of calling emit_next."""
        return True

    def emit_next(self) -> bool:
        """Emit what is next (a batch, or nothing yet); False once the input has ended."""
        raise NotImplementedError

    def caught_up(self) -> bool:
        """True when the last ``emit_next`` found nothing new to read (a live source
        that has caught up with its input): the subtask then sends its buffered output
        at once, as an idle subtask does, rather than hold it while the source waits."""
        return False

    def end_input_early(self) -> None:
        """Stop-with-savepoint with drain: stop reading and advance event time to the end."""
        self.output.emit_watermark(MAX_WATERMARK)

    @property
    def emitted_watermark(self) -> int:
        """The watermark it emitted last (its subtask's, in the metrics: a source has no
        input watermark); MIN_WATERMARK if it does not say."""
        return MIN_WATERMARK


class CountsReadRows:
    """A source's count of the rows it read in this attempt. Its subtask hands the count
    at each barrier to the checkpoint (``SnapshotStats.records_read``), so the job knows
    how many rows it had read at the checkpoint a restore goes back to."""

    records_read: int = 0


class CountsWrittenRows:
    """A data sink's count of the rows it took, which its subtask's metrics carry as
    ``<operator>.records_written`` (a job's rows written, in its progress). Call
    :meth:`counted` from ``process_batch``."""

    records_written: int = 0

    def counted(self, batch: pa.RecordBatch) -> None:
        self.records_written += batch.num_rows

    def metrics(self) -> dict[str, float] | None:
        return {"records_written": float(self.records_written)}


class SinkOperator(Operator):
    """A sink emits nothing downstream; ``final_result()`` goes back to the driver."""

    def process_watermark(self, watermark: int) -> None:
        pass

    def final_result(self) -> object | None:
        return None


class ChainedOutput:
    """Hands batches to the next operator of the chain, tagging failures with its name."""

    def __init__(self, operator: Operator, input_index: int = 0) -> None:
        self.operator = operator
        self.input_index = input_index

    def emit(self, batch: pa.RecordBatch) -> None:
        try:
            self.operator.process_batch(batch, self.input_index)
        except OperatorFailure:
            raise
        except Exception as exc:
            raise OperatorFailure(self.operator.name, exc) from exc

    def emit_watermark(self, watermark: int) -> None:
        try:
            self.operator.process_watermark(watermark)
        except OperatorFailure:
            raise
        except Exception as exc:
            raise OperatorFailure(self.operator.name, exc) from exc


class BroadcastingOutput:
    """Output to several targets (chained operators and network writers)."""

    def __init__(self, targets: list[Output]) -> None:
        self.targets = targets

    def emit(self, batch: pa.RecordBatch) -> None:
        for target in self.targets:
            target.emit(batch)

    def emit_watermark(self, watermark: int) -> None:
        for target in self.targets:
            target.emit_watermark(watermark)


class RoutingOutput:
    """An operator's main output plus its side outputs by tag; watermarks go to all."""

    def __init__(self, main: Output, sides: dict[str, Output]) -> None:
        self.main = main
        self.sides = sides

    def emit(self, batch: pa.RecordBatch) -> None:
        self.main.emit(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        side = self.sides.get(tag)
        if side is not None:
            side.emit(batch)

    def emit_watermark(self, watermark: int) -> None:
        self.main.emit_watermark(watermark)
        for side in self.sides.values():
            side.emit_watermark(watermark)


class CollectingOutput:
    """An output that keeps what it gets (for running operators by hand)."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.side_batches: dict[str, list[pa.RecordBatch]] = {}
        self.watermarks: list[int] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self.side_batches.setdefault(tag, []).append(batch)

    def emit_watermark(self, watermark: int) -> None:
        self.watermarks.append(watermark)


def call_operator(operator: Operator, method: str, *args):
    """Return ``operator.method(*args)``, tagging a failure with the operator's name."""
    try:
        return getattr(operator, method)(*args)
    except OperatorFailure:
        raise
    except Exception as exc:
        raise OperatorFailure(operator.name, exc) from exc
