"""Pacing a job so that a test can place its failures, and no longer than that.

A test that kills a subtask after a checkpoint, or stops a job with a savepoint,
needs the job still running when it gets there: its source is slowed down by a
throttle, a ``map_batches`` step that sleeps per batch. A fixed rate keeps the
whole input slow; a :class:`Brake` is a throttle the test releases once its
failures are placed, and the rest of the input runs at full speed.

The brake is a file, so that every subtask process of the job (on this machine)
sees it released at once; a subtask checks it with one ``stat`` per batch.

>>> import tempfile
>>> brake = Brake(tempfile.mkdtemp(), seconds_per_batch=0.05)
>>> brake.engaged
True
>>> brake.release(); brake.engaged
False
"""

from __future__ import annotations

import os
import time
import uuid

import pyarrow as pa


class Throttle:
    """A ``map_batches`` function that sleeps ``seconds_per_batch`` per batch (keeps the
    job running, for checkpoints before a kill): ``stream.map_batches(Throttle(0.02))``."""

    def __init__(self, seconds_per_batch: float) -> None:
        self.seconds_per_batch = seconds_per_batch

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(self.seconds_per_batch)
        return batch

    def __repr__(self) -> str:
        return f"Throttle({self.seconds_per_batch})"


class Brake(Throttle):
    """A :class:`Throttle` until :meth:`release`: then batches pass at once."""

    def __init__(self, directory: str, seconds_per_batch: float) -> None:
        super().__init__(seconds_per_batch)
        self.flag = os.path.join(directory, f"brake-{uuid.uuid4().hex}")
        with open(self.flag, "w"):
            pass

    @property
    def engaged(self) -> bool:
        return os.path.exists(self.flag)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if os.path.exists(self.flag):
            time.sleep(self.seconds_per_batch)
        return batch

    def release(self) -> None:
        """Let the rest of the input through at full speed (idempotent)."""
        try:
            os.unlink(self.flag)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"Brake({self.seconds_per_batch}, engaged={self.engaged})"
