"""Input gate and output channels of a subtask, with credit-based flow control.

Credit-based flow control (Flink's network stack, simplified to whole
batches): a receiver grants each channel ``credits`` slots up front; a sender
spends one per data batch and gets it back when the receiver has *processed*
the batch. A sender without credit keeps its batches in a local backlog, and
a subtask with a backlog takes no more input, so backpressure travels
upstream and the number of unconsumed batches in flight per channel never
exceeds ``credits``. Watermarks and end-of-input cost no credit, but they
wait in the same backlog so a channel's order is kept.

Barriers travel beside the data, on the control lane, as *announcements*
(the barrier and the sequence number it sits after). A message carries the
number of announcements its sender had made when it transmitted it
(``Envelope.announced``); the gate hands a message out only once it has seen
that many, so no message overtakes a barrier that was announced before it.
The gate blocks a channel at an aligned barrier, replays restored channel
state before anything new, and feeds the recorders of unaligned checkpoints
(:mod:`raystream.actors.channel_state`).

Neither class is thread-safe: the subtask guards both with its mailbox lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from raystream.actors.messages import ChannelId, Envelope, Kind


@dataclass(slots=True)
class InputChannel:
    channel: ChannelId
    input_index: int  # which logical input of the subtask's head operator (0 or 1)
    next_seq: int = 0
    pending: dict[int, Envelope] = field(default_factory=dict)  # out-of-order arrivals
    finished: bool = False
    # (checkpoint_id, upto) of barriers announced on this channel, oldest first
    barriers: collections.deque = field(default_factory=collections.deque)
    announced: int = 0  # barrier announcements 1..announced of the sender have been seen
    early_announcements: set = field(default_factory=set)  # seen out of order
    # restored input channel state: consumed before any message of this attempt
    replay: collections.deque = field(default_factory=collections.deque)
    end_of_input: Envelope | None = None  # arrived (not necessarily consumed)

    def at_barrier(self) -> int | None:
        """Id of the barrier this channel has reached (it is then blocked), else None."""
        if not self.replay and self.barriers and self.next_seq > self.barriers[0][1]:
            return self.barriers[0][0]
        return None

    def ready(self) -> bool:
        """The next message may be consumed: replayed channel state first; then the
        next message has arrived, no barrier blocks the channel, and every barrier
        announcement its sender made before transmitting it has been seen."""
        if self.replay:
            return True
        head = self.pending.get(self.next_seq)
        return (head is not None and self.at_barrier() is None
                and head.announced <= self.announced)

    def note_announcement(self, index: int) -> None:
        """The sender's ``index``-th barrier announcement (1-based) has been seen."""
        if index <= self.announced:
            return
        self.early_announcements.add(index)
        while self.announced + 1 in self.early_announcements:
            self.announced += 1
            self.early_announcements.discard(self.announced)


class InputGate:
    """All input channels of one subtask; hands out messages in per-channel order.

    Channels are polled round-robin so that no input starves another.

    >>> from raystream.actors.messages import ChannelId, Envelope, Kind
    >>> ch = ChannelId(edge=0, upstream=0, downstream=0)
    >>> gate = InputGate([(ch, 0)])
    >>> gate.add(Envelope(ch, 1, 0, Kind.END_OF_INPUT)); gate.poll() is None  # waits for seq 0
    True
    >>> gate.add(Envelope(ch, 0, 0, Kind.WATERMARK, 5)); [gate.poll().seq, gate.poll().seq]
    [0, 1]
    """

    def __init__(self, channels: list[tuple[ChannelId, int]]) -> None:
        self.channels: dict[ChannelId, InputChannel] = {
            ch: InputChannel(ch, input_index) for ch, input_index in channels}
        self._order = list(self.channels.values())
        self._next = 0
        # unaligned checkpoints still recording in-flight input (ChannelStateRecorder)
        self.recorders: list[Any] = []

    def add(self, envelope: Envelope) -> None:
        channel = self.channels.get(envelope.channel)
        if channel is None:
            raise KeyError(f"message on unknown channel {envelope.channel}")
        if envelope.seq < channel.next_seq or envelope.seq in channel.pending:
            raise RuntimeError(f"duplicate message seq {envelope.seq} on channel {envelope.channel}")
        channel.pending[envelope.seq] = envelope
        if envelope.kind == Kind.END_OF_INPUT:
            channel.end_of_input = envelope
        if self.recorders:
            for recorder in self.recorders:
                recorder.on_arrival(channel, envelope)
            self._drop_done_recorders()

    def has_ready(self) -> bool:
        return any(c.ready() for c in self._order)

    def reopen(self, channel: ChannelId) -> None:
        """``channel``'s sender was restored alone (a region failover): forget what its
        failed attempt sent, ended or announced; the new one starts at sequence 0."""
        old = self.channels[channel]
        fresh = InputChannel(channel, old.input_index)
        self.channels[channel] = fresh
        self._order[self._order.index(old)] = fresh

    def poll(self) -> Envelope | None:
        """Next in-order message of the next channel that has one, or None."""
        n = len(self._order)
        for i in range(n):
            channel = self._order[(self._next + i) % n]
            if channel.ready():
                self._next = (self._next + i + 1) % n
                if channel.replay:
                    return channel.replay.popleft()
                envelope = channel.pending.pop(channel.next_seq)
                channel.next_seq += 1
                return envelope
        return None

    def all_finished(self) -> bool:
        return all(c.finished for c in self._order)

    def note_announcement(self, channel: ChannelId, index: int) -> None:
        """The sender of ``channel`` made its ``index``-th barrier announcement (taken,
        aborted or not: later messages may wait for it)."""
        self.channels[channel].note_announcement(index)
        if self.recorders:
            for recorder in self.recorders:
                recorder.check()
            self._drop_done_recorders()

    def add_barrier(self, channel: ChannelId, checkpoint_id: int, upto: int) -> None:
        """Barrier ``checkpoint_id`` sits after message ``upto`` on ``channel``. Announced
        again (an aligned barrier its sender turned unaligned), it moves forward."""
        barriers = self.channels[channel].barriers
        for i, (n, known) in enumerate(barriers):
            if n == checkpoint_id:
                barriers[i] = (n, min(known, upto))
                return
        barriers.append((checkpoint_id, upto))
        if len(barriers) > 1 and barriers[-2][0] > checkpoint_id:  # arrived out of order
            ordered = sorted(barriers)
            barriers.clear()
            barriers.extend(ordered)

    def barrier_upto(self, channel: ChannelId, checkpoint_id: int) -> int | None:
        """Where barrier ``checkpoint_id`` sits on ``channel``, if announced and pending."""
        for n, upto in self.channels[channel].barriers:
            if n == checkpoint_id:
                return upto
        return None

    def restore_channel_state(self, channel: ChannelId, envelopes: list[Envelope]) -> None:
        """Replay ``envelopes`` (a restored checkpoint's input channel state) on
        ``channel`` before anything that arrives on it."""
        self.channels[channel].replay.extend(envelopes)

    def _drop_done_recorders(self) -> None:
        self.recorders = [r for r in self.recorders if not r.done.is_set()]

    def aligned_checkpoint(self) -> int | None:
        """The oldest announced checkpoint every channel has reached (or ended before), if any.

        An ended channel counts as aligned: its sender finished before the
        barrier and will never send it (Flink FLIP-147).
        """
        pending = [c.barriers[0][0] for c in self._order if c.barriers]
        if not pending:
            return None
        checkpoint_id = min(pending)
        for c in self._order:
            if c.at_barrier() == checkpoint_id:
                continue
            if c.finished and not c.barriers:
                continue
            return None
        return checkpoint_id

    def release_barrier(self, checkpoint_id: int) -> None:
        """Unblock the channels after checkpoint ``checkpoint_id`` (or drop it when aborted)."""
        for c in self._order:
            while c.barriers and c.barriers[0][0] <= checkpoint_id:
                c.barriers.popleft()

    def __iter__(self) -> Iterator[InputChannel]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


