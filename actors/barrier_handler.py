"""A subtask's checkpoint barrier handling, as a state machine without Ray or I/O.

Flink splits this into ``SingleCheckpointBarrierHandler`` and its
``BarrierHandlerState`` classes; dask's ``worker_state_machine`` shows the
shape used here: *events* go in (:meth:`BarrierHandler.handle`), *actions*
come out, and the subtask carries the actions out, in order, before it
feeds the next event. The handler never sends, blocks or writes anything.

Per checkpoint the handler keeps a :class:`Phase`; every change of phase
goes through :meth:`BarrierHandler._transition`, checked against
:data:`TRANSITIONS`:

=============  ==============================================  ==========================
from           event                                           to
=============  ==============================================  ==========================
(new)          first announcement on a channel                 ALIGNING
(new)          trigger acted on (a source; every input ended)  TAKEN, or RECORDING when
                                                               unaligned with input left
ALIGNING       every channel reached its barrier               TAKEN (aligned)
ALIGNING       unaligned announcement, or the timeout passed   RECORDING (unaligned)
ALIGNING       a channel announced a later one without it      DECLINED
ALIGNING       the coordinator aborted it (or a later one)     ABORTED
ALIGNING       released with a later one (taken or declined)   SUBSUMED
RECORDING      aborted (or a later one)                        ABORTED
RECORDING      a later one taken unaligned                     SUBSUMED
=============  ==============================================  ==========================

TAKEN, DECLINED, ABORTED and SUBSUMED are endings: nothing is kept for them.
A RECORDING checkpoint has been taken (its snapshot is done); it stays
known only so that its late announcements bound its input channel state,
and leaving RECORDING ends that recording, not the checkpoint a second time.

The trigger the coordinator sends every subtask is kept aside (one, the
latest): only a source, or a subtask whose inputs have all ended, acts on it
(no barrier will reach them, FLIP-147); elsewhere the barriers decide. It is
dropped once its checkpoint was taken, aborted or declined here.

Input progress (which channel has consumed up to its barrier) changes with
every record, so the handler reads it through :class:`InputView` when it
needs it instead of receiving it as events; it never changes it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, Union

from raystream.actors.messages import ChannelId
from raystream.checkpoint.barrier import Barrier


def unaligned_now(barrier: Barrier, wall_ms: Callable[[], float]) -> bool:
    """Is ``barrier`` unaligned at this moment: announced so, or its aligned
    checkpoint has passed its alignment timeout. The one place this is decided;
    the clock is read only for a barrier with a timeout."""
    if barrier.unaligned:
        return True
    deadline = barrier.timeout_at_ms
    return deadline is not None and wall_ms() >= deadline


def wall_clock_ms() -> float:
    return time.time() * 1000


class Alignment(enum.Enum):
    ALIGNED = "aligned"
    UNALIGNED = "unaligned"


class Phase(enum.Enum):
    ALIGNING = "aligning"  # announced on some channels: those are blocked at it
    RECORDING = "recording"  # taken unaligned: its input in flight is being recorded
    TAKEN = "taken"
    DECLINED = "declined"
    ABORTED = "aborted"
    SUBSUMED = "subsumed"


ENDINGS = frozenset({Phase.TAKEN, Phase.DECLINED, Phase.ABORTED, Phase.SUBSUMED})

TRANSITIONS: frozenset[tuple[Phase | None, Phase]] = frozenset({
    (None, Phase.ALIGNING),
    (None, Phase.TAKEN),
    (None, Phase.RECORDING),
    (Phase.ALIGNING, Phase.TAKEN),
    (Phase.ALIGNING, Phase.RECORDING),
    (Phase.ALIGNING, Phase.DECLINED),
    (Phase.ALIGNING, Phase.ABORTED),
    (Phase.ALIGNING, Phase.SUBSUMED),
    (Phase.RECORDING, Phase.ABORTED),
    (Phase.RECORDING, Phase.SUBSUMED),
})


# -- events --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BarrierAnnounced:
    """``barrier`` sits after message ``upto`` on ``channel`` (announced again, further
    forward, when its sender turned it unaligned)."""

    channel: ChannelId
    barrier: Barrier
    upto: int


@dataclass(frozen=True, slots=True)
class TriggerReceived:
    barrier: Barrier


@dataclass(frozen=True, slots=True)
class CheckpointAborted:
    """The coordinator aborted ``checkpoint_id``; older ones are stale here too."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Progressed:
    """Input was consumed or ended, or time passed: act on what is due."""


