"""The queue of an async I/O operator's calls in flight (Flink's ``StreamElementQueue``).

No threads, no I/O: the operator adds each input as an entry and each watermark as a
marker, tells the queue which entries completed, and asks what may be emitted now
(:meth:`AsyncQueue.ready`). The rules are Flink's ``AsyncWaitOperator``'s:

* **ordered**: results leave in input order; an entry that completed waits for every
  entry before it;
* **unordered**: results leave as they complete, but never across a watermark: the
  entries between two watermarks form a *segment*, only the oldest segment emits, and a
  watermark leaves once every entry before it has;
* either way a watermark leaves in its place, after what came before it.

An entry stays in the queue (and in the checkpoint, :meth:`AsyncQueue.pending`) until
its result has been emitted, so a restore issues exactly the calls whose results the
output does not hold yet.

    >>> q = AsyncQueue(ordered=True)
    >>> a, b = q.add("row a"), q.add("row b")
    >>> q.add_watermark(100)
    >>> q.complete(b, ["B"]); q.ready()  # b waits for a
    []
    >>> q.complete(a, ["A"]); q.ready()
    [Result(entry=0, input='row a', rows=['A']), Result(entry=1, input='row b', rows=['B']), Watermark(watermark=100)]
    >>> len(q)
    0
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Result:
    """An entry's result, to emit: ``rows`` (or batches) in the order the call gave them."""

    entry: int
    input: Any
    rows: list[Any]


@dataclass(frozen=True)
class Watermark:
    """A watermark whose turn has come: every entry before it was emitted."""

    watermark: int


Emit = Result | Watermark


@dataclass
class _Segment:
    """Entries between two watermarks (unordered mode), in input order, and the
    watermark that closes the segment (None: the newest segment, still open)."""

    entries: dict[int, Any] = field(default_factory=dict)  # entry id -> input, in order
    done: dict[int, list[Any]] = field(default_factory=dict)  # entry id -> its result
    watermark: int | None = None


class AsyncQueue:
    """The entries in flight and the watermarks between them (see the module docs)."""

    def __init__(self, *, ordered: bool) -> None:
        self.ordered = ordered
        self._segments: deque[_Segment] = deque([_Segment()])
        self._where: dict[int, _Segment] = {}  # entry id -> its segment, until emitted
        self._next = 0

    def __len__(self) -> int:
        return len(self._where)  # entries not emitted yet

    def input_of(self, entry: int) -> Any:
        """The input of entry ``entry`` (None once emitted)."""
        segment = self._where.get(entry)
        return None if segment is None else segment.entries[entry]

    def add(self, value: Any) -> int:
        """Add an input whose call was issued; returns its entry id."""
        entry = self._next
        self._next += 1
        segment = self._where[entry] = self._segments[-1]
        segment.entries[entry] = value
        return entry

    def add_watermark(self, watermark: int) -> None:
        """A watermark after every entry added so far (a newer one replaces an older one
        still waiting with nothing between them)."""
        last = self._segments[-1]
        if not last.entries and len(self._segments) > 1:
            self._segments[-2].watermark = watermark  # nothing between: the newer one
            return
        last.watermark = watermark
        self._segments.append(_Segment())

    def complete(self, entry: int, rows: list[Any]) -> None:
        """Entry ``entry``'s call gave ``rows`` (an entry no longer queued is ignored: its
        result was emitted, or dropped by :meth:`clear`)."""
        segment = self._where.get(entry)
        if segment is not None:
            segment.done[entry] = rows

    def ready(self) -> list[Emit]:
        """What may be emitted now, in the order to emit it; removed from the queue."""
        out: list[Emit] = []
        while self._segments:
            segment = self._segments[0]
            if self.ordered:
                for entry in list(segment.entries):
                    if entry not in segment.done:
                        return out
                    out.append(self._take(segment, entry))
            else:
                for entry in [e for e in segment.entries if e in segment.done]:
                    out.append(self._take(segment, entry))
                if segment.entries:
                    return out
            if segment.watermark is None:  # the open segment: nothing beyond it
                return out
            out.append(Watermark(segment.watermark))
            self._segments.popleft()
        return out

    def _take(self, segment: _Segment, entry: int) -> Result:
        del self._where[entry]
        return Result(entry, segment.entries.pop(entry), segment.done.pop(entry))

    def pending(self) -> list[tuple[int, Any]]:
        """Every entry not emitted yet, ``(entry id, input)`` in input order: what a
        snapshot keeps (their calls are issued again after a restore)."""
        return [(entry, value) for segment in self._segments
                for entry, value in segment.entries.items()]
