"""Nexmark as split-based bounded sources: one stream per event kind.

The first ``events`` Nexmark events (event numbers ``0 .. events-1``) are dealt
into ``num_splits`` interleaved splits by *blocks* of ``total_proportion`` (50)
event numbers: split ``i`` has blocks ``i``, ``i + num_splits``, ... So every
split runs through the whole event time at the same pace, as the reference's
parallel generators do, and the watermark (the minimum over splits) keeps up with
all of them; and every split holds the three kinds in the generator's proportions
(1 person, 3 auctions, 46 bids per block), so the readers of one kind carry equal
loads: dealt number by number, 4 splits would give the persons all to two of them
and the auctions 1 : 2, and at parallelism 2 the lighter auction reader fell behind
in event time, holding back the watermark of q4's join. A split's reader generates, a
batch at a time, the events of its kind among its event numbers (event ``n`` is
a pure function of ``(seed, n)``, so a restored reader regenerates exactly what
it had not emitted). The three kinds share event numbers, so ``persons``,
``auctions`` and ``bids`` built with the same ``events`` and config are the three
views of one Nexmark run (as the reference's ``person``, ``auction`` and ``bid``
views over its one ``datagen`` table). Three streams rather than one union:
their schemas differ, and every query reads one or two of them.

Each split's events are in event-time order, and watermarks are per split, so
the streams carry a watermark that never makes a generated event late.

    >>> import pyarrow.compute as pc, raystream as rs
    >>> from raystream import nexmark
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> bids = nexmark.bids(env, 50_000, nexmark.NexmarkConfig(seed=1))
    >>> sink = bids.filter_batches(lambda b: pc.equal(b["auction"], 1000)).collect()
    >>> env.execute("bids").table(sink).num_rows  # doctest: +SKIP
    ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from raystream.engine.datastream import DataStream
from raystream.engine.environment import StreamEnvironment
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.watermarks import BoundedOutOfOrderness
from raystream.nexmark.generator import SCHEMAS, EventKind, NexmarkConfig, generate_numbers

TIMESTAMP = "date_time"  # every Nexmark event's event-time column (int64 ms)


@dataclass(frozen=True)
class NexmarkSource(Source):
    """The events of ``kind`` among the first ``events`` Nexmark events.

    A split is ``(first, step, events, block)``: the event numbers below ``events`` of
    blocks ``first, first + step, ...`` of ``block`` numbers. ``batch_size`` is the span
    of event numbers a batch covers (a bid batch holds ~92 % of its split's numbers in
    it); splits never depend on the job's parallelism. A reader's position counts its
    split's event numbers read.

        >>> src = NexmarkSource(EventKind.PERSON, 260, num_splits=2, batch_size=128)
        >>> src.splits()
        [(0, 2, 260, 50), (1, 2, 260, 50)]
        >>> r = src.reader((1, 2, 260, 50)); r.next_batch()["id"].to_pylist(), r.position
        ([1001, 1003], 64)
        >>> r.next_batch()["id"].to_pylist(), r.position, r.next_batch()
        ([1005], 110, None)
    """

    kind: EventKind
    events: int
    config: NexmarkConfig = field(default_factory=NexmarkConfig)
    num_splits: int = 4
    batch_size: int = 65_536

    def __post_init__(self) -> None:
        if self.events < 0 or self.num_splits <= 0 or self.batch_size <= 0:
            raise ValueError(f"NexmarkSource({self.kind.value}) needs events >= 0, "
                             f"num_splits > 0 and batch_size > 0")

    def produced_columns(self) -> tuple[str, ...]:
        return tuple(SCHEMAS[self.kind].names)

    def splits(self) -> list[tuple[int, int, int, int]]:
        block = self.config.total_proportion
        step = min(self.num_splits, -(-self.events // block))
        return [(first, step, self.events, block) for first in range(step)]

    def reader(self, split: tuple[int, int, int, int], position: int = 0) -> "NexmarkReader":
        first, step, events, block = split  # (a list, from JSON)
        return NexmarkReader(self, (first, step, events, block), position)

    def split_id(self, split) -> str:
        first, step, events, block = split
        return f"{first}/{step}/{events}/{block}"


class NexmarkReader(SplitReader):
    """Reads one split's event numbers, ``batch_size // step`` of them per batch."""

    def __init__(self, source: NexmarkSource, split: tuple[int, int, int, int],
                 position: int) -> None:
        self.source = source
        self.first, self.step, events, self.block = split
        blocks = range(self.first, -(-events // self.block), self.step)
        # the split's event numbers: its blocks, the last one cut at ``events``
        self.count = len(blocks) * self.block - (
            max(0, (blocks[-1] + 1) * self.block - events) if blocks else 0)
        self.position = position
        self.per_batch = max(1, source.batch_size // self.step)

    def next_batch(self) -> pa.RecordBatch | None:
        if self.position >= self.count:
            return None
        hi = min(self.position + self.per_batch, self.count)
        i = np.arange(self.position, hi, dtype=np.int64)  # the split's i-th event number:
        n = (self.first + self.step * (i // self.block)) * self.block + i % self.block
        self.position = hi
        return generate_numbers(self.source.kind, n, self.source.config)


def _stream(env: StreamEnvironment, kind: EventKind, events: int, config: NexmarkConfig | None,
            num_splits: int, batch_size: int, name: str | None) -> DataStream:
    source = NexmarkSource(kind, events, config or NexmarkConfig(),
                           num_splits=num_splits, batch_size=batch_size)
    return env.from_source(source, name=name or kind.value,
                           watermarks=BoundedOutOfOrderness(TIMESTAMP, bound_ms=0))


def persons(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
            num_splits: int = 4, batch_size: int = 65_536,
            name: str | None = None) -> DataStream:
    """The person events among the first ``events`` Nexmark events (2 % of them)."""
    return _stream(env, EventKind.PERSON, events, config, num_splits, batch_size, name)


def auctions(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
             num_splits: int = 4, batch_size: int = 65_536,
             name: str | None = None) -> DataStream:
    """The auction events among the first ``events`` Nexmark events (6 % of them)."""
    return _stream(env, EventKind.AUCTION, events, config, num_splits, batch_size, name)


def bids(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
         num_splits: int = 4, batch_size: int = 65_536,
         name: str | None = None) -> DataStream:
    """The bid events among the first ``events`` Nexmark events (92 % of them)."""
    return _stream(env, EventKind.BID, events, config, num_splits, batch_size, name)