class OutputChannel:
    """The sending end of one channel: its sequence counter, credit and backlog.

    ``transmit(envelope)`` performs the actual send (a Ray call on the
    receiver's data lane); it is injected so the flow-control logic stays
    independent of Ray.

    >>> sent = []
    >>> from raystream.actors.messages import ChannelId, Kind
    >>> out = OutputChannel(ChannelId(0, 0, 0), attempt=0, credits=1, transmit=sent.append)
    >>> out.send(Kind.DATA, ["ref-a"], rows=3); out.send(Kind.DATA, ["ref-b"], rows=3)
    >>> [e.seq for e in sent], out.backlogged()
    ([0], True)
    >>> out.add_credit(1); [e.seq for e in sent], out.backlogged()
    ([0, 1], False)
    """

    def __init__(self, channel: ChannelId, *, attempt: int, credits: int,
                 transmit: Callable[[Envelope], Any]) -> None:
        self.channel = channel
        self.attempt = attempt
        self.credits = credits
        self._transmit = transmit
        self._seq = 0
        self._backlog: collections.deque[Envelope] = collections.deque()
        self.batches_sent = 0
        self.rows_sent = 0
        self.bytes_sent = 0
        self.ended = False  # END_OF_INPUT was put on the channel
        self.announcements = 0  # barrier announcements made on this channel
        self.transmitted_upto = -1  # sequence number of the last message transmitted

    def send(self, kind: Kind, payload: object = None, rows: int = 0, nbytes: int = 0) -> None:
        if self.ended:
            raise RuntimeError(f"{kind.name} sent after END_OF_INPUT on channel {self.channel}")
        self.ended = kind == Kind.END_OF_INPUT
        self._backlog.append(Envelope(self.channel, self._seq, self.attempt, kind, payload, rows,
                                      nbytes=nbytes))
        self._seq += 1
        self.flush()

    def announce(self) -> int:
        """Count a barrier announcement on this channel; returns its 1-based index.
        Messages transmitted from now on carry it (receivers wait for it)."""
        self.announcements += 1
        return self.announcements

    def untransmitted(self, upto: int | None = None) -> list[Envelope]:
        """The messages waiting for credit (up to sequence number ``upto``), oldest first."""
        return [e for e in self._backlog if upto is None or e.seq <= upto]

    def add_credit(self, n: int) -> None:
        self.credits += n
        self.flush()

    def flush(self) -> None:
        while self._backlog:
            head = self._backlog[0]
            if head.kind == Kind.DATA:
                if self.credits <= 0:
                    return
                self.credits -= 1
                self.batches_sent += 1
                self.rows_sent += head.rows
                self.bytes_sent += head.nbytes
            self._backlog.popleft()
            head.announced = self.announcements
            self.transmitted_upto = head.seq
            self._transmit(head)

    def backlogged(self) -> bool:
        return bool(self._backlog)

    @property
    def last_seq(self) -> int:
        """Sequence number of the last message put on this channel (sent or backlogged), -1 if none."""
        return self._seq - 1
