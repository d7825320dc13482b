"""Sinks: the last operator of a pipeline.

* :class:`CollectSink` keeps every batch and hands the table to the driver when
  a job without checkpoints finishes (``result.table(handle)``; with
  checkpoints, see :mod:`~raystream.engine.operators.collect_sink`).
* :class:`PrintSink` prints rows (to the worker's stdout, which Ray forwards).
* :class:`DiscardSink` counts rows and drops them (benchmarks).
"""

from __future__ import annotations

import pyarrow as pa

from raystream.actors.operator import CountsWrittenRows, SinkOperator
from raystream.engine.batches import concat_batches


class CollectSink(CountsWrittenRows, SinkOperator):
    """Keeps what it receives and hands it to the driver at the end (a job without
    checkpoints; with checkpoints ``collect()`` is exactly once through
    :mod:`~raystream.engine.operators.collect_sink`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.batches: list[pa.RecordBatch] = []

    def open(self) -> None:
        if self.ctx.checkpointing:  # its batches would be neither checkpointed nor committed
            raise RuntimeError(f"{self.name}: collect() was added to a stream environment "
                               f"without checkpoints, and the job runs with them")

    def process_batch(self, batch, input_index=0):
        self.counted(batch)
        self.batches.append(batch)

    def final_result(self) -> pa.Table:
        return concat_batches(self.batches)


class PrintSink(CountsWrittenRows, SinkOperator):
    def __init__(self, name: str, prefix: str | None = None) -> None:
        super().__init__(name)
        self.prefix = prefix

    def process_batch(self, batch, input_index=0):
        self.counted(batch)
        head = self.prefix or self.name
        tag = f"{head}:{self.ctx.subtask_index}> " if self.ctx.parallelism > 1 else f"{head}> "
        print("\n".join(tag + repr(row) for row in batch.to_pylist()), flush=True)


class DiscardSink(CountsWrittenRows, SinkOperator):
    def process_batch(self, batch, input_index=0):
        self.counted(batch)

    def final_result(self) -> int:
        return self.records_written
