"""The output of a chain onto one job edge: partition, buffer, ``ray.put`` once, send.

Every object sent through Ray costs a roughly fixed amount (a put into shared
memory, an actor call, a get), whatever its size, so small batches make a
shuffle slow: a 8,192-row batch split over two subtasks is two ~100 KB
objects. Like Flink's network buffers, the writer therefore coalesces each
channel's rows until ``buffer_bytes`` are pending, and flushes earlier when
order or latency requires it:

* before a watermark, a barrier or end of input (they must follow the data);
* when the subtask has nothing else to do (idle);
* when the oldest pending rows are ``buffer_timeout_ms`` old (Flink's buffer
  timeout: 0 sends after every batch, -1 never on a timer, only the rules above).

The last two are *opportunistic* (:meth:`RecordWriter.flush_ready`): they send only
on channels that can transmit at once (credit, nothing backlogged). A channel out
of credit keeps gathering its rows into one batch instead of queueing many small
ones behind its backlog: they could not travel sooner, and each message costs the
receiver the same whatever its size, so a backpressured source would otherwise
send ever smaller messages, each covering less event time, and fall behind.

Small objects travel inside the call (Ray inlines arguments below 100 KiB);
larger ones are ``ray.put`` once. A broadcast puts one object for every
channel and is not buffered.

    >>> import pyarrow as pa
    >>> from raystream.actors.channels import OutputChannel
    >>> from raystream.actors.messages import ChannelId
    >>> from raystream.actors.partitioners import ForwardPartitioner
    >>> sent = []
    >>> out = OutputChannel(ChannelId(0, 0, 0), attempt=0, credits=8, transmit=sent.append)
    >>> writer = RecordWriter(ForwardPartitioner(), [out], buffer_bytes=1 << 20)
    >>> writer.emit(pa.record_batch({"x": [1, 2]})); writer.emit(pa.record_batch({"x": [3]}))
    >>> len(sent), writer.flush(), [e.rows for e in sent]
    (0, None, [3])
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import ray

from raystream.actors.channels import OutputChannel
from raystream.actors.messages import Kind
from raystream.actors.partitioners import BroadcastPartitioner, Partitioner

# Below this a batch travels inside the call: no shared-memory put and get.
INLINE_BATCH_BYTES = 64 * 1024
# Big enough to merge the parts a shuffle cuts a batch into, small enough that
# credits x buffer (the data an aligned barrier queues behind) stays ~2 MiB.
DEFAULT_BUFFER_BYTES = 256 * 1024
DEFAULT_BUFFER_TIMEOUT_MS = 50.0


def check_buffer_timeout(ms: float) -> float:
    """``ms`` as a buffer timeout: >= 0, or -1 for none."""
    if not (ms >= 0 or ms == -1):
        raise ValueError(f"buffer_timeout_ms must be >= 0 (0: send every batch at once) "
                         f"or -1 (send when the buffer is full), got {ms}")
    return float(ms)


class RecordWriter:
    def __init__(self, partitioner: Partitioner, channels: list[OutputChannel], *,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 buffer_timeout_ms: float = DEFAULT_BUFFER_TIMEOUT_MS) -> None:
        self.partitioner = partitioner
        self.channels = channels
        self.buffer_bytes = buffer_bytes
        self.buffer_timeout_ms = check_buffer_timeout(buffer_timeout_ms)
        self._timeout_s = None if buffer_timeout_ms < 0 else buffer_timeout_ms / 1000
        self._buffered = not isinstance(partitioner, BroadcastPartitioner)
        self._pending: list[list[pa.RecordBatch]] = [[] for _ in channels]
        self._pending_bytes = [0] * len(channels)
        self._oldest: float | None = None  # when the oldest pending rows arrived

    def emit(self, batch: pa.RecordBatch) -> None:
        if not self._buffered:
            ref = batch_payload(batch)
            for index, part in self.partitioner.route(batch):
                self.channels[index].send(Kind.DATA, [ref], part.num_rows, part.nbytes)
            return
        for index, part in self.partitioner.route(batch):
            pending = self._pending[index]
            if pending and not pending[0].schema.equals(part.schema):
                self._flush_channel(index)  # batches of one object share a schema
                pending = self._pending[index]
            pending.append(part)
            self._pending_bytes[index] += part.nbytes
            if self._oldest is None:
                self._oldest = time.monotonic()
            if self._pending_bytes[index] >= self.buffer_bytes:
                self._flush_channel(index)
        if self._timeout_s == 0:
            self.flush_ready()

    def flush(self) -> None:
        """Send every channel's pending rows now (into its backlog when out of credit)."""
        for index in range(len(self.channels)):
            if self._pending[index]:
                self._flush_channel(index)
        self._oldest = None

    def flush_ready(self) -> None:
        """Send the pending rows of the channels that can transmit them at once."""
        for index, channel in enumerate(self.channels):
            if self._pending[index] and channel.credits > 0 and not channel.backlogged():
                self._flush_channel(index)
        if not any(self._pending):
            self._oldest = None  # else still due: the rest go when their credit returns

    def flush_if_due(self, now: float) -> None:
        if (self._oldest is not None and self._timeout_s is not None
                and now - self._oldest >= self._timeout_s):
            self.flush_ready()

    def _flush_channel(self, index: int) -> None:
        parts = self._pending[index]
        batch = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        self._pending[index] = []
        self._pending_bytes[index] = 0
        self.channels[index].send(Kind.DATA, [batch_payload(batch)], batch.num_rows, batch.nbytes)

    def emit_watermark(self, watermark: int) -> None:
        self.flush()
        for channel in self.channels:
            channel.send(Kind.WATERMARK, watermark)

    def end_input(self) -> None:
        self.flush()
        for channel in self.channels:
            channel.send(Kind.END_OF_INPUT)


def batch_payload(batch: pa.RecordBatch) -> Any:
    """How a batch travels in a message: inline when small, else one ``ray.put``."""
    return batch if batch.nbytes < INLINE_BATCH_BYTES else ray.put(batch)
