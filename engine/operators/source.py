"""The source operator of split-based sources (the contract the subtask drives,
:class:`~raystream.actors.operator.SourceOperator`, is in :mod:`raystream.actors.operator`).

:class:`SourceReaderOperator` is a split-based source's reader (FLIP-27): it
gets its splits from the source's enumerator (an operator coordinator in the
job master, :mod:`raystream.engine.sources.split_enumerator`), reads them
round-robin, one batch at a time (so each split advances at a similar pace),
and generates watermarks per split: the subtask's watermark is the minimum
over its unfinished splits (Flink's per-split watermarks), so a slow split
never makes another split's records late. Its state is its splits with their
positions and largest timestamps, as JSON; a split it has finished is in no
state any more, and one not yet assigned is in the enumerator's. On restore
at the same parallelism each reader takes its own splits back; at another
parallelism the old readers' splits are dealt out again.
"""

from __future__ import annotations

import json
from typing import Any

from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK
from raystream.actors.operator import (CountsReadRows, OperatorSnapshot, RestoredState,
                                       SourceOperator)
from raystream.engine.sources.base import DEAD_LETTERS, Source, SplitReader
from raystream.engine.sources.split_enumerator import (EnumeratorEvent, NoMoreSplits,
                                                       ReaderRegistered, SourceEvent,
                                                       SplitRequested, SplitsAssigned)
from raystream.engine.watermarks import BoundedOutOfOrderness


class SourceReaderOperator(CountsReadRows, SourceOperator):
    """The reader of a split-based :class:`Source` in one subtask (Flink FLIP-27
    ``SourceReader``): it registers with the source's enumerator, reads the splits the
    enumerator assigns (see the module docstring), asks for more when it has none, and
    ends once the enumerator said no more will come and its splits are read."""

    def __init__(self, name: str, source: Source,
                 watermarks: BoundedOutOfOrderness | None = None) -> None:
        super().__init__(name)
        self.source = source
        self.watermarks = watermarks
        self.splits: dict[str, Any] = {}  # split id -> split, for the ones being read
        self.readers: dict[str, SplitReader] = {}
        self.split_max_ts: dict[str, int] = {}
        self._order: list[str] = []
        self._next = 0
        self._watermark = MIN_WATERMARK
        self.no_more_splits = False
        self.requested = False  # a split request is on its way and not answered yet
        self.finished = False
        self._restored: list[list[Any]] = []  # [split, position, max_ts]
        self.records_read = 0  # by this attempt
        self.dead_letters = 0  # unreadable splits skipped by this attempt

    def initialize_state(self, restored: RestoredState | None) -> None:
        states = [json.loads(blob) for blob in restored.operator_states] if restored else []
        if any("splits" not in state for state in states):
            raise ValueError(f"source '{self.name}': the checkpoint holds its state in the "
                             f"format of raystream before split enumerators (split positions "
                             f"without the splits); it cannot be restored by this version")
        p, index = self.ctx.parallelism, self.ctx.subtask_index
        if all(state["parallelism"] == p for state in states):
            self._restored = [entry for state in states if state["subtask"] == index
                              for entry in state["splits"]]
        else:  # rescaled: the old readers' splits are dealt out again
            entries = sorted((e for state in states for e in state["splits"]),
                             key=lambda e: self.source.split_id(e[0]))
            self._restored = [e for k, e in enumerate(entries) if k % p == index]

    def open(self) -> None:
        for split, position, max_ts in self._restored:
            self.add_split(split, position, max_ts)
        self.ctx.send_event_to_coordinator(ReaderRegistered())

    def handle_operator_event(self, event: EnumeratorEvent) -> None:
        match event:
            case SplitsAssigned(splits):
                for split in splits:
                    self.add_split(split)
                self.requested = False
            case NoMoreSplits():
                self.no_more_splits = True
                self.requested = False
            case SourceEvent(payload):
                self.source.handle_source_event(self, payload)
            case _:
                raise ValueError(f"source '{self.name}': unknown event {event!r}")

    def add_split(self, split: Any, position: int = 0, max_ts: int = MIN_WATERMARK) -> None:
        split_id = self.source.split_id(split)
        if split_id in self.readers:
            raise ValueError(f"source '{self.name}': two splits have the id {split_id!r}")
        self.splits[split_id] = split
        self.readers[split_id] = self.source.reader(split, position)
        self.split_max_ts[split_id] = max_ts
        self._order.append(split_id)

    def is_available(self) -> bool:
        # without a split, it waits for the enumerator's answer (an event wakes it)
        return bool(self._order) or self.no_more_splits or not self.requested

    def emit_next(self) -> bool:
        """Emit the next batch of the next split (round-robin); ask for splits when none
        is left; False once no more will come and every split is read."""
        while self._order:
            self._next %= len(self._order)
            split_id = self._order[self._next]
            batch = self.readers[split_id].next_batch()
            if batch is None:
                reader = self.readers.pop(split_id)
                reader.close()
                if reader.dead_letter is not None:  # with the split's end: once per split
                    self.emit_side(DEAD_LETTERS, reader.dead_letter)
                    self.dead_letters += 1
                self.split_max_ts.pop(split_id)
                self.splits.pop(split_id)
                self._order.remove(split_id)
                self._advance_watermark()
                continue
            self._next += 1
            if self.watermarks is not None:
                ts = self.watermarks.max_timestamp(batch)
                self.split_max_ts[split_id] = max(self.split_max_ts[split_id], ts)
            if batch.num_rows:
                self.records_read += batch.num_rows
                self.output.emit(batch)
            self._advance_watermark()
            return True
        if self.no_more_splits:
            if not self.finished:
                self.finished = True
                self._emit_watermark(MAX_WATERMARK)  # end of input: every window may fire
            return False
        if not self.requested:
            self.requested = True
            self.ctx.send_event_to_coordinator(SplitRequested())
        return True

    @property
    def emitted_watermark(self) -> int:
        return self._watermark

    def metrics(self) -> dict[str, float]:
        return {"records_read": self.records_read, "splits_open": len(self.readers),
                "dead_letters": self.dead_letters}

    def waiting_for(self) -> str | None:
        if self.finished:
            return None
        if self._order:
            return f"source '{self.name}' reading {len(self._order)} split(s)"
        if self.no_more_splits:
            return f"source '{self.name}' read every split and was told no more will come"
        if self.requested:
            return (f"source '{self.name}' has no split and waits for its enumerator's "
                    f"answer (splits or no more splits)")
        return f"source '{self.name}' has no split and has not asked for one yet"

    def end_input_early(self) -> None:
        """Stop reading (drain) and advance event time to the end; the splits keep
        their positions, so the final savepoint records where reading stopped."""
        self.finished = True
        self._emit_watermark(MAX_WATERMARK)

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()

    def _advance_watermark(self) -> None:
        if self.watermarks is None or not self._order:
            return
        candidate = min(self.watermarks.watermark_for(ts) for ts in self.split_max_ts.values())
        self._emit_watermark(candidate)

    def _emit_watermark(self, watermark: int) -> None:
        if watermark > self._watermark:
            self._watermark = watermark
            self.output.emit_watermark(watermark)

    def positions(self) -> dict[str, int]:
        return {split_id: reader.position for split_id, reader in self.readers.items()}

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        splits = [[self.splits[split_id], self.readers[split_id].position,
                   self.split_max_ts[split_id]] for split_id in self._order]
        state = json.dumps({"subtask": self.ctx.subtask_index,
                            "parallelism": self.ctx.parallelism, "splits": splits}).encode()
        return OperatorSnapshot(operator_state=lambda: state)
