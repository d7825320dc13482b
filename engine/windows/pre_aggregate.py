"""Local pre-aggregation before the key_by shuffle (FLINK-9428's motivating case).

Each upstream subtask combines its rows per (key, window) into partial
aggregates and sends only those downstream, where the window operator merges
them. It flushes its buffer when it holds ``max_buffered_rows`` partial rows,
before it forwards a watermark (so partials always precede the watermark that
fires their window), at the end of the input, and always in
``prepare_snapshot_pre_barrier`` — so the partials land before the barrier and
its own checkpointed state is empty.

Used automatically by ``window(...)`` aggregations with built-in aggregates
on tumbling, sliding or cumulating event-time windows, column keys and no late side
output (partials cannot hold the original late records).

Sliding windows whose size is a multiple of the slide are pre-aggregated per
*pane* (the slide-long tumbling windows that tile them; Flink SQL's slices):
a row is in one pane but in ``size / slide`` windows, so the partials are
fewer, and the window operator adds each pane's partials to its windows.
Cumulating windows are pre-aggregated per step-long pane likewise.
"""

from __future__ import annotations

import pyarrow as pa

from raystream.actors.operator import Operator, OperatorSnapshot
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.assigners import WindowAssigner
from raystream.engine.windows.operator import event_times
from raystream.engine.windows.store import WINDOW_START, is_identity


class WindowPreAggregator(Operator):
    """Partial aggregates per (key columns, window) of the rows it sees.

        >>> import pyarrow as pa
        >>> from raystream.actors.operator import CollectingOutput, RuntimeContext
        >>> from raystream.engine.windows.assigners import TumblingEventTimeWindows
        >>> pre = WindowPreAggregator("pre", ["user"], TumblingEventTimeWindows(size_ms=10),
        ...                           timestamp="ts", spec=AggregateSpec.of({"n": ("count", None)}))
        >>> out = CollectingOutput(); pre.setup(RuntimeContext.local(), out)
        >>> pre.process_batch(pa.record_batch({"user": ["a", "a", "b"], "ts": [1, 2, 15]}))
        >>> pre.process_watermark(20)
        >>> out.batches[0].to_pydict()
        {'user': ['a', 'b'], '__window_start': [0, 10], '__n.n': [2, 1]}
    """

    def __init__(self, name: str, key_columns: list[str], assigner: WindowAssigner, *,
                 timestamp: str, spec: AggregateSpec, max_buffered_rows: int = 65536) -> None:
        super().__init__(name)
        self.key_columns = list(key_columns)
        self.assigner = assigner
        # what the partials are per: the panes of sliding windows, else the windows
        self.slices: WindowAssigner = getattr(assigner, "panes", None) or assigner
        self.timestamp = timestamp
        self.spec = spec
        self.max_buffered_rows = max_buffered_rows
        self.buffer: list[pa.Table] = []
        self.buffered_rows = 0
        self.rows_in = 0
        self.partials_out = 0

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        self.rows_in += batch.num_rows
        self.spec.check_input(batch.schema, where=f"window pre-aggregation '{self.name}'")
        times = event_times(batch, self.timestamp, where=f"window pre-aggregation '{self.name}'")
        rows, starts = self.slices.assign(times)
        table = pa.Table.from_batches([batch]).select([*self.key_columns, *self.spec.input_columns])
        if not is_identity(rows, batch.num_rows):  # sliding windows: a row in several
            table = table.take(pa.array(rows))
        table = table.append_column(WINDOW_START, pa.array(starts))
        partials = self.spec.partials_of_rows(table, [*self.key_columns, WINDOW_START])
        self.buffer.append(partials)
        self.buffered_rows += partials.num_rows
        if self.buffered_rows >= self.max_buffered_rows:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        by = [*self.key_columns, WINDOW_START]
        combined = self.buffer[0] if len(self.buffer) == 1 else self.spec.merge_partials(
            pa.concat_tables(self.buffer), by)
        self.buffer, self.buffered_rows = [], 0
        self.partials_out += combined.num_rows
        for batch in combined.to_batches():
            self.output.emit(batch)

    def process_watermark(self, watermark: int) -> None:
        self.flush()
        self.output.emit_watermark(watermark)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self.flush()

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        assert not self.buffer, "pre-aggregation buffer must be flushed before the barrier"
        return None

    def finish(self) -> None:
        self.flush()

    def metrics(self) -> dict[str, float]:
        return {"rows_in": self.rows_in, "partials_out": self.partials_out}
