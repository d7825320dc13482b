"""The inputs of calls in flight, as an operator's state: what ``map_async`` and
``map_batches`` with an actor pool keep in a checkpoint (the inputs whose results were
not emitted yet) and issue again after a restore. Arrow IPC streams, never pickle, so a
checkpoint holds no code to run.

    >>> import pyarrow as pa
    >>> pending = [pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3]})]
    >>> [b.to_pydict() for b in decode_pending(encode_pending(pending, combine=False), where="doc")]
    [{'x': [1, 2]}, {'x': [3]}]
"""

from __future__ import annotations

import pyarrow as pa

_STATE_VERSION = b"\x01"  # first byte of the operator state: then Arrow IPC streams


def encode_pending(pending: list[pa.RecordBatch], *, combine: bool) -> bytes:
    """Pending inputs as Arrow IPC streams, one per run of inputs with one schema (their
    batches ``combine`` d into as few as it takes)."""
    out = [_STATE_VERSION]
    run: list[pa.RecordBatch] = []
    for batch in [*pending, None]:
        if run and (batch is None or not batch.schema.equals(run[0].schema)):
            sink = pa.BufferOutputStream()
            if combine:
                run = pa.Table.from_batches(run).combine_chunks().to_batches()
            with pa.ipc.new_stream(sink, run[0].schema) as writer:
                for part in run:
                    writer.write_batch(part)
            data = sink.getvalue().to_pybytes()
            out.append(len(data).to_bytes(8, "little") + data)
            run = []
        if batch is not None:
            run.append(batch)
    return b"".join(out)


def decode_pending(state: bytes, *, where: str) -> list[pa.RecordBatch]:
    """The pending inputs :func:`encode_pending` wrote."""
    if state[:1] != _STATE_VERSION:
        raise ValueError(f"{where}: operator state of unknown version {state[:1]!r} (this "
                         f"raystream writes {_STATE_VERSION!r})")
    batches, at = [], 1
    while at < len(state):
        size = int.from_bytes(state[at:at + 8], "little")
        batches.extend(pa.ipc.open_stream(pa.py_buffer(state[at + 8:at + 8 + size])))
        at += 8 + size
    return batches
