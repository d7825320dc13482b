"""Channel state of unaligned checkpoints (Flink FLIP-76 ``ChannelStateWriter``).

An unaligned checkpoint ``n`` snapshots a subtask at once, on the first
barrier, while data is still in flight around it. What is in flight becomes
part of the checkpoint, per channel:

* **input** (:class:`InputStateRecorder`, at the receiver): the messages with
  sequence numbers in ``(processed, upto]`` — those after the last one the
  subtask had consumed at its snapshot and up to the barrier's ``upto`` on
  that channel (the last one its sender had *sent* before the barrier).
  They may still be queued in the gate or in flight; the recorder keeps
  collecting them as they arrive (consuming them is not needed, so it does
  not wait behind a slow operator) until the range is complete. A channel
  whose barrier is not announced yet is recorded until it is; a channel whose
  sender ended before the barrier (no barrier will come) until its
  END_OF_INPUT. The rows of a batch the subtask was half-way through, and
  restored state it had not replayed yet, lead the channel's part.
* **output** (:class:`OutputStateCapture`, at the sender): the messages before
  the barrier that it had not transmitted yet (waiting for credit, or
  buffered in the record writer, which is flushed first).

A message the sender transmits after announcing a barrier carries that
announcement (``Envelope.announced``), so the receiver never consumes it, nor
counts it complete, before it has seen the announcement: this keeps a
record's effect from landing both in a snapshot and in channel state, although
barriers travel on the control lane beside the data.

On restore a channel replays the receiver's input part, then the sender
re-sends its output part, then new data — per channel, nothing is lost,
doubled or reordered.

    >>> from raystream.actors.channels import InputGate
    >>> from raystream.actors.messages import ChannelId, Envelope, Kind
    >>> ch = ChannelId(0, 0, 0)
    >>> gate = InputGate([(ch, 0)])
    >>> gate.add(Envelope(ch, 0, 0, Kind.DATA, ["b0"], 1)); _ = gate.poll()  # processed
    >>> gate.add(Envelope(ch, 1, 0, Kind.DATA, ["b1"], 1))                    # queued
    >>> recorder = InputStateRecorder(7, gate); gate.recorders.append(recorder)
    >>> recorder.on_barrier(ch, 2)                        # barrier 7 sits after seq 2
    >>> recorder.done.is_set()
    False
    >>> gate.add(Envelope(ch, 2, 0, Kind.DATA, ["b2"], 1))                    # still in flight
    >>> recorder.done.is_set(), [e.payload for e in recorder.entries()[ch]]
    (True, [['b1'], ['b2']])
"""

from __future__ import annotations

import threading
from typing import Iterable

import pyarrow as pa

from raystream.actors.channels import InputChannel, InputGate
from raystream.actors.messages import ChannelId, Envelope, Kind


class _PendingPart:
    """A part of a checkpoint's channel state that completes later (or is cancelled)."""

    def __init__(self, checkpoint_id: int) -> None:
        self.checkpoint_id = checkpoint_id
        self.done = threading.Event()
        self.cancelled = False

    def cancel(self) -> None:
        """The checkpoint was aborted or subsumed: stop recording, release waiters."""
        self.cancelled = True
        self.done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until complete; False if cancelled or not complete in time."""
        return self.done.wait(timeout_s) and not self.cancelled


class _ChannelRecording:
    """One input channel's part: messages with seq in ``(start, end]``."""

    __slots__ = ("channel", "start", "end", "leading", "items", "end_of_input")

    def __init__(self, channel: InputChannel, start: int, leading: list[Envelope]) -> None:
        self.channel = channel
        self.start = start
        self.end: int | None = None  # known once the barrier is announced on the channel
        self.leading = leading  # rows before seq start+1: a half-processed batch, replay
        self.items: dict[int, Envelope] = {}
        self.end_of_input: Envelope | None = None

    def add(self, envelope: Envelope) -> None:
        if envelope.kind == Kind.END_OF_INPUT:
            self.end_of_input = envelope  # regenerated on restore: never part of the state
        elif envelope.seq > self.start and (self.end is None or envelope.seq <= self.end):
            self.items[envelope.seq] = envelope

    def set_end(self, upto: int) -> None:
        if upto < self.start:  # the subtask consumed past its barrier: a runtime bug
            raise RuntimeError(f"barrier after seq {upto} on {self.channel.channel}, but seq "
                               f"{self.start} was consumed before the snapshot")
        self.end = upto if self.end is None else min(self.end, upto)
        for seq in [s for s in self.items if s > self.end]:
            del self.items[seq]

    def complete(self) -> bool:
        end = self.end
        if end is None:
            if self.end_of_input is None:
                return False  # the barrier (or end of input) has yet to come
            end = self.end_of_input.seq - 1
            needs = self.end_of_input.announced
        else:
            needs = 0
        if len(self.items) != end - self.start:
            return False
        # Every announcement made before one of these was sent must be seen: one
        # of them may move the barrier before it (an aligned barrier turned unaligned).
        for envelope in self.items.values():
            needs = max(needs, envelope.announced)
        return self.channel.announced >= needs

    def entries(self) -> list[Envelope]:
        return self.leading + [self.items[seq] for seq in sorted(self.items)]


