"""Split enumerators: which source subtask reads which split (Flink FLIP-27 ``SplitEnumerator``).

A source's enumerator runs in the job master as its operator coordinator
(:class:`SourceCoordinator`). Each source subtask (the *reader*,
:class:`~raystream.engine.operators.source.SourceReaderOperator`) registers
when it opens, asks for splits when it has none, and checkpoints its splits
with their positions; the enumerator hands out splits with
``context.assign_split`` and checkpoints the ones not handed out yet. The
subtask gateways make the two consistent: a split is in the enumerator's
checkpoint *or* in one reader's, never both and never neither, so on
failover every split is read exactly once.

Splits and enumerator state must be JSON values (strings, numbers, lists,
dicts): they are written into checkpoints as JSON, never pickled.

Writing an enumerator (this one hands out ``"a"``, ``"b"``, ``"c"`` to
whoever asks first, then tells readers there is no more):

    >>> class Letters(SplitEnumerator):
    ...     def __init__(self, context, state):
    ...         self.context, self.left = context, state if state is not None else ["a", "b", "c"]
    ...     def handle_split_request(self, subtask):
    ...         if self.left:
    ...             self.context.assign_split(self.left.pop(0), subtask)
    ...         else:
    ...             self.context.signal_no_more_splits(subtask)
    ...     def snapshot_state(self, checkpoint_id):
    ...         return list(self.left)

A :class:`~raystream.engine.sources.base.Source` returns it from
``create_enumerator(context, state)``; by default a source's fixed
``splits()`` are handed out by :class:`StaticSplitEnumerator`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from raystream.checkpoint.operator_coordinator import OperatorCoordinator
from raystream.engine.sources.assignment_tracker import SplitAssignmentTracker

if TYPE_CHECKING:
    from raystream.engine.sources.base import Source

# -- events between a reader and its enumerator's coordinator ----------------------------------
@dataclass(frozen=True)
class ReaderRegistered:
    """Reader -> enumerator: the reader is open (with the splits it restored, if any)."""


@dataclass(frozen=True)
class SplitRequested:
    """Reader -> enumerator: the reader has read its splits and wants more."""


@dataclass(frozen=True)
class SplitsAssigned:
    """Enumerator -> reader: read these (JSON values, started together)."""

    splits: tuple[Any, ...]


@dataclass(frozen=True)
class NoMoreSplits:
    """Enumerator -> reader: none will come; end once the splits held are read."""


@dataclass(frozen=True)
class SourceEvent:
    """A custom event either way: ``send_event_to_reader`` / ``handle_source_event``."""

    payload: Any


ReaderEvent = ReaderRegistered | SplitRequested | SourceEvent  # what a reader sends
EnumeratorEvent = SplitsAssigned | NoMoreSplits | SourceEvent  # what an enumerator sends


class SplitEnumeratorContext(Protocol):
    """What an enumerator can do."""

    parallelism: int

    def registered_readers(self) -> set[int]:
        """The source subtasks of the current attempt that have registered."""
        ...

    def assign_split(self, split: Any, subtask: int) -> None:
        """Give ``split`` to a registered reader."""

    def assign_splits(self, splits: list[Any], subtask: int) -> None:
        """Give several splits to a reader at once: it starts reading them together
        (so per-split watermarks hold back for every one of them)."""

    def signal_no_more_splits(self, subtask: int) -> None:
        """Tell a reader no split will come: it ends once its splits are read."""

    def send_event_to_reader(self, subtask: int, event: Any) -> None:
        """A custom event, to the reader's ``handle_source_event``."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the job master's event thread after ``delay_s`` seconds."""

    def call_async(self, work: Callable[[], Any],
                   handler: Callable[[Any, BaseException | None], None]) -> None:
        """Run ``work`` on a worker thread, then ``handler(result, error)`` on the event
        thread (Flink ``SplitEnumeratorContext.callAsync``): for blocking discovery."""


class SplitEnumerator:
    """Base class of split enumerators. Created by ``Source.create_enumerator(context,
    state)`` with the state of the checkpoint the job restores (None at the start)."""

    def start(self) -> None:
        """Called once (and again after each failover, on the restored enumerator)."""

    def add_reader(self, subtask: int) -> None:
        """Reader ``subtask`` registered (at its start, and after each failover)."""

    def handle_split_request(self, subtask: int) -> None:
        """Reader ``subtask`` has no split left to read."""

    def handle_source_event(self, subtask: int, event: Any) -> None:
        """A custom event from reader ``subtask``."""

    def add_splits_back(self, splits: list[Any], subtask: int) -> None:
        """Reader ``subtask`` alone was restored to a checkpoint that does not hold
        ``splits`` (handed to it after that checkpoint, maybe none): hand them out again
        (Flink ``SplitEnumerator.addSplitsBack``) and forget what the reader's failed
        attempt asked for. The reader registers again afterwards. An
        enumerator without it makes every failover of its job global."""
        raise NotImplementedError

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """The splits not handed out yet (and anything else to restore), as JSON."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> None:
        pass


