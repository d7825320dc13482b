"""The barrier handler (``actors/barrier_handler.py``) as a state machine, without Ray.

A hypothesis ``RuleBasedStateMachine`` plays one receiving subtask with two
input channels. Each channel's sender is a real ``OutputChannel`` (credit,
backlog) with the real ``BarrierForwarder``; the receiver is a real
``InputGate`` with its ``InputStateRecorder``s, and carries out the handler's
actions the way ``Subtask._carry_out`` does. The coordinator triggers
checkpoints (aligned, unaligned, or aligned with a timeout; up to two at once
when aligned), aborts them, and aborts what a sender skipped or the receiver
declined. Rules interleave data, end of input, barrier forwarding and
skipping, deliveries on the data and control lanes, consumption (with batches
processed in slices), the passing of time and aborts in any order; at the end
everything is drained.

Invariants:

* no channel is resumed, and no message after a barrier is consumed, before
  that checkpoint has ended here (snapshot taken, declined, aborted or
  subsumed);
* a checkpoint never both records its input in flight (unaligned) and blocks
  a channel (aligned);
* every checkpoint ends exactly once, and once drained every one has ended;
* snapshots are taken in increasing checkpoint order, each at most once.
"""

from __future__ import annotations

import collections

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from raystream.actors.barrier_forwarder import BarrierForwarder
from raystream.actors.barrier_handler import (ENDINGS, Alignment, BarrierAnnounced,
                                              BarrierHandler, BlockChannel, BoundRecording,
                                              CancelChannelState, CheckpointAborted, Decline,
                                              Phase, PROGRESSED, ResumeChannels, StartRecording,
                                              TakeSnapshot, TriggerReceived)
from raystream.actors.channel_state import InputStateRecorder
from raystream.actors.channels import InputGate, OutputChannel
from raystream.actors.messages import ChannelId, Kind
from raystream.checkpoint.barrier import Barrier

CHANNELS = [ChannelId(0, u, 0) for u in range(2)]
TIMEOUT_MS = 50
MODES = {  # mode -> (unaligned, aligned timeout, max concurrent)
    "aligned": (False, None, 1),
    "aligned_concurrent": (False, None, 2),
    "unaligned": (True, None, 1),
    "aligned_timeout": (False, TIMEOUT_MS, 1),
}


class _Sender:
    """One upstream subtask's output channel and barrier forwarder."""

    def __init__(self, channel: ChannelId, credits: int) -> None:
        self.data: collections.deque = collections.deque()  # the data lane, in flight
        self.control: collections.deque = collections.deque()  # the control lane, in flight
        self.out = OutputChannel(channel, attempt=0, credits=credits, transmit=self.data.append)
        self.forwarder = BarrierForwarder({channel: self.out}, self._announce)
        self.positions: dict[int, int] = {}  # checkpoint -> where its barrier sits (lowest)
        self.done_upto = 0  # checkpoints up to this id were forwarded or skipped

    def _announce(self, out: OutputChannel, barrier: Barrier, upto: int) -> None:
        n = barrier.checkpoint_id
        self.positions[n] = min(upto, self.positions.get(n, upto))
        self.control.append((barrier, upto, out.announce()))


