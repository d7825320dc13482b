"""The disk (RocksDB) keyed state backend.

Unit tests check it against independent oracles (pandas over the same input,
and the heap backend's snapshot-then-restore contract); the Ray test runs the keyed
running sum of tests/test_exactly_once.py as a keyed process function on the disk
backend through a failpoint exit, with its numpy oracle (tests/support/oracles.py).
The running sum's reduce on the disk backend runs through a subtask kill in
tests/test_exactly_once.py and through a stop-with-savepoint restored at another
parallelism in tests/test_savepoints.py, both parametrized over the backends.
"""

from __future__ import annotations

import datetime
import os
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.checkpoint.disk_layout import encode_key
from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_state import NATIVE_METRICS, DiskKeyedStateBackend
from raystream.checkpoint.keygroups import key_group_of, key_group_range
from raystream.checkpoint.state_backend import (StateBackend, create_keyed_state_backend,
                                                is_disk)
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.engine.operators.keyed import KeyedProcessOperator, ReduceOperator
from tests.support.pacing import Throttle

MAXP = 128


@pytest.fixture
def backends():
    made = []

    def make(key_groups=range(MAXP), **options):
        b = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                  options=DiskStateOptions(**options) if options else None)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


def random_rows(n: int = 5000, keys: int = 300, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, keys, n), "sub": rng.integers(0, 5, n),
                         "v": rng.integers(-1000, 1000, n)})


def read_all(b: DiskKeyedStateBackend) -> dict:
    """Every (state name, key) -> value, read through the public protocol."""
    out = {}
    handles = {"sum": b.value_state("sum"), "seen": b.list_state("seen"),
               "per_sub": b.map_state("per_sub")}
    for name, handle in handles.items():
        for key in list(b.keys(name)):
            b.set_current_key(key)
            out[(name, key)] = (handle.value() if name == "sum" else handle.get()
                                if name == "seen" else dict(handle.items()))
    return out


def fill(b: DiskKeyedStateBackend, rows: pd.DataFrame) -> list[int]:
    total, seen, per_sub = b.value_state("sum", default=0), b.list_state("seen"), \
        b.map_state("per_sub")
    running = []
    for k, sub, v in rows[["k", "sub", "v"]].itertuples(index=False):
        b.set_current_key(int(k))
        total.update(total.value() + int(v))
        running.append(total.value())
        seen.add(int(v))
        per_sub.put(int(sub), per_sub.get(int(sub), 0) + 1)
    return running


def test_value_list_and_map_state_match_pandas(backends):
    rows = random_rows()
    b = backends()
    running = fill(b, rows)
    assert running == rows.groupby("k")["v"].cumsum().tolist()
    state = read_all(b)
    sums = rows.groupby("k")["v"].sum()
    lists = rows.groupby("k")["v"].agg(list)
    counts = rows.groupby(["k", "sub"]).size()
    assert sorted(k for name, k in state if name == "sum") == sorted(sums.index.tolist())
    for k in sums.index:
        assert state[("sum", k)] == sums[k]
        assert state[("seen", k)] == lists[k]
        assert state[("per_sub", k)] == {s: int(c) for s, c in counts[k].items()}


def test_restored_backend_equals_the_snapshotted_one_at_any_parallelism(backends):
    rows = random_rows(3000)
    b = backends()
    fill(b, rows)
    expected = read_all(b)
    write = b.snapshot()
    fill(b, random_rows(500, seed=8))  # changes after the snapshot are not in it
    sections = write()
    assert all(DiskKeyedStateBackend.owns_section(s) for s in sections.values())
    restored = {}
    for subtask in range(3):
        groups = key_group_range(subtask, 3, MAXP)
        r = backends(groups)
        r.restore(sections.items())
        part = read_all(r)
        assert all(key_group_of(k, MAXP) in groups for _, k in part)
        restored.update(part)
    assert restored == expected
    whole = backends()
    whole.restore(sections)
    assert whole.snapshot()() == sections  # byte for byte: a restore loses nothing


def test_snapshot_is_consistent_while_processing_writes(backends):
    b = backends()
    count = b.value_state("n", default=0)
    for k in range(2000):
        b.set_current_key(k)
        count.update(1)
    write = b.snapshot()
    result = {}
    worker = threading.Thread(target=lambda: result.update(write()))
    worker.start()
    for k in range(4000):  # writes and new keys race the background scan
        b.set_current_key(k)
        count.update(count.value() + 1)
    worker.join()
    r = backends()
    r.restore(result)
    n = r.value_state("n")
    keys = sorted(r.keys("n"))
    assert keys == list(range(2000))
    for k in keys:
        r.set_current_key(k)
        assert n.value() == 1


