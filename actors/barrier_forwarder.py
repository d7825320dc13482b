"""A subtask's barriers on its way out: announced on every output channel.

Unaligned, a barrier overtakes what is still queued (waiting for credit),
which is captured as output channel state. Aligned, it sits behind it; with
a timeout, the channels with data queued before it are watched until that
data is sent, or until the timeout turns the barrier unaligned there and it
is announced again, ahead of that data, which becomes output channel state
(Flink: a timed-out aligned barrier becomes a priority event).

No Ray: ``announce(channel, barrier, upto)`` performs the announcement (a
Ray call on the receiver's control lane), as ``OutputChannel`` is given its
``transmit``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from raystream.actors.barrier_handler import unaligned_now
from raystream.actors.channel_state import OutputStateCapture
from raystream.actors.channels import OutputChannel
from raystream.actors.messages import ChannelId, Kind
from raystream.checkpoint.barrier import Barrier

# announce(output channel, barrier, upto): tell the receiver where the barrier sits
Announce = Callable[[OutputChannel, Barrier, int], None]


class BarrierForwarder:
    """Announces barriers on ``outputs``; keeps the output channel state of aligned
    barriers with a timeout still queued behind data until it is settled."""

    def __init__(self, outputs: dict[ChannelId, OutputChannel], announce: Announce) -> None:
        self.outputs = outputs
        self.announce = announce
        # aligned barriers with a timeout still queued behind output, by id
        self.pending: dict[int, tuple[Barrier, OutputStateCapture]] = {}

    def forward(self, barrier: Barrier, unaligned: bool) -> OutputStateCapture:
        """Announce ``barrier`` on every output channel (``unaligned``: ahead of what is
        queued); return the output channel state."""
        n = barrier.checkpoint_id
        capture = OutputStateCapture(n)
        capture.unaligned = unaligned
        announced = dataclasses.replace(barrier, unaligned=True) if unaligned else barrier
        for out in self.outputs.values():
            queued = out.untransmitted()
            if out.ended and (not unaligned or not queued):
                continue  # the receiver records up to END_OF_INPUT instead
            if unaligned:  # ahead of what is queued (END_OF_INPUT stays after it)
                capture.capture(out.channel, [e for e in queued if e.kind != Kind.END_OF_INPUT])
                self.announce(out, announced, out.transmitted_upto)
            else:
                self.announce(out, barrier, out.last_seq)
                if barrier.aligned_timeout_ms is not None and out.transmitted_upto < out.last_seq:
                    capture.await_channel(out.channel, out.last_seq)
        capture.seal()
        if not capture.done.is_set():
            self.pending[n] = (barrier, capture)
        return capture

    def settle(self, wall_ms: Callable[[], float]) -> None:
        """Settle each awaited channel whose data before the barrier is sent; past the
        timeout, announce the barrier again as unaligned, ahead of that data."""
        for n, (barrier, capture) in list(self.pending.items()):
            for channel, upto in list(capture.awaiting.items()):
                out = self.outputs[channel]
                if out.transmitted_upto >= upto:
                    capture.settle(channel)
                elif unaligned_now(barrier, wall_ms):
                    capture.capture(channel, out.untransmitted(upto))
                    capture.unaligned = True
                    self.announce(out, dataclasses.replace(barrier, unaligned=True),
                                  out.transmitted_upto)
                    capture.settle(channel)
            capture.seal()
            if capture.done.is_set():
                del self.pending[n]

    def cancel(self, upto: int) -> None:
        """Checkpoints up to ``upto`` were aborted: stop awaiting their output state."""
        for n in [n for n in self.pending if n <= upto]:
            self.pending.pop(n)[1].cancel()

    def next_deadline_ms(self) -> float | None:
        # each pending barrier has a timeout (only then are channels awaited)
        deadlines = [d for b, _ in self.pending.values() if (d := b.timeout_at_ms) is not None]
        return min(deadlines) if deadlines else None
