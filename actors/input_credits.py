"""The credits of a subtask's input channels: what each sender holds, and what the
subtask gives back when (Flink's credit-based flow control, the receiver's side).

No Ray and no clock here (as :mod:`raystream.actors.credit_limit`): the subtask reports
each message that cost a credit and each batch it has processed, and asks which
credits to return now; it makes the Ray calls.

    >>> credits = InputCredits(["c"], credits=4, in_flight_s=None)
    >>> credits.start  # every sender starts with all of them
    4
    >>> for _ in range(3):
    ...     credits.consumed("c", nbytes=100)
    >>> credits.processed("c")
    >>> credits.returns(idle=False, now=0.0)  # one back is fewer than a group of 2
    []
    >>> credits.returns(idle=True, now=0.0)  # idle, its sender down to 1: it may be waiting
    [('c', 1)]
"""

from __future__ import annotations

import collections
from typing import Generic, Hashable, Iterable, TypeVar

from raystream.actors.credit_limit import CreditLimit, initial_credits

Channel = TypeVar("Channel", bound=Hashable)


class InputCredits(Generic[Channel]):
    """Credits of the input ``channels`` of a subtask whose senders may hold ``credits``
    messages each (fewer, as :class:`CreditLimit` allows, with ``in_flight_s``)."""

    def __init__(self, channels: Iterable[Channel], *, credits: int,
                 in_flight_s: float | None) -> None:
        channels = list(channels)
        # as many as this subtask's senders start with (and its own receivers: the same
        # job settings)
        self.start = start = initial_credits(credits, in_flight_s is not None)
        # the credits each sender still holds, as far as we know; the rest of its
        # ``credits`` wait here to be returned (the limit keeps some back at the start)
        self.held = {channel: start for channel in channels}
        self.pending: collections.Counter[Channel] = collections.Counter(
            {channel: credits - start for channel in channels if credits > start})
        self.batch = max(1, credits // 2)
        self.credits = credits
        self.limit = None if in_flight_s is None or not channels else (
            CreditLimit(target_s=in_flight_s, channels=len(channels), credits=credits))

    def consumed(self, channel: Channel, *, nbytes: int) -> None:
        """A message of ``nbytes`` that cost its sender a credit arrived on ``channel``."""
        self.held[channel] -= 1
        if self.limit is not None:
            self.limit.consumed(nbytes)

    def reopen(self, channel: Channel) -> None:
        """``channel`` has a new sender (a region failover): it starts as a first one."""
        self.held[channel] = self.start
        self.pending.pop(channel, None)
        if self.credits > self.start:
            self.pending[channel] = self.credits - self.start

    def processed(self, channel: Channel) -> None:
        """The batch of such a message is processed: its credit may go back."""
        self.pending[channel] += 1

    def returns(self, *, idle: bool, now: float) -> list[tuple[Channel, int]]:
        """The credits to return now, per channel: in groups of ``batch``, and when
        ``idle`` also to any sender left with fewer than that (it may be blocked, waiting
        for them); never beyond what the limit lets a sender hold.

        Not one by one, even when idle: every return is a Ray call, and submitting one
        cost a map subtask as much of its loop as the rows did at ``buffer_timeout_ms=1``
        on a busy machine (bench/latency.py under py-spy)."""
        if not self.pending:
            return []
        limit, batch = self.limit, self.batch
        if limit is not None:  # a sender holds no more than its share of the time in flight
            limit.update(now)
            batch = max(1, min(batch, limit.allowed // 2))
        out = []
        for channel, n in list(self.pending.items()):
            held = self.held[channel]
            give = n if limit is None else min(n, limit.allowed - held)
            if give > 0 and (give >= batch or (idle and held < batch)):
                out.append((channel, give))
                self.held[channel] += give
                self.pending[channel] -= give
                if not self.pending[channel]:
                    del self.pending[channel]
        return out

    @property
    def allowed(self) -> int | None:
        """The credits each sender may hold now (None: no limit)."""
        return None if self.limit is None else self.limit.allowed