def test_a_batch_read_of_a_damaged_value_fails_instead_of_shifting_its_neighbours(backends):
    """values_at decodes a batch's values as one stream: a stored value holding two
    objects (a damaged database) must fail the read, never hand key 1 key 0's spare
    object and so on down the batch."""
    import msgpack

    b = backends()
    state = b.value_state("sum")
    keys = [0, 1, 2]
    stored = state.entry_keys(keys, [key_group_of(k, MAXP) for k in keys])
    state.update_at(stored, [{"v": 1}, {"v": 2}, {"v": 3}])
    more = state.entry_keys(keys + [3], [key_group_of(k, MAXP) for k in keys + [3]])
    assert state.values_at(more) == [{"v": 1}, {"v": 2}, {"v": 3}, None]
    b.raw_db[stored.key(0)] = msgpack.packb({"v": 1}) + msgpack.packb({"v": 9})
    with pytest.raises(ValueError, match="3 stored values decoded as 4 .* corrupt"):
        state.values_at(stored)


def test_values_keep_their_types_and_keys_are_canonical(backends):
    b = backends()
    v = b.value_state("v")
    value = {"t": (1, "a", (2.5, None)), "when": datetime.datetime(2026, 11, 25, 13, 0),
             "np": np.float64(1.5), "b": b"\x00", "l": [1, [2, {"x": 3}]], 7: True}
    b.set_current_key(np.int64(42))
    v.update(value)
    b.set_current_key(42)
    got = v.value()
    assert got == value and type(got["t"][2]) is tuple and type(got["np"]) is np.float64
    assert encode_key(("a", np.int32(3))) == encode_key(("a", 3))
    b.set_current_key(("a", 3))
    v.update(1)
    assert sorted(b.keys("v"), key=str) == [("a", 3), 42]


def test_namespaces_merging_and_clear(backends):
    b = backends()
    acc = b.reducing_state("acc", lambda x, y: x + y)
    b.set_current_key("u")
    for ns, x in [(1, 10), (2, 5), (3, 1), (None, 100)]:
        b.set_namespace(ns)
        acc.add(x)
    b.set_namespace(3)
    acc.merge_namespaces(3, [1, 2, 3])
    assert acc.get() == 16
    b.set_namespace(1)
    assert acc.get() is None
    b.set_namespace(None)
    assert acc.get() == 100 and list(b.keys("acc")) == ["u"]
    acc.clear()
    assert acc.get() is None
    with pytest.raises(ValueError, match="is reducing state, not value state"):
        b.value_state("acc")


def test_either_backend_restores_the_others_sections(backends):
    rows = random_rows(2000)
    disk = backends()
    fill(disk, rows)
    acc = disk.reducing_state("acc", lambda x, y: x + y)
    disk.set_current_key("w")
    for ns in (None, 1, (2, "x")):
        disk.set_namespace(ns)
        acc.add(10)
    disk.set_namespace(None)
    expected = read_all(disk)
    disk_sections = disk.snapshot()()
    heaps = []
    for subtask in range(2):  # disk -> heap, at another parallelism
        heap = create_keyed_state_backend("heap", max_parallelism=MAXP,
                                          key_groups=key_group_range(subtask, 2, MAXP))
        heap.restore(disk_sections.items())
        heaps.append(heap)
    got = {}
    for heap in heaps:
        for name, handle in {"sum": heap.value_state("sum"), "seen": heap.list_state("seen"),
                             "per_sub": heap.map_state("per_sub")}.items():
            for key in list(heap.keys(name)):
                heap.set_current_key(key)
                got[(name, key)] = (handle.value() if name == "sum" else handle.get()
                                    if name == "seen" else dict(handle.items()))
    assert got == expected
    back = backends()  # heap -> disk
    for heap in heaps:
        back.restore(heap.snapshot()().items())
    assert read_all(back) == expected
    back_acc = back.reducing_state("acc", lambda x, y: x + y)
    back.set_current_key("w")
    for ns in (None, 1, (2, "x")):
        back.set_namespace(ns)
        assert back_acc.get() == 10


def test_options_and_config_select_the_backend(backends):
    assert rs.CheckpointConfig(state_backend="disk").state_backend is StateBackend.DISK
    options = DiskStateOptions(memory_mb=16)
    config = rs.CheckpointConfig(state_backend=options)
    assert config.state_backend == options and is_disk(config.state_backend)
    b = create_keyed_state_backend(config.state_backend, max_parallelism=MAXP,
                                   key_groups=range(4))
    assert isinstance(b, DiskKeyedStateBackend) and b.options.memory_mb == 16
    path = b.path
    assert os.path.isdir(path)
    b.close()
    assert not os.path.exists(path)


