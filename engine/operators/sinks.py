"""Sinks: the last operator of a pipeline.

* :class:`CollectSink` keeps every batch and hands the table to the driver when
  the job finishes (``result.table(handle)``).
* :class:`PrintSink` prints rows (to the worker's stdout, which Ray forwards).
* :class:`DiscardSink` counts rows and drops them (benchmarks).
"""

from __future__ import annotations

import pyarrow as pa

from raystream.engine.batches import concat_batches
from raystream.engine.operators.base import Operator, OperatorSnapshot


def _ipc_bytes(batches: list[pa.RecordBatch]) -> bytes:
    """Batches as one Arrow IPC stream (schemas unified)."""
    table = concat_batches(batches)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class SinkOperator(Operator):
    """A sink emits nothing downstream; ``final_result()`` goes back to the driver."""

    def process_watermark(self, watermark: int) -> None:
        pass

    def final_result(self) -> object | None:
        return None


class CollectSink(SinkOperator):
    """Keeps what it receives; with checkpoints, exactly once.

    With checkpoints on, the batches received before barrier n and after
    barrier n-1 belong to *origin* n. Until a completed checkpoint covers an
    origin, the sink keeps its batches and offers them again with every
    checkpoint (so an aborted checkpoint loses nothing), each origin as one
    file with a fixed name; the coordinator lists every file once in the
    committed output when a checkpoint completes. The job's result is the
    committed output only, so a failover never duplicates or loses a row.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.batches: list[pa.RecordBatch] = []
        self.uncommitted: dict[int, list[pa.RecordBatch]] = {}  # origin checkpoint -> batches
        self.encoded: dict[int, bytes] = {}  # origin -> its file, once a snapshot wrote it

    def process_batch(self, batch, input_index=0):
        self.batches.append(batch)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        if not self.ctx.checkpointing:
            return None
        if self.batches:
            self.uncommitted[checkpoint_id], self.batches = self.batches, []
        offered = dict(self.uncommitted)  # batches are immutable: a shallow copy is consistent
        encoded = self.encoded  # an origin offered again is encoded once

        def committable() -> dict[int, bytes]:
            return {origin: encoded.get(origin) or encoded.setdefault(origin, _ipc_bytes(batches))
                    for origin, batches in offered.items()}
        return OperatorSnapshot(committable=committable)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for origin in [o for o in self.uncommitted if o <= checkpoint_id]:
            del self.uncommitted[origin]
        # also any origin a late background write encoded after its commit
        for origin in [o for o in list(self.encoded) if o not in self.uncommitted]:
            self.encoded.pop(origin, None)

    def final_result(self) -> pa.Table | None:
        return None if self.ctx.checkpointing else concat_batches(self.batches)


class PrintSink(SinkOperator):
    def __init__(self, name: str, prefix: str | None = None) -> None:
        super().__init__(name)
        self.prefix = prefix

    def process_batch(self, batch, input_index=0):
        head = self.prefix or self.name
        tag = f"{head}:{self.ctx.subtask_index}> " if self.ctx.parallelism > 1 else f"{head}> "
        print("\n".join(tag + repr(row) for row in batch.to_pylist()), flush=True)


class DiscardSink(SinkOperator):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.rows = 0

    def process_batch(self, batch, input_index=0):
        self.rows += batch.num_rows

    def final_result(self) -> int:
        return self.rows
