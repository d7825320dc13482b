"""One actor of a ``map_batches`` model pool: it builds the user's model once and calls it
on each batch it is sent (see :mod:`raystream.engine.operators.pool_map`).

The model is a class, as in Ray Data's ``map_batches``: ``Model(*args, **kwargs)`` loads
what it needs, ``model(batch)`` takes a ``pyarrow.RecordBatch`` (``BatchFormat.PYARROW``)
or a dict of numpy arrays, one per column (``BatchFormat.NUMPY``), and returns a
``pyarrow.RecordBatch``, a ``pyarrow.Table`` or a dict of columns (numpy arrays, lists or
Arrow arrays), with any number of rows. What it returns is turned into Arrow here, in
the pool actor, so a wrong type is an error of the call that gave it.

    >>> import numpy as np, pyarrow as pa
    >>> class Doubler:
    ...     def __init__(self, factor): self.factor = factor
    ...     def __call__(self, batch): return {"y": batch["x"] * self.factor}
    >>> worker = PoolWorker(ModelSpec(Doubler, (2,), {}, BatchFormat.NUMPY), "map_batches 'double'")
    >>> worker.call(pa.record_batch({"x": [1, 2, 3]})).batches[0].to_pydict()
    {'y': [2, 4, 6]}
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

import pyarrow as pa


class BatchFormat(Enum):
    """What a model's ``__call__`` is given (Ray Data's ``batch_format``)."""

    PYARROW = "pyarrow"  # a pyarrow.RecordBatch
    NUMPY = "numpy"  # a dict of numpy arrays, one per column


@dataclass(frozen=True)
class ModelSpec:
    """What each pool actor builds, ``model(*args, **kwargs)``, and what it is given."""

    model: type
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    batch_format: BatchFormat = BatchFormat.PYARROW


@dataclass(frozen=True)
class BatchResult:
    """A call's output as Arrow, and how long the model took (the actor's busy time)."""

    batches: list[pa.RecordBatch]
    busy_s: float


def model_input(batch: pa.RecordBatch, batch_format: BatchFormat) -> Any:
    """``batch`` as the model takes it."""
    if batch_format is BatchFormat.PYARROW:
        return batch
    return {name: column.to_numpy(zero_copy_only=False)
            for name, column in zip(batch.schema.names, batch.columns)}


def model_output(value: Any, where: str) -> list[pa.RecordBatch]:
    """What a model returned, as record batches; a TypeError naming ``where`` if it is
    none of a RecordBatch, a Table or a dict of columns."""
    if isinstance(value, pa.RecordBatch):
        return [value]
    if isinstance(value, pa.Table):
        return value.to_batches()
    if isinstance(value, Mapping):
        try:
            return [pa.RecordBatch.from_pydict(dict(value))]
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise TypeError(f"{where}: the model returned a dict whose values are not "
                            f"columns of equal length ({type(exc).__name__}: {exc})") from None
    raise TypeError(f"{where}: the model must return a pyarrow.RecordBatch, a pyarrow.Table "
                    f"or a dict of columns, got {type(value).__name__}")


class PoolWorker:
    """The body of a pool actor (``ray.remote(PoolWorker)``). A model whose constructor
    raised is kept as its exception, raised by :meth:`ready`, so the pool tells a model
    that cannot load (an error of the job) from an actor that died (replaced)."""

    def __init__(self, spec: ModelSpec, where: str) -> None:
        self.spec, self.where = spec, where
        self.failed: Exception | None = None
        try:
            self.model = spec.model(*spec.args, **spec.kwargs)
        except Exception as exc:
            self.failed = exc

    def ready(self) -> int:
        """The actor's process id, once the model is built."""
        if self.failed is not None:
            raise self.failed
        return os.getpid()

    def call(self, batch: pa.RecordBatch) -> BatchResult:
        """The model applied to ``batch``."""
        started = time.perf_counter()
        value = self.model(model_input(batch, self.spec.batch_format))
        busy = time.perf_counter() - started
        return BatchResult(model_output(value, self.where), busy)