def test_released_memory_leaves_the_state_readable_and_snapshottable(backends):
    """An attempt's end empties the block cache (a new attempt may open its own in the same
    process) while an asynchronous checkpoint part may still read the database."""
    rows = random_rows(4000, keys=400)
    b = backends(memory_mb=32)
    fill(b, rows)
    b._db.flush(True)  # reads now go through SST blocks and the cache
    before = read_all(b)
    assert int(b._db.property_value("rocksdb.block-cache-usage")) > 0
    snapshot = b.snapshot()
    used = int(b._db.property_value("rocksdb.block-cache-usage"))
    b.release_memory()
    # what stays is what the snapshot's open iterator pins
    assert int(b._db.property_value("rocksdb.block-cache-usage")) == b._cache.get_pinned_usage()
    assert b._cache.get_pinned_usage() < used
    assert read_all(b) == before
    assert int(b._db.property_value("rocksdb.block-cache-usage")) == b._cache.get_pinned_usage()
    restored = backends()
    restored.restore(snapshot())
    assert read_all(restored) == before
    assert before[("sum", 7)] == rows.loc[rows.k == 7, "v"].sum()


def test_native_metrics_report_what_rocksdb_holds(backends):
    """RocksDB's own figures (Flink's native metrics): entries, level-0 files, SST bytes,
    the cache within its budget; nothing once the database is closed."""
    rows = random_rows(3000, keys=300)
    b = backends(memory_mb=32)
    fill(b, rows)  # three states a key: a value, a list and a map entry
    b._db.flush(True)
    after_flush = b.native_metrics()
    assert after_flush["rocksdb.num-files-at-level0"] == 1
    assert after_flush["rocksdb.live-sst-files-size"] > 0
    assert 0 < after_flush["rocksdb.block-cache-usage"] <= b.options.block_cache_bytes
    assert after_flush["rocksdb.background-errors"] == 0
    b._db.compact_range(None, None)  # one version of each entry left: the estimate is exact
    assert b.native_metrics()["rocksdb.estimate-num-keys"] == 3 * rows["k"].nunique()
    assert set(after_flush) == {f"rocksdb.{name}" for name in NATIVE_METRICS}
    b.close()
    assert b.native_metrics() == {}


def test_directories_of_dead_processes_are_removed(tmp_path, backends):
    stale = tmp_path / "raystream-state-999999999-0123"
    stale.mkdir()
    backends(local_dir=str(tmp_path))
    assert not stale.exists()


def add(acc: dict, row: dict) -> dict:
    return {"k": row["k"], "v": acc["v"] + row["v"], "n": acc["n"] + 1}


def run_reduce(state_backend, batches: list[pa.RecordBatch]) -> list[dict]:
    op = ReduceOperator("sum", add, KeySelector.of("k"))
    out = CollectingOutput()
    ctx = RuntimeContext("local", "sum", 0, 1, MAXP, 0, state_backend=state_backend)
    op.setup(ctx, out)
    op.initialize_state(None)
    op.open()
    for batch in batches:
        op.process_batch(batch)
    if hasattr(op.backend, "close"):
        op.backend.close()
    return [r for b in out.batches for r in b.to_pylist()]


def test_vectorized_reduce_equals_the_per_row_heap_reduce():
    rows = random_rows(4000, keys=50)
    rows["n"] = 1
    batches = [pa.RecordBatch.from_pandas(rows.iloc[i:i + 333][["k", "v", "n"]],
                                          preserve_index=False) for i in range(0, 4000, 333)]
    disk = run_reduce(StateBackend.DISK, batches)
    assert disk == run_reduce(StateBackend.HEAP, batches)
    assert [r["v"] for r in disk] == rows.groupby("k")["v"].cumsum().tolist()


def test_a_window_on_the_disk_backend_fails_naming_the_operator():
    from raystream.engine.operators.keyed import KeyedOperator

    class Windowish(KeyedOperator):
        pass

    op = Windowish("my-window", KeySelector.of("k"))
    op.setup(RuntimeContext("local", "my-window", 0, 1, MAXP, 0,
                            state_backend=StateBackend.DISK), CollectingOutput())
    with pytest.raises(ValueError, match="operator 'my-window' .*disk state backend"):
        op.initialize_state(None)
    assert KeyedProcessOperator.supports_disk_state and ReduceOperator.supports_disk_state


# ---------------------------------------------------------------------------
# Real Ray jobs on the disk backend
# ---------------------------------------------------------------------------

def test_disk_process_function_is_exactly_once_through_a_failpoint_exit(ray_session, tmp_path):
    from tests.support.functions import RunningSum
    from tests.support.inputs import N, SPLITS, numbers
    from tests.support.jobs import checkpointed_env
    from tests.support.oracles import assert_exactly_once
    throttle = Throttle(0.02)

    env = checkpointed_env(str(tmp_path / "chk"), state_backend="disk", failpoints=[
        rs.Failpoint("in_processing", operator="sum", subtask=0, hit=60, attempt=0,
                     action="exit")])
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    sink = source.map_batches(throttle, name="throttle").key_by("k").process(
        RunningSum(), name="sum").collect(name="out")
    result = env.execute("disk-exit")
    assert result.restarts == 1
    assert result.restores[0]["checkpoint_id"] > 0  # restored from a completed checkpoint
    assert_exactly_once(result.table(sink))
