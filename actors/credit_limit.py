"""How many credits a receiver lets each sender hold: data in flight bounded in time.

A receiver grants each input channel up to ``credits`` messages, and a sender
coalesces up to 256 KiB of rows into one message (actors/record_writer.py). With
a fixed number of credits the data in flight is fixed in *bytes*, so its cost in
*time* grows as the receiver slows down: a backpressured keyed Python function
with 8 credits on each of its channels holds more than a second of input queued.
An aligned barrier waits behind all of it, so checkpoints take that much longer,
a failover replays that much more, and every record waits that long.

Flink bounds the data in flight in time by shrinking its buffers (buffer
debloating, FLIP-183). Here a message costs a Ray call whatever its size, so
small messages cost throughput (a fifth of it in bench/checkpoint_overhead.py's
keyed job, at 32 KiB); the receiver keeps the messages and returns fewer credits
instead: it measures the rate at which it consumes its input and the size of the
messages it receives, and lets each channel's sender hold ``rate x target /
(channels x message size)`` credits (at least :data:`MIN_CREDITS`, at most the
job's ``credits``). A receiver that keeps up consumes at the input rate and its
senders never wait.

A sender starts with :data:`MIN_CREDITS` (:func:`initial_credits`), the
receiver keeping the rest of each channel's ``credits`` back until it has
measured a rate: started with all of them, a restored job's senders filled
every channel at once, and the first checkpoint after a recovery waited 1.5
to 2.3 s for its barriers behind that data (0.3 s in the steady state), all of
it replayed again by a failure meanwhile.

No Ray and no clock here: the subtask feeds the batches it consumed and the time.

    >>> limit = CreditLimit(target_s=0.5, channels=2, credits=8)
    >>> limit.update(now=0.0); limit.allowed  # until it has measured a rate: the start
    1
    >>> for _ in range(10):
    ...     limit.consumed(256 * 1024)  # 2.5 MiB of 256 KiB messages in 0.2 s
    >>> limit.update(now=0.2); limit.allowed  # 13 MB/s x 0.5 s over 2 channels: 12 each
    8
    >>> for k in range(2, 30):
    ...     limit.consumed(256 * 1024); limit.update(now=0.2 * k)  # slowed to 1.3 MB/s
    >>> limit.allowed  # 1.3 MB/s x 0.5 s = 2.5 messages over 2 channels
    2
"""

from __future__ import annotations

import math

# The default target: checkpoints every second stay clear of their alignment.
DEFAULT_IN_FLIGHT_MS = 200.0
# One is enough: while the receiver processes a message, the sender cuts the next one
# into its backlog, and it travels when the credit comes back (a Ray call, ~1 ms,
# against ~80 ms to process 256 KiB in the keyed bench job); and a receiver with
# several input channels has the others' messages meanwhile. Measured with the bench
# job: 2 left checkpointed_over_plain at 0.66-0.75 and recovery at 2.2-2.4 s, 1 gave
# 0.82 and 2.0 s (the no-checkpoint rate unchanged, ~270k rows/s).
MIN_CREDITS = 1
PERIOD_S = 0.2  # how often the rate is measured (Flink's debloating period)
SMOOTHING = 0.5  # weight of the newest measurement in the moving averages


def initial_credits(credits: int, limited: bool) -> int:
    """The credits a sender holds when its channel opens: all ``credits``, or, where the
    receiver limits them (``limited``), :data:`MIN_CREDITS` until it has measured its
    rate (sender and receiver both compute it from the job's settings)."""
    return min(credits, MIN_CREDITS) if limited else credits


class CreditLimit:
    """The credits a receiver lets the sender of each of its input channels hold."""

    def __init__(self, *, target_s: float, channels: int, credits: int,
                 period_s: float = PERIOD_S) -> None:
        if not target_s > 0:
            raise ValueError(f"the in-flight target must be > 0 s, got {target_s}")
        self.target_s = target_s
        self.channels = max(1, channels)
        self.credits = credits
        self.period_s = period_s
        self.allowed = initial_credits(credits, True)
        self.rate: float | None = None  # bytes consumed per second, smoothed
        self.message_bytes: float | None = None  # bytes per message, smoothed
        self._bytes = 0
        self._messages = 0
        self._since: float | None = None

    def consumed(self, nbytes: int) -> None:
        """The receiver processed a message of ``nbytes``."""
        self._bytes += nbytes
        self._messages += 1

    def update(self, now: float) -> None:
        """Measure once a period has passed since the last measurement and set
        :attr:`allowed` from the smoothed rate and message size."""
        if self._since is None:  # the first call starts the clock
            self._since = now
        elapsed = now - self._since
        if elapsed < self.period_s:
            return
        rate = self._bytes / elapsed
        self.rate = rate if self.rate is None else self.rate + SMOOTHING * (rate - self.rate)
        if self._messages:
            size = self._bytes / self._messages
            self.message_bytes = size if self.message_bytes is None else (
                self.message_bytes + SMOOTHING * (size - self.message_bytes))
        self._bytes, self._messages, self._since = 0, 0, now
        if self.message_bytes:
            wanted = math.ceil(self.rate * self.target_s / (self.channels * self.message_bytes))
            self.allowed = max(min(MIN_CREDITS, self.credits), min(self.credits, wanted))