class BarrierHandlerMachine(RuleBasedStateMachine):
    """The receiver: it is the ``InputView`` of its handler and carries out its actions."""

    is_source = False

    @initialize(mode=st.sampled_from(sorted(MODES)), credits=st.integers(1, 2))
    def setup(self, mode: str, credits: int) -> None:
        self.unaligned, self.timeout_ms, self.max_concurrent = MODES[mode]
        self.now = 0.0
        self.gate = InputGate([(c, 0) for c in CHANNELS])
        self.senders = {c: _Sender(c, credits) for c in CHANNELS}
        self.handler = BarrierHandler(self, monotonic_s=lambda: self.now / 1000,
                                      wall_ms=lambda: self.now, observer=self._observe)
        self.mid = False  # a received batch is being processed in slices
        self.ended = False
        self.next_id = 1
        self.barriers: dict[int, Barrier] = {}  # triggered
        self.aborted: set[int] = set()  # by the coordinator
        self.to_abort: list[int] = []  # skipped by a sender or declined: the coordinator aborts
        self.endings: dict[int, list[Phase]] = collections.defaultdict(list)
        self.taken: list[int] = []  # snapshots carried out, in order
        self.recorders: dict[int, InputStateRecorder] = {}
        self.recorded: set[int] = set()  # checkpoints whose input in flight was recorded

    # -- the handler's view of the receiver ------------------------------------------------
    def inputs_ended(self) -> bool:
        return self.ended

    def mid_batch(self) -> bool:
        return self.mid

    def backlogged(self) -> bool:
        return False  # the receiver has no outputs

    def channels_finished(self) -> bool:
        return self.gate.all_finished()

    def channels_ending(self) -> bool:
        return all(c.finished or c.end_of_input is not None for c in self.gate)

    def aligned_checkpoint(self) -> int | None:
        return self.gate.aligned_checkpoint()

    # -- carrying out ---------------------------------------------------------------------
    def _observe(self, n: int, old: Phase | None, to: Phase) -> None:
        if to is Phase.RECORDING or (to in ENDINGS and old is not Phase.RECORDING):
            self.endings[n].append(to)  # RECORDING: taken unaligned
            assert len(self.endings[n]) == 1, (n, self.endings[n])

    def _ended(self, n: int) -> bool:
        """Checkpoint n has ended here, and a snapshot it ended with was carried out."""
        ending = self.endings.get(n)
        if not ending:
            # An abort of n or a later one, before anything of n happened here: the
            # receiver ignores n from then on (and the coordinator times it out).
            return n <= max(self.aborted, default=0)
        return ending[0] not in (Phase.TAKEN, Phase.RECORDING) or n in self.taken

    def _blocked(self) -> set[int]:
        return {n for c in self.gate for n, _ in c.barriers}

    def _run(self, actions) -> None:
        for action in actions:
            if isinstance(action, BlockChannel):
                assert action.checkpoint_id not in self.recorded, action
                self.gate.add_barrier(action.channel, action.checkpoint_id, action.upto)
            elif isinstance(action, ResumeChannels):
                early = [m for m in self._blocked()
                         if m <= action.checkpoint_id and not self._ended(m)]
                assert not early, f"resumed at {action} before {early} ended"
                self.gate.release_barrier(action.checkpoint_id)
            elif isinstance(action, StartRecording):
                n = action.checkpoint_id
                for older in [m for m in self.recorders if m < n]:
                    self.recorders.pop(older).cancel()
                recorder = InputStateRecorder(n, self.gate)
                self.gate.recorders.append(recorder)
                self.recorders[n] = recorder
                self.recorded.add(n)
            elif isinstance(action, BoundRecording):
                recorder = self.recorders.get(action.checkpoint_id)
                if recorder is not None and not recorder.done.is_set():
                    recorder.on_barrier(action.channel, action.upto)
            elif isinstance(action, TakeSnapshot):
                n = action.barrier.checkpoint_id
                assert not self.taken or n > self.taken[-1], (self.taken, n)
                assert (action.alignment is Alignment.UNALIGNED) == (n in self.recorded)
                assert action.forward == (not self.ended)
                self.taken.append(n)
            elif isinstance(action, Decline):
                self.to_abort.append(action.checkpoint_id)
            elif isinstance(action, CancelChannelState):
                for m in [m for m in self.recorders if m <= action.checkpoint_id]:
                    self.recorders.pop(m).cancel()
            else:
                raise AssertionError(f"unknown action {action!r}")
        self._run_progress()

    def _run_progress(self) -> None:
        actions = self.handler.handle(PROGRESSED)
        if actions:
            self._run(actions)

    def _pending(self) -> list[int]:
        """Triggered, neither taken here nor aborted (an abort of a later one makes the
        receiver ignore it: the coordinator times it out)."""
        return [n for n in self.barriers
                if n > max(self.aborted, default=0) and n not in self.taken]

    # -- the coordinator --------------------------------------------------------------------
    @precondition(lambda self: len(self._pending()) < self.max_concurrent)
    @rule()
    def trigger(self) -> None:
        n = self.next_id
        self.next_id += 1
        self.barriers[n] = Barrier(n, attempt=0, trigger_ts_ms=int(self.now),
                                   unaligned=self.unaligned, aligned_timeout_ms=self.timeout_ms)
        self._run(self.handler.handle(TriggerReceived(self.barriers[n])))

    def _abort(self, n: int) -> None:
        if n in self.aborted:
            return
        self.aborted.add(n)
        for sender in self.senders.values():
            sender.forwarder.cancel(n)
        self._run(self.handler.handle(CheckpointAborted(n)))

    @precondition(lambda self: self._pending())
    @rule(data=st.data())
    def abort(self, data) -> None:
        self._abort(data.draw(st.sampled_from(self._pending())))

    @precondition(lambda self: self.to_abort)
    @rule()
    def abort_declined_or_skipped(self) -> None:
        self._abort(self.to_abort.pop(0))

    # -- senders -----------------------------------------------------------------------------
    @rule(c=st.sampled_from(CHANNELS), kind=st.sampled_from([Kind.DATA, Kind.DATA,
                                                             Kind.WATERMARK, Kind.END_OF_INPUT]))
    def emit(self, c: ChannelId, kind: Kind) -> None:
        out = self.senders[c].out
        if not out.ended:
            out.send(kind, ["x"] if kind == Kind.DATA else 0, rows=1 if kind == Kind.DATA else 0)

    def _next_to_forward(self, sender: _Sender) -> int | None:
        while sender.done_upto + 1 in self.aborted:  # aborted there too: never forwarded
            sender.done_upto += 1
        n = sender.done_upto + 1
        return n if n in self.barriers else None

    @rule(c=st.sampled_from(CHANNELS), skip=st.booleans())
    def forward(self, c: ChannelId, skip: bool) -> None:
        """The sender takes its next checkpoint and forwards the barrier, or skips it
        (declined upstream: the coordinator will abort it)."""
        sender = self.senders[c]
        n = self._next_to_forward(sender)
        if n is None:
            return
        sender.done_upto = n
        if skip:
            self.to_abort.append(n)
        else:
            barrier = self.barriers[n]
            sender.forwarder.forward(barrier, self.handler.unaligned_now(barrier))

    @rule(c=st.sampled_from(CHANNELS))
    def sender_settles(self, c: ChannelId) -> None:
        """The sender's loop round: an aligned barrier past its timeout turns unaligned."""
        self.senders[c].forwarder.settle(lambda: self.now)

    # -- the receiver ------------------------------------------------------------------------
    @rule(c=st.sampled_from(CHANNELS))
    def deliver_data(self, c: ChannelId) -> None:
        sender = self.senders[c]
        if sender.data:
            self.gate.add(sender.data.popleft())

    @rule(c=st.sampled_from(CHANNELS))
    def deliver_announcement(self, c: ChannelId) -> None:
        sender = self.senders[c]
        if sender.control:
            barrier, upto, index = sender.control.popleft()
            self.gate.note_announcement(c, index)
            self._run(self.handler.handle(BarrierAnnounced(c, barrier, upto)))

    @rule(sliced=st.booleans())
    def consume(self, sliced: bool) -> None:
        if self.mid or self.ended:
            return
        envelope = self.gate.poll()
        if envelope is None:
            return
        channel = self.gate.channels[envelope.channel]
        for n, upto in self.senders[envelope.channel].positions.items():
            assert upto >= envelope.seq or self._ended(n), \
                f"seq {envelope.seq} on {envelope.channel} consumed past barrier {n} at {upto}"
        if envelope.kind == Kind.DATA:
            self.senders[envelope.channel].out.add_credit(1)
            self.mid = sliced
        elif envelope.kind == Kind.END_OF_INPUT:
            channel.finished = True
            self.ended = self.gate.all_finished()
        self._run_progress()

    @rule()
    def finish_batch(self) -> None:
        self.mid = False
        self._run_progress()

    @rule(ms=st.sampled_from([1, 10, TIMEOUT_MS]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self._run_progress()

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def recording_and_blocking_never_overlap(self) -> None:
        if hasattr(self, "gate"):
            live = {n for n, p in self.handler.phases.items() if p is Phase.RECORDING}
            assert not (self._blocked() & (live | set(self.recorders)))
            assert set(self.handler.alignments) >= self._blocked()

    def teardown(self) -> None:
        """Drain: every checkpoint is forwarded or aborted, everything is delivered and
        consumed, time passes every timeout; then each one has ended exactly once."""
        if not hasattr(self, "gate"):
            return
        for _ in range(100):
            before = (len(self.taken), len(self.aborted), self.now,
                      sum(len(s.data) + len(s.control) for s in self.senders.values()))
            while self.to_abort:
                self.abort_declined_or_skipped()
            for c in CHANNELS:
                while self._next_to_forward(self.senders[c]) is not None:
                    self.forward(c, skip=False)
                self.sender_settles(c)
                while self.senders[c].data or self.senders[c].control:
                    self.deliver_announcement(c)
                    self.deliver_data(c)
            self.finish_batch()
            while self.gate.has_ready() and not self.ended:
                self.consume(sliced=False)
            for c in CHANNELS:
                self.emit(c, Kind.END_OF_INPUT)
            self.time_passes(TIMEOUT_MS)
            after = (len(self.taken), len(self.aborted), self.now - TIMEOUT_MS,
                     sum(len(s.data) + len(s.control) for s in self.senders.values()))
            if after == before and not self.to_abort and self.ended:
                break
        assert self.ended and not self.handler.alignments
        for n in self.barriers:
            # Not ended here, never aborted: the coordinator subsumes it with a later one
            # taken (its senders ended before forwarding it, and a newer trigger replaced it).
            assert (len(self.endings[n]) == 1 or n <= max(self.aborted, default=0)
                    or n < max(self.taken, default=0)), (n, self.endings[n])
        assert len(set(self.taken)) == len(self.taken)


BarrierHandlerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                                   deadline=None)
test_barrier_handler = BarrierHandlerMachine.TestCase