class InputStateRecorder(_PendingPart):
    """Input channel state of unaligned checkpoint ``checkpoint_id`` at one subtask.

    Created at the snapshot, under the subtask's lock, and registered in the
    gate (``gate.recorders``), which feeds it every arrival; the subtask feeds
    it the barrier announcements. ``done`` is set when every channel's part is
    complete.

    ``partial``: per channel, the unprocessed rest of a batch the subtask was
    processing in slices when it took the snapshot.
    """

    def __init__(self, checkpoint_id: int, gate: InputGate,
                 partial: dict[ChannelId, Envelope] | None = None) -> None:
        super().__init__(checkpoint_id)
        partial = partial or {}
        self._recordings: dict[ChannelId, _ChannelRecording] = {}
        for channel in gate:
            leading = [partial[channel.channel]] if channel.channel in partial else []
            recording = _ChannelRecording(channel, channel.next_seq - 1,
                                          leading + list(channel.replay))
            if channel.finished:  # END_OF_INPUT consumed: nothing can be in flight
                recording.set_end(recording.start)
            for envelope in channel.pending.values():
                recording.add(envelope)
            upto = gate.barrier_upto(channel.channel, checkpoint_id)
            if upto is not None:
                recording.set_end(upto)
            self._recordings[channel.channel] = recording
        self.check()

    def on_arrival(self, channel: InputChannel, envelope: Envelope) -> None:
        self._recordings[channel.channel].add(envelope)
        self.check()

    def on_barrier(self, channel: ChannelId, upto: int) -> None:
        """Barrier ``checkpoint_id`` was announced on ``channel`` after message ``upto``."""
        self._recordings[channel].set_end(upto)
        self.check()

    def check(self) -> None:
        if not self.done.is_set() and all(r.complete() for r in self._recordings.values()):
            self.done.set()

    def entries(self) -> dict[ChannelId, list[Envelope]]:
        """Per channel, the recorded messages in channel order (once ``done``)."""
        return {channel: r.entries() for channel, r in self._recordings.items()}


class OutputStateCapture(_PendingPart):
    """Output channel state of checkpoint ``checkpoint_id`` at one subtask.

    An unaligned barrier captures a channel's untransmitted messages at once.
    An aligned barrier with a timeout that still has data queued before it
    *awaits* the channel: the part is settled when that data has been
    transmitted (nothing to capture), or when the timeout passes and the
    subtask turns the barrier unaligned, capturing what is still queued.
    """

    def __init__(self, checkpoint_id: int) -> None:
        super().__init__(checkpoint_id)
        self.entries: dict[ChannelId, list[Envelope]] = {}
        self.awaiting: dict[ChannelId, int] = {}  # channel -> upto of its queued aligned barrier
        self.unaligned = False  # the barrier overtook queued output on some channel

    def capture(self, channel: ChannelId, envelopes: list[Envelope]) -> None:
        if envelopes:
            self.entries[channel] = list(envelopes)

    def await_channel(self, channel: ChannelId, upto: int) -> None:
        self.awaiting[channel] = upto

    def settle(self, channel: ChannelId) -> None:
        self.awaiting.pop(channel, None)

    def seal(self) -> None:
        """No more channels will be added: complete once none is awaited."""
        if not self.awaiting and not self.done.is_set():
            self.done.set()



def resolve_batches(envelopes: Iterable[Envelope]) -> list[tuple[Kind, object, int]]:
    """``(kind, batch or watermark, rows)`` per message, data fetched from Ray's object
    store in one call (channel state is written to storage, never kept as object refs)."""
    import ray

    envelopes = list(envelopes)
    refs = [e.payload[0] for e in envelopes
            if e.kind == Kind.DATA and not isinstance(e.payload[0], pa.RecordBatch)]
    fetched = iter(ray.get(refs)) if refs else iter(())
    out = []
    for envelope in envelopes:
        if envelope.kind == Kind.DATA:
            batch = envelope.payload[0]
            if not isinstance(batch, pa.RecordBatch):
                batch = next(fetched)
            out.append((Kind.DATA, batch, batch.num_rows))
        elif envelope.kind == Kind.WATERMARK:
            out.append((Kind.WATERMARK, envelope.payload, 0))
        else:
            raise ValueError(f"{envelope.kind.name} cannot be channel state")
    return out