PROGRESSED = Progressed()

Event = Union[BarrierAnnounced, TriggerReceived, CheckpointAborted, Progressed]


# -- actions -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BlockChannel:
    """Consume nothing on ``channel`` past message ``upto`` until ``checkpoint_id`` is
    released (an announcement again moves it forward)."""

    channel: ChannelId
    checkpoint_id: int
    upto: int


@dataclass(frozen=True, slots=True)
class ResumeChannels:
    """Release every channel's barriers up to ``checkpoint_id``."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class StartRecording:
    """Record the input in flight of ``checkpoint_id`` (taken unaligned) as channel state;
    stop recording that of older checkpoints (one unaligned checkpoint at a time)."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class BoundRecording:
    """A late announcement: ``checkpoint_id``'s input state on ``channel`` ends at ``upto``."""

    channel: ChannelId
    checkpoint_id: int
    upto: int


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    """Checkpoint ``barrier`` now: pre-barrier, forward (if ``forward``), snapshot."""

    barrier: Barrier
    alignment: Alignment
    forward: bool
    alignment_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Decline:
    checkpoint_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class CancelChannelState:
    """Checkpoints up to ``checkpoint_id`` were aborted: stop recording and awaiting
    their channel state."""

    checkpoint_id: int


Action = Union[BlockChannel, ResumeChannels, StartRecording, BoundRecording, TakeSnapshot,
               Decline, CancelChannelState]
_NOTHING: tuple[Action, ...] = ()  # what most progress events yield: no allocation


class InputView(Protocol):
    """What the handler reads of its subtask (never changes)."""

    @property
    def is_source(self) -> bool: ...

    def inputs_ended(self) -> bool: ...  # the subtask has ended its input (and finished)
    def mid_batch(self) -> bool: ...  # a received batch is half processed (in slices)
    def backlogged(self) -> bool: ...  # output is queued, waiting for credit
    def channels_finished(self) -> bool: ...  # has channels, each has consumed END_OF_INPUT
    def channels_ending(self) -> bool: ...  # each has END_OF_INPUT consumed or arrived
    def aligned_checkpoint(self) -> int | None: ...  # see InputGate.aligned_checkpoint


@dataclass(slots=True)
class _Alignment:
    barrier: Barrier  # unaligned once any channel announced it so
    started_s: float  # monotonic time of the first announcement
    channels: set[ChannelId] = field(default_factory=set)  # announced (and blocked) there


def _barrier_of(n: int, barrier: Barrier | None, alignment: _Alignment | None) -> Barrier:
    """The barrier of checkpoint ``n``: the one given, else the one it was aligned with."""
    if barrier is not None:
        return barrier
    if alignment is None:
        raise AssertionError(f"checkpoint {n}: neither its barrier nor an alignment")
    return alignment.barrier


