"""What an operator on the disk state backend keeps in its RocksDB: its own entries (the
timers' apart), per key, how many, one chunk appended per batch; and a restore that
must not search for an older layout's entries."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators.keyed import KeyedOperator


def own_entries(op: KeyedOperator) -> Iterator[tuple[bytes, bytes]]:
    """The operator's own (key, value) entries in its RocksDB, the timers' apart."""
    backend = op.backend
    assert isinstance(backend, DiskKeyedStateBackend)
    timers = op.disk_timers.state_ids  # the timers share the database
    return ((k, v) for k, v in backend.raw_db.items() if k[2:4] not in timers)


def stored_entries(op: KeyedOperator) -> int:
    """How many entries :func:`own_entries` finds."""
    return sum(1 for _ in own_entries(op))


def values_by_key(op: KeyedOperator) -> dict[Any, bytes]:
    """Key -> value of the operator's entries in the backend's ``kg | sid | len | key``
    layout (one entry per key: count windows, sessions)."""
    out = {}
    for k, v in own_entries(op):
        (n,) = np.frombuffer(k[4:8], dtype=">u4")
        out[DiskKeyedStateBackend.decode_key(k[8:8 + int(n)])] = v
    return out


def appended_one_chunk(heads: dict[bytes, bytes], chunks: dict[bytes, bytes],
                       before: dict[bytes, bytes], n: int) -> tuple[bytes, dict[bytes, bytes]]:
    """Check that one key's ``n``-th batch into its open session added one chunk and
    rewrote only the key's header (``before``: the entries after the previous batch);
    the header's key and the entries now."""
    (head,) = heads
    assert len(chunks) == n and all(k[:-8] == head for k in chunks)
    now = {**heads, **chunks}
    changed = {k for k in before if now[k] != before[k]}
    assert changed == ({head} if before else set())  # earlier chunks' bytes untouched
    assert len(set(chunks) - set(before)) == 1
    return head, now


def restore_moving_nothing(monkeypatch: pytest.MonkeyPatch, layout: type,
                           restore: Callable[[], KeyedOperator]) -> KeyedOperator:
    """``restore()`` with ``layout``'s move of an older layout's entries made to fail: a
    checkpoint written since that layout names its state, so restoring it moves nothing."""
    def moved(self) -> None:
        raise AssertionError("a checkpoint of chunks was searched for older entries")

    with monkeypatch.context() as patch:
        patch.setattr(layout, "_move_in_entries", moved)
        return restore()
