"""A subtask's network input (Flink's ``StreamTaskNetworkInput`` and
``StatusWatermarkValve``): it takes what the input gate let through, hands the batches
to the chain's head, in slices when they are large (an unaligned barrier then waits
for a slice, not a whole batch), returns their credit once processed, combines the
channels' watermarks and ends the head's inputs. No Ray: a batch that came as an object
ref is fetched by the ``fetch`` it is given.

    >>> valve = WatermarkValve(["a", "b"])
    >>> valve.input_watermark("a", 10), valve.input_watermark("b", 7), valve.current
    (None, 7, 7)
    >>> valve.channel_ended("b")  # an ended channel holds nothing back
    10
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import pyarrow as pa

from raystream.actors.channels import InputGate
from raystream.actors.input_credits import InputCredits
from raystream.actors.messages import (MAX_WATERMARK, MIN_WATERMARK, REPLAYED_SEQ, ChannelId,
                                       Envelope, Kind)
from raystream.actors.operator import ChainedOutput, Operator, call_operator
from raystream.core.failpoints import Failpoints


class WatermarkValve:
    """The lowest watermark of the input channels: what the head's event time is. It
    only goes up; a channel that ended counts as the end of time."""

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self._of = {channel: MIN_WATERMARK for channel in channels}
        self.current = MIN_WATERMARK

    def of(self, channel: Hashable) -> int:
        return self._of[channel]

    def input_watermark(self, channel: Hashable, watermark: int) -> int | None:
        """``channel`` reached ``watermark``: the combined watermark if that advanced it."""
        self._of[channel] = max(self._of[channel], watermark)
        return self._combine()

    def channel_ended(self, channel: Hashable) -> int | None:
        return self.input_watermark(channel, MAX_WATERMARK)

    def reopen(self, channel: Hashable) -> None:
        """``channel`` has a new sender: it starts where the combined watermark is (event
        time never goes back)."""
        self._of[channel] = self.current

    def restore(self, watermark: int) -> None:
        """Start every channel at a restored checkpoint's ``watermark`` (never lower):
        a restored job does not re-open what it already fired."""
        if not self._of:
            return
        for channel in self._of:
            self._of[channel] = max(self._of[channel], watermark)
        self.current = max(self.current, watermark)

    def _combine(self) -> int | None:
        combined = min(self._of.values())
        if combined <= self.current:
            return None
        self.current = combined
        return combined


class InputStep(enum.Enum):
    """What processing one envelope did."""

    DATA = "data"  # a batch (its first slice) went to the head
    EVENT = "event"  # a watermark, or the end of one channel
    ENDED = "ended"  # the last open channel ended: every input has


@dataclass
class _InProgress:
    """A received batch handed to the chain slice by slice."""

    envelope: Envelope
    batch: pa.RecordBatch
    step: int  # rows per slice
    offset: int = 0  # rows handed over so far

    def next_slice(self) -> pa.RecordBatch:
        part = self.batch if self.step >= self.batch.num_rows else self.batch.slice(
            self.offset, self.step)
        self.offset += part.num_rows
        return part

    @property
    def done(self) -> bool:
        return self.offset >= self.batch.num_rows

    def remainder(self) -> Envelope:
        """The rows not handed over yet, as a replayable message."""
        rest = self.batch.slice(self.offset)
        return Envelope(self.envelope.channel, REPLAYED_SEQ, self.envelope.attempt, Kind.DATA,
                        [rest], rest.num_rows)


class StreamInput:
    """The input side of a subtask whose head has network inputs. The caller polls the
    gate (under its lock) and hands each envelope to :meth:`process`; while a batch is
    :attr:`in_progress`, it calls :meth:`process_slice` instead."""

    def __init__(self, gate: InputGate, credits: InputCredits, head: Operator, *,
                 slice_bytes: int | None, failpoints: Failpoints,
                 fetch: Callable[[Any], pa.RecordBatch]) -> None:
        self.gate, self.credits, self.head = gate, credits, head
        self.head_inputs = {c.input_index: ChainedOutput(head, c.input_index) for c in gate}
        self.valve = WatermarkValve(gate.channels)
        self.slice_bytes = slice_bytes
        self.failpoints = failpoints
        self.fetch = fetch
        self.in_progress: _InProgress | None = None
        self.records_in = self.batches_in = self.bytes_in = 0

    @property
    def watermark(self) -> int:
        return self.valve.current

    def restore_watermark(self, watermark: int) -> None:
        self.valve.restore(watermark)

    def reopen(self, channel: ChannelId) -> None:
        """``channel``'s sender was restored alone (the gate reopened it): a batch of its
        failed attempt still being handed over is dropped with the rest."""
        self.valve.reopen(channel)
        self.credits.reopen(channel)
        if self.in_progress is not None and self.in_progress.envelope.channel == channel:
            self.in_progress = None

    def process(self, envelope: Envelope) -> InputStep:
        channel = self.gate.channels[envelope.channel]
        if envelope.kind == Kind.DATA:
            self.failpoints.hit("in_processing")
            batch = envelope.payload[0]
            if not isinstance(batch, pa.RecordBatch):
                batch = self.fetch(batch)
            self.records_in += batch.num_rows
            self.batches_in += 1
            self.bytes_in += batch.nbytes
            if envelope.seq != REPLAYED_SEQ:  # a replayed one cost no credit
                self.credits.consumed(channel.channel, nbytes=batch.nbytes)
            step = batch.num_rows
            if self.slice_bytes is not None and batch.nbytes > self.slice_bytes:
                step = max(1, batch.num_rows * self.slice_bytes // batch.nbytes)
            self.in_progress = _InProgress(envelope, batch, step)
            self.process_slice()
            return InputStep.DATA
        if envelope.kind == Kind.WATERMARK:
            self._advanced(self.valve.input_watermark(channel.channel, envelope.payload))
            return InputStep.EVENT
        if envelope.kind != Kind.END_OF_INPUT:
            raise TypeError(f"unknown envelope kind {envelope.kind!r}")
        channel.finished = True
        self._advanced(self.valve.channel_ended(channel.channel))
        index = channel.input_index
        if all(c.finished for c in self.gate if c.input_index == index):
            call_operator(self.head, "end_input", index)
        return InputStep.ENDED if self.gate.all_finished() else InputStep.EVENT

    def process_slice(self) -> None:
        """Hand the next slice of the batch in progress to the head; its credit goes
        back once the whole batch is processed."""
        progress = self.in_progress
        if progress is None:
            raise RuntimeError("no received batch is in progress")
        part = progress.next_slice()
        channel = self.gate.channels[progress.envelope.channel]
        self.head_inputs[channel.input_index].emit(part)
        if progress.done:
            self.in_progress = None
            if progress.envelope.seq != REPLAYED_SEQ:
                self.credits.processed(channel.channel)

    def _advanced(self, watermark: int | None) -> None:
        if watermark is not None:
            call_operator(self.head, "process_watermark", watermark)