class BarrierHandler:
    """One subtask's barrier handling; see the module docstring.

    ``last_taken``: id of the last checkpoint this subtask took (a restored one
    at first). ``monotonic_s`` and ``wall_ms`` are the clocks (injected so that
    tests drive time).

    A source takes a checkpoint on its trigger, at the next progress event:

    >>> from types import SimpleNamespace
    >>> source = SimpleNamespace(is_source=True, inputs_ended=lambda: False,
    ...                          mid_batch=lambda: False, backlogged=lambda: False)
    >>> handler = BarrierHandler(source)
    >>> handler.handle(TriggerReceived(Barrier(1, attempt=0, trigger_ts_ms=0)))
    []
    >>> [(type(a).__name__, a.barrier.checkpoint_id, a.alignment.value, a.forward)
    ...  for a in handler.handle(PROGRESSED)]
    [('TakeSnapshot', 1, 'aligned', True)]
    """

    def __init__(self, view: InputView, *, last_taken: int = 0,
                 monotonic_s: Callable[[], float] = time.perf_counter,
                 wall_ms: Callable[[], float] = wall_clock_ms,
                 observer: Callable[[int, Phase | None, Phase], None] | None = None) -> None:
        self.view = view
        self.observer = observer  # sees every transition (tests, tracing)
        self.monotonic_s = monotonic_s
        self.wall_ms = wall_ms
        self.last_taken = last_taken
        self.aborted_upto = 0  # barriers of checkpoints up to this id are stale
        self.trigger: Barrier | None = None  # the latest trigger not acted on
        self.phases: dict[int, Phase] = {}  # live checkpoints only (ALIGNING, RECORDING)
        self.alignments: dict[int, _Alignment] = {}  # the ALIGNING ones

    # -- queries ----------------------------------------------------------------------------
    def unaligned_now(self, barrier: Barrier) -> bool:
        return unaligned_now(barrier, self.wall_ms)

    def next_deadline_ms(self) -> float | None:
        """Wall-clock ms of the earliest alignment timeout still to act on."""
        last = self.last_taken
        deadlines = [a.barrier.timeout_at_ms for n, a in self.alignments.items()
                     if a.barrier.timeout_at_ms is not None and not a.barrier.unaligned
                     and n > last]
        return min(deadlines) if deadlines else None

    # -- events -----------------------------------------------------------------------------
    def handle(self, event: Event) -> Sequence[Action]:
        if type(event) is Progressed:
            return self.on_progress()
        if type(event) is BarrierAnnounced:
            return self._on_announced(event)
        if type(event) is TriggerReceived:
            return self._on_trigger(event.barrier)
        if type(event) is CheckpointAborted:
            return self._on_aborted(event.checkpoint_id)
        raise TypeError(f"unknown event {event!r}")

    def _on_announced(self, event: BarrierAnnounced) -> list[Action]:
        n, channel = event.barrier.checkpoint_id, event.channel
        if n <= self.last_taken:  # taken already: a late announcement bounds its input state
            if self.phases.get(n) is Phase.RECORDING:
                return [BoundRecording(channel, n, event.upto)]
            return []
        if n <= self.aborted_upto:
            return []  # aborted: a late barrier must not block the channel
        actions: list[Action] = [BlockChannel(channel, n, event.upto)]
        alignment = self.alignments.get(n)
        if alignment is None:
            actions += self._transition(n, Phase.ALIGNING, barrier=event.barrier)
            alignment = self.alignments[n]
        elif event.barrier.unaligned and not alignment.barrier.unaligned:
            alignment.barrier = event.barrier  # one unaligned announcement makes it unaligned
        alignment.channels.add(channel)
        # Announcements come ahead of the data, in order per channel: barrier n behind
        # an older one still aligning waits its turn on the channel (max_concurrent > 1).
        # Only a channel that announces n without the older one pending (its sender
        # skipped it) shows the older can never align here.
        skipped = [m for m, a in self.alignments.items() if m < n and channel not in a.channels]
        for older in skipped:
            if older in self.alignments:  # not dropped with an even older one
                actions += self._transition(
                    older, Phase.DECLINED,
                    reason=f"barrier {n} came on channel {channel} without barrier {older}: "
                           f"{older} can no longer align")
        return actions

    def _on_trigger(self, barrier: Barrier) -> list[Action]:
        actions: list[Action] = []
        if self.trigger is not None:
            # Every trigger is a checkpoint of its own: a source busy while two
            # arrived takes the older first, or its barrier n+1 would go out
            # without barrier n and n would be declined downstream.
            actions = list(self.on_progress())
        self.trigger = barrier
        return actions

    def _on_aborted(self, checkpoint_id: int) -> list[Action]:
        actions: list[Action] = []
        for n in sorted(m for m in self.phases if m <= checkpoint_id):
            actions += self._transition(n, Phase.ABORTED)
        self.aborted_upto = max(self.aborted_upto, checkpoint_id)
        return actions + [ResumeChannels(checkpoint_id), CancelChannelState(checkpoint_id)]

    def on_progress(self) -> Sequence[Action]:
        """Take a checkpoint when one is due: on the trigger in a source or where every
        input has ended; elsewhere on the first unaligned barrier (or the alignment
        timeout) or when every channel has reached the barrier. Called once per
        mailbox loop round: cheap when nothing is due."""
        last = self.last_taken
        trigger = self.trigger
        view = self.view
        if trigger is not None:
            if trigger.checkpoint_id <= last or trigger.checkpoint_id <= self.aborted_upto:
                # taken already (through barrier alignment), or aborted or declined here:
                # never taken after it ended
                self.trigger = trigger = None
            elif view.is_source or view.inputs_ended() or view.channels_finished():
                # No barrier will come here (kept until then: FLIP-147).
                self.trigger = None
                return self._transition(trigger.checkpoint_id, Phase.TAKEN, barrier=trigger)
            elif self.unaligned_now(trigger) and view.channels_ending():
                # Every input has ended before the barrier (none will come), but not
                # everything is processed: unaligned, that rest is channel state.
                self.trigger = None
                return self._transition(trigger.checkpoint_id, Phase.RECORDING, barrier=trigger)
        alignments = self.alignments
        if alignments:
            n = min(alignments)
            if n > last and self.unaligned_now(alignments[n].barrier):
                return self._transition(n, Phase.RECORDING)
        if view.mid_batch():
            return _NOTHING  # an aligned barrier sits between two messages, never inside one
        aligned = view.aligned_checkpoint()
        if aligned is None:
            return _NOTHING
        if aligned not in alignments:  # cannot happen: every blocked barrier is aligning
            return [ResumeChannels(aligned)]
        return self._transition(aligned, Phase.TAKEN if aligned > last else Phase.SUBSUMED)

    # -- the one place phases change ------------------------------------------------------
    def _transition(self, n: int, to: Phase, *, barrier: Barrier | None = None,
                    reason: str = "") -> list[Action]:
        old = self.phases.get(n)
        if (old, to) not in TRANSITIONS:
            raise AssertionError(f"checkpoint {n}: no transition {old} -> {to}")
        alignment = self.alignments.pop(n, None)
        if to in ENDINGS:
            self.phases.pop(n, None)
        else:
            self.phases[n] = to
        if self.observer is not None:
            self.observer(n, old, to)
        actions: list[Action] = []
        if to is Phase.ALIGNING:
            self.alignments[n] = _Alignment(_barrier_of(n, barrier, None), self.monotonic_s())
        elif to is Phase.TAKEN:
            if alignment is None:  # on the trigger: no channel waits for it
                actions.append(self._snapshot(_barrier_of(n, barrier, None), Alignment.ALIGNED))
            else:  # aligned: the channels resume after the snapshot
                actions += [self._snapshot(_barrier_of(n, barrier, alignment), Alignment.ALIGNED,
                                           alignment),
                            *self._release(n)]
        elif to is Phase.RECORDING:
            for older in [m for m, p in self.phases.items() if p is Phase.RECORDING and m < n]:
                self._transition(older, Phase.SUBSUMED)  # StartRecording(n) stops it
            barrier = _barrier_of(n, barrier, alignment)
            actions += [StartRecording(n), self._snapshot(barrier, Alignment.UNALIGNED, alignment),
                        *self._release(n)]
        elif to is Phase.DECLINED:
            self.aborted_upto = max(self.aborted_upto, n)
            actions += [*self._release(n), Decline(n, reason)]
        elif to is Phase.SUBSUMED and alignment is not None:
            actions += self._release(n)
        # ABORTED: _on_aborted releases the channels and cancels the channel state once
        self._check()
        return actions

    def _release(self, n: int) -> list[Action]:
        """Resume the channels blocked at ``n``; releasing them also releases the
        older checkpoints still aligning (they end unnoticed, as they always did)."""
        for m in [m for m in self.alignments if m < n]:
            self._transition(m, Phase.SUBSUMED)
        return [ResumeChannels(n)]

    def _snapshot(self, barrier: Barrier, alignment: Alignment,
                  aligning: _Alignment | None = None) -> TakeSnapshot:
        n = barrier.checkpoint_id
        if n <= self.last_taken:
            raise AssertionError(f"checkpoint {n} taken after {self.last_taken}")
        self.last_taken = n
        alignment_s = 0.0 if aligning is None else self.monotonic_s() - aligning.started_s
        # A subtask whose input ended forwards no aligned barrier (its receivers count
        # its END_OF_INPUT instead); an unaligned one still overtakes the output it
        # has not sent, so its receivers need not wait for that.
        view = self.view
        forward = not view.inputs_ended() or (
            (alignment is Alignment.UNALIGNED or self.unaligned_now(barrier))
            and view.backlogged())
        return TakeSnapshot(barrier, alignment, forward, alignment_s)

    def _check(self) -> None:
        """Invariants of the handler's own state (cheap: a handful of entries)."""
        assert self.alignments.keys() == {n for n, p in self.phases.items()
                                          if p is Phase.ALIGNING}
        assert all(n > self.aborted_upto for n in self.alignments)