class StaticSplitEnumerator(SplitEnumerator):
    """Hands a fixed list of splits out as soon as readers register: split ``k`` to
    reader ``k mod parallelism`` (so every reader reads its splits side by side and
    per-split watermarks stay fair), then signals that no more will come. Its state
    is the ``[k, split]`` pairs not handed out yet."""

    def __init__(self, context: SplitEnumeratorContext, splits: list[Any],
                 state: Any | None = None) -> None:
        self.context = context
        self.unassigned: list[list[Any]] = (
            [[k, split] for k, split in enumerate(splits)] if state is None else list(state))

    def add_reader(self, subtask: int) -> None:
        p = self.context.parallelism
        mine = [split for k, split in self.unassigned if k % p == subtask]
        self.unassigned = [[k, split] for k, split in self.unassigned if k % p != subtask]
        if mine:
            self.context.assign_splits(mine, subtask)
        self.context.signal_no_more_splits(subtask)

    def add_splits_back(self, splits: list[Any], subtask: int) -> None:
        # numbered ``subtask`` (< parallelism): they go to the same reader when it registers
        self.unassigned.extend([subtask, split] for split in splits)

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return self.unassigned


class SourceCoordinator(OperatorCoordinator):
    """Runs a source's :class:`SplitEnumerator` as its operator coordinator."""

    def __init__(self, context: Any, source: "Source") -> None:
        self.context = context
        self.source = source
        self.gateways: dict[int, Any] = {}
        self.registered: set[int] = set()
        self.enumerator: SplitEnumerator | None = None
        self.assignments = SplitAssignmentTracker()

    # -- the enumerator's context --------------------------------------------------------------
    @property
    def parallelism(self) -> int:
        return self.context.parallelism

    def registered_readers(self) -> set[int]:
        return set(self.registered)

    def assign_split(self, split: Any, subtask: int) -> None:
        self.assign_splits([split], subtask)

    def assign_splits(self, splits: list[Any], subtask: int) -> None:
        values = [_json_value(split, "a split") for split in splits]
        self._send(subtask, SplitsAssigned(tuple(values)))
        self.assignments.assigned(subtask, values)

    def signal_no_more_splits(self, subtask: int) -> None:
        self._send(subtask, NoMoreSplits())

    def send_event_to_reader(self, subtask: int, event: Any) -> None:
        self._send(subtask, SourceEvent(event))

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.context.call_later(delay_s, callback)

    def call_async(self, work: Callable[[], Any],
                   handler: Callable[[Any, BaseException | None], None]) -> None:
        self.context.call_async(work, handler)

    def _send(self, subtask: int, event: EnumeratorEvent) -> None:
        if subtask not in self.registered:
            raise RuntimeError(f"source '{self.context.operator_name}': subtask {subtask} has "
                               f"not registered (registered: {sorted(self.registered)})")
        self.gateways[subtask].send_event(event)

    # -- the operator coordinator ---------------------------------------------------------------
    def start(self) -> None:
        if self.enumerator is None:
            self._create(None)

    def _create(self, state: Any | None) -> None:
        if self.enumerator is not None:
            self.enumerator.close()
        enumerator: SplitEnumerator = self.source.create_enumerator(self, state)
        self.enumerator = enumerator
        enumerator.start()

    def _started(self) -> SplitEnumerator:
        if self.enumerator is None:
            raise RuntimeError(f"source '{self.context.operator_name}': its enumerator is used "
                               f"before the coordinator started")
        return self.enumerator

    def subtask_ready(self, subtask: int, gateway: Any) -> None:
        self.gateways[subtask] = gateway

    def handle_event_from_subtask(self, subtask: int, event: ReaderEvent) -> None:
        match event:
            case ReaderRegistered():
                self.registered.add(subtask)
                self._started().add_reader(subtask)
            case SplitRequested():
                self._started().handle_split_request(subtask)
            case SourceEvent(payload):
                self._started().handle_source_event(subtask, payload)
            case _:
                raise ValueError(f"source '{self.context.operator_name}': unknown event "
                                 f"{event!r} from subtask {subtask}")

    def checkpoint_coordinator(self, checkpoint_id: int) -> bytes:
        state = self._started().snapshot_state(checkpoint_id)
        self.assignments.checkpointed(checkpoint_id)
        return json.dumps(_json_value(state, "the enumerator state")).encode()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.assignments.completed(checkpoint_id)
        self._started().notify_checkpoint_complete(checkpoint_id)

    def supports_subtask_reset(self) -> bool:
        return type(self._started()).add_splits_back is not SplitEnumerator.add_splits_back

    def subtask_reset(self, subtask: int, checkpoint_id: int | None) -> None:
        # The reader registers again; what it was given after the checkpoint goes back.
        self.registered.discard(subtask)
        self.gateways.pop(subtask, None)
        self._started().add_splits_back(self.assignments.take_back(subtask, checkpoint_id),
                                        subtask)

    def reset_to_checkpoint(self, checkpoint_id: int | None, state: bytes | None) -> None:
        # The readers of the new attempt register again; what was assigned after the
        # checkpoint is unassigned again in the restored enumerator.
        self.registered.clear()
        self.gateways.clear()
        self.assignments = SplitAssignmentTracker()
        self._create(json.loads(state) if state else None)

    def close(self) -> None:
        if self.enumerator is not None:
            self.enumerator.close()


def _json_value(value: Any, what: str) -> Any:
    """``value`` as it will come back from a checkpoint: JSON (tuples become lists)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a JSON value (str, number, list, dict), got "
                        f"{type(value).__name__}: {exc}") from None
