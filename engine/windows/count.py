"""Count windows: ``key_by(k).count_window(size, slide=None)`` (Flink's ``countWindow``).

Per key, in the order the key's records reach its subtask: a **tumbling**
count window (no ``slide``) fires every ``size`` records with those ``size``
records and forgets them; a **sliding** one fires every ``slide`` records with
the last ``size`` of them (fewer while the key has seen fewer). Records of a
window that never fills are not emitted (Flink's ``CountTrigger`` with
``GlobalWindows``). Results have the key column(s) and the aggregates.

Vectorized: per batch, one sort by (key, position) and one ``group_by`` over
the fired windows; Python runs per distinct key of a batch (its pending rows),
never per record. A key's pending rows (the aggregate input columns of the
records a future window still needs) and its record count are state per key
group, so they are checkpointed and restored at any parallelism.

On the heap backend they are a dict of Arrow tables, checkpointed in part
``"count_windows"``. With ``CheckpointConfig(state_backend="disk")`` each key's
count and pending rows are one entry of the operator instance's RocksDB
(:mod:`raystream.engine.windows.disk_count`): a batch reads its distinct keys'
entries with one multi-get and writes them back with one write batch, and the
backend's full or incremental snapshots carry them (no part of their own). A
savepoint of either backend restores into a job of the other: pending rows move
into RocksDB, or out of it through a scratch database (``DiskCountState.export``).

    >>> import pyarrow as pa
    >>> from raystream.engine.keys import KeySelector
    >>> from raystream.actors.operator import CollectingOutput, RuntimeContext
    >>> op = CountWindowOperator("c", KeySelector.of("k"), size=2,
    ...                          spec=AggregateSpec.of({"total": ("sum", "x")}))
    >>> out = CollectingOutput(); op.setup(RuntimeContext.local(), out)
    >>> op.initialize_state(None)
    >>> op.process_batch(pa.record_batch({"k": [1, 2, 1], "x": [10, 20, 30]}))
    >>> op.process_batch(pa.record_batch({"k": [2, 1], "x": [5, 7]}))
    >>> [b.to_pydict() for b in out.batches]
    [{'k': [1], 'total': [40]}, {'k': [2], 'total': [25]}]
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa

from raystream.actors.operator import RestoredState
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.operators.keyed import KeyedOperator
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows import disk_count
from raystream.engine.windows.disk_count import DiskCountState

_COUNT_STATE_VERSION = 1
_ONE = "__one"  # a placeholder column: keeps row counts when no aggregate reads a column


class CountWindowOperator(KeyedOperator):
    """Count windows of ``size`` records per key, every ``slide`` records (default:
    ``size``, tumbling), computing the built-in aggregates of ``spec``."""

    # on the disk backend a key's count and pending rows are one RocksDB entry
    supports_disk_state = True
    disk_only_kinds = (disk_count.KIND,)
    label = "count window"

    def __init__(self, name: str, keys: KeySelector, *, size: int, slide: int | None = None,
                 spec: AggregateSpec) -> None:
        super().__init__(name, keys)
        if int(size) <= 0 or (slide is not None and int(slide) <= 0):
            raise ValueError(f"count window '{name}': size and slide must be positive "
                             f"numbers of records, got size={size!r}, slide={slide!r}")
        self.size = int(size)
        self.slide = int(slide) if slide is not None else self.size
        self.spec = spec
        self.key_names = list(keys.columns) if keys.columns else ["key"]
        self.fired = 0

    def initialize_state(self, restored: RestoredState | None) -> None:
        # key id -> (records of the key so far, its pending rows: the last ones a future
        # window needs, oldest first); values are replaced, never mutated (snapshots share)
        self.pending: dict[int, tuple[int, pa.Table]] = {}
        self.disk_state: DiskCountState | None = None
        super().initialize_state(restored)
        self._open_disk_state()

    def _open_disk_state(self) -> None:
        """On the disk backend: the per-key state in RocksDB, once the backend is restored."""
        if self.disk_state is None and isinstance(self.backend, DiskKeyedStateBackend):
            self.disk_state = DiskCountState(self.backend, where=f"count window '{self.name}'")

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "windows_fired": self.fired}

    def _first_needed(self, counts: np.ndarray) -> np.ndarray:
        """The first position a future window still needs, per key that has ``counts``
        records: the next firing position minus ``size - 1``."""
        next_fire = (counts // self.slide + 1) * self.slide - 1
        return next_fire - self.size + 1

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        n = batch.num_rows
        if not n:
            return
        self.spec.check_input(batch.schema, where=f"count window '{self.name}'", any_min_max=True)
        distinct = self.keys.distinct_keys(batch, self.ctx.max_parallelism)
        inputs = pa.table({c: batch.column(c) for c in self.spec.input_columns})
        disk = self.disk_state
        # the keys' records before this batch, and their pending rows, key by key
        if disk is None:
            ids = self.timers.key_ids(distinct.keys, distinct.groups)
            held: list[tuple[int, pa.Table | None]] = [self.pending.get(k, (0, None))
                                                       for k in ids.tolist()]
            before = np.array([count for count, _ in held], dtype=np.int64)
            tables = [t for _, t in held if t is not None and t.num_rows]
            lengths = np.array([0 if t is None else t.num_rows for _, t in held],
                               dtype=np.int64)
        else:  # one multi-get
            inputs = disk.conform(inputs)  # first: a new state's first rows declare it
            entry_keys = disk.entry_keys(distinct.keys, distinct.groups)
            stored = disk.read(entry_keys)
            before, lengths, total = stored.counts, stored.lengths, int(stored.lengths.sum())
            tables = [pa.table({**{c: stored.rows[c] for c in inputs.column_names},
                                _ONE: pa.array(np.ones(total, dtype=np.int8))})] if total else []
        rows = pa.table({**{c: inputs[c] for c in inputs.column_names},
                         _ONE: pa.array(np.ones(n, dtype=np.int8))})

        # positions: the key's records before this batch, then its rank in the batch
        order = np.argsort(distinct.inverse, kind="stable")
        per_key = np.bincount(distinct.inverse, minlength=len(before))
        first_of_key = np.concatenate([[0], np.cumsum(per_key)[:-1]])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - first_of_key[distinct.inverse[order]]
        positions = before[distinct.inverse] + rank

        # every row a window may need: the pending ones of these keys, then the batch's
        pending_rows = int(lengths.sum())
        pending_kids = np.repeat(np.arange(len(before), dtype=np.int64), lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        pending_pos = (np.repeat(before - lengths, lengths) + np.arange(pending_rows)
                       - np.repeat(starts, lengths))
        tables.append(rows)
        everything = pa.concat_tables(tables) if len(tables) > 1 else rows
        keys_of = np.concatenate([pending_kids, distinct.inverse.astype(np.int64)])
        pos_of = np.concatenate([pending_pos, positions]).astype(np.int64)
        sorted_rows = np.lexsort((pos_of, keys_of))  # by key, then position

        # fires: batch rows whose position completes a slide
        fire = np.flatnonzero((positions + 1) % self.slide == 0)
        if len(fire):
            at = np.empty(len(sorted_rows), dtype=np.int64)
            at[sorted_rows] = np.arange(len(sorted_rows))
            last = at[pending_rows + fire]  # the firing row's place in the sorted order
            size = np.minimum(self.size, positions[fire] + 1)
            back = np.arange(self.size)[None, :]
            member = back < size[:, None]
            taken = sorted_rows[(last[:, None] - back)[member]]
            fire_id = np.broadcast_to(np.arange(len(fire))[:, None], member.shape)[member]
            members = everything.take(pa.array(taken)).append_column("__fire",
                                                                      pa.array(fire_id))
            partials = self.spec.partials_of_rows(members, ["__fire"])
            by_fire = np.argsort(partials["__fire"].to_numpy())
            results = self.spec.results({c: partials[c].to_numpy()[by_fire]
                                         for c in self.spec.partial_columns})
            index = pa.array(distinct.inverse[fire])
            columns = {name: array.take(index)
                       for name, array in zip(self.key_names, distinct.arrays)}
            columns.update(results)
            self.fired += len(fire)
            self.output.emit(pa.RecordBatch.from_pydict(columns))

        # what stays pending: per key, the rows from its first still-needed position
        counts = before + per_key
        needed = pos_of >= self._first_needed(counts)[keys_of]
        kept = sorted_rows[needed[sorted_rows]]
        kept_keys = keys_of[kept]
        kept_table = everything.take(pa.array(kept))
        edges = np.searchsorted(kept_keys, np.arange(len(before) + 1))
        if disk is not None:  # one write batch
            disk.write(entry_keys, counts, kept_table.drop_columns([_ONE]), edges)
            return
        for index, kid in enumerate(ids.tolist()):
            a, b = int(edges[index]), int(edges[index + 1])
            self.pending[kid] = (int(counts[index]), kept_table.slice(a, b - a))

    # -- state ---------------------------------------------------------------------------
    def keyed_snapshot_parts(self):
        parts = super().keyed_snapshot_parts()
        if self.disk_state is not None:  # its entries are in the backend's sections
            return parts
        pending = dict(self.pending)  # synchronous: values are immutable, never mutated
        timers = self.timers

        def sections() -> dict[int, bytes]:
            by_group: dict[int, list[tuple[Any, int, pa.Table]]] = {}
            for kid, (count, table) in pending.items():
                by_group.setdefault(timers.key_group(kid), []).append(
                    (timers.key(kid), count, table))
            return {group: pickle.dumps((_COUNT_STATE_VERSION, entries), protocol=5)
                    for group, entries in by_group.items()}
        parts["count_windows"] = sections
        return parts

    def restore_keyed_parts(self, parts) -> None:
        sections = parts.pop("count_windows", [])
        super().restore_keyed_parts(parts)
        self._open_disk_state()  # the backend is restored: its count windows, if any
        moved = self.moved_disk_state
        if moved is not None:  # a disk savepoint's count windows, for this heap job
            exported = DiskCountState(moved.backend, where=f"count window '{self.name}'")
            for group, keys, stored in exported.export():
                rows = stored.rows.append_column(  # the heap layout's row-count column
                    _ONE, pa.array(np.ones(int(stored.lengths.sum()), dtype=np.int8)))
                edges = np.concatenate([[0], np.cumsum(stored.lengths)]).tolist()
                for i, (key, count) in enumerate(zip(keys, stored.counts.tolist())):
                    self.pending[self.timers.key_id(key, group)] = (
                        count, rows.slice(edges[i], edges[i + 1] - edges[i]))
        for group, blob in sections:
            version, entries = pickle.loads(blob)  # this job's own checkpoint file
            if version != _COUNT_STATE_VERSION:
                raise ValueError(f"count window '{self.name}': state version {version} in key "
                                 f"group {group}; this raystream reads version "
                                 f"{_COUNT_STATE_VERSION}")
            disk = self.disk_state
            if disk is not None:  # a heap checkpoint into a disk job: into RocksDB
                disk.restore_heap(group, [(key, count, table.drop_columns([_ONE]))
                                          for key, count, table in entries])
                continue
            for key, count, table in entries:
                self.pending[self.timers.key_id(key, group)] = (count, table)
