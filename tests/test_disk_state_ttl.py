"""State TTL on the disk (RocksDB) keyed state backend, against the heap backend's semantics.

The scenarios both backends share are in tests/test_state_ttl.py, parametrized over
the backends. Here: a model test that runs both backends op by op against the
``Model`` of tests/support/ttl.py (dicts of ``(value, timestamp)``) and restores
their snapshots into the other backend at another key-group range; what is disk's
own (snapshots restored byte for byte, incremental checkpoints holding expired
values, compaction of deletions, the vectorized value reads and writes). The job
test runs a keyed process function with TTL state on ``state_backend="disk"``
through a real subtask kill and checks every read against the wall-clock times
the job recorded around it.
"""

from __future__ import annotations

import glob
import os
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raystream as rs
from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_handles import DiskTtlValueState
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from tests.conftest import BACKENDS, state_backends
from tests.support.ttl import (CONFIGS, MAXP, OPS, PROBE_SCHEMA, TTL, Clock, dump, handles, pause,
                               run_model, stored_values)


# -- model: random interleavings on both backends --------------------------------------------

@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OPS, max_size=70))
def test_model_on_both_backends_with_snapshots_restored_across_backends(cfg, ops):
    """Both backends follow the model op by op (the cleanup never changes what a read
    sees); a snapshot restored into either backend at two key-group ranges, read
    later, holds what the model held at the snapshot, expired at the later time (so
    the timestamps came through)."""
    with state_backends() as make:
        run_model(make, cfg, ops, BACKENDS)


# -- snapshots, restore, cleanup -----------------------------------------------------------

def test_a_disk_snapshot_restored_into_disk_is_byte_for_byte_when_nothing_expired(make_backend):
    clock = Clock()
    b = make_backend("disk", clock)
    h = handles(b, rs.StateTtlConfig(TTL))
    for k in range(30):
        b.set_current_key(k)
        h["v"].update({"k": k})
        h["l"].add_all([k, (k, "t")])
        h["m"].put(("u", k), [k])
        h["r"].add(k)
        h["a"].add(k)
    sections = b.snapshot()()
    r = make_backend("disk", clock)
    r.restore(sections)
    handles(r, rs.StateTtlConfig(TTL, cleanup_per_access=0))  # as dump() declares them
    assert r.snapshot()() == sections
    heap = make_backend("heap", clock)  # and through the heap backend and back, the same state
    heap.restore(sections)
    back = make_backend("disk", clock)
    back.restore(heap.snapshot()())
    assert dump(back, TTL) == dump(r, TTL) and len(dump(r, TTL)) == 5 * 30


def test_an_incremental_checkpoint_holds_expired_values_a_restore_hides(tmp_path):
    """Incremental checkpoints upload RocksDB files as they are: values that expired but
    were not deleted are in them. A restore (adopting the files, or copying a half at
    another parallelism) hides them on read with their original timestamps, the
    cleanup deletes them, and a savepoint of the same snapshot leaves them out."""
    from raystream.checkpoint.disk_incremental import RestoredDb
    from raystream.checkpoint.storage import CheckpointStorage

    storage = CheckpointStorage(str(tmp_path / "chk"))
    clock = Clock()
    made: list = []

    def incremental(key_groups: range = range(MAXP), at: int = 0):
        b = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                  options=DiskStateOptions(memory_mb=8, incremental=True,
                                                           local_dir=str(tmp_path)),
                                  ttl_time_provider=Clock(at) if at else clock)
        made.append(b)
        return b
    try:
        b = incremental()
        v = b.value_state("v", ttl=rs.StateTtlConfig(TTL, cleanup_per_access=0))
        for k in range(100):
            b.set_current_key(k)
            v.update(k)
            if k == 49:
                clock.now += 60  # keys 50-99 are written 60 ms later
        clock.now += 50  # keys 0-49 expired, nobody deleted them
        snapshot = b.snapshot()
        handle = snapshot.upload(storage, "job", 1, "probe-0")
        b.notify_checkpoint_complete(1)
        savepoint = b.snapshot()()  # a full snapshot of the same database
        assert stored_values(savepoint) == {"v": 50}
        dbs = [RestoredDb.read(storage, handle)]
        for groups in (range(MAXP), rs.key_group_range(0, 2, MAXP),
                       rs.key_group_range(1, 2, MAXP)):
            r = incremental(groups, at=clock.now)
            r.restore_db(dbs)
            mine = [k for k in range(100) if rs.key_group_of(k, MAXP) in groups]
            assert sorted(r.keys("v")) == mine  # the expired values came with the files
            rv = r.value_state("v", ttl=rs.StateTtlConfig(TTL))
            shown = {}
            for k in mine:
                r.set_current_key(k)
                shown[k] = rv.value()
            assert shown == {k: (k if k >= 50 else None) for k in mine}
            assert sorted(r.keys("v")) == [k for k in mine if k >= 50]  # reads deleted them
        later = incremental(at=clock.now + 49)  # now +110; written at +60: live until +160
        later.restore_db(dbs)
        lv = later.value_state("v", ttl=rs.StateTtlConfig(TTL, cleanup_per_access=5))
        later.set_current_key(50)
        assert lv.value() == 50
        for _ in range(100):  # the cleanup reaches the expired keys no one reads
            lv.value()
        assert sorted(later.keys("v")) == list(range(50, 100))
    finally:
        for x in made:
            x.close()


def test_the_database_compacts_files_full_of_deletions(make_backend):
    """TTL through compaction on this binding: expired values are deleted, and the
    database's options carry RocksDB's compact-on-deletion collector, so files that
    fill with those tombstones are compacted (RocksDB records its options in the
    database directory)."""
    b = make_backend("disk", Clock())
    options = "".join(open(f).read() for f in glob.glob(os.path.join(b.path, "OPTIONS-*")))
    assert "CompactOnDeletionCollector" in options


# -- the vectorized path -----------------------------------------------------------------------

@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
def test_batch_reads_and_writes_follow_the_per_key_semantics(make_backend, cfg):
    """The batch reads and writes of a TTL value state against a dict model, with the
    same key both read one by one (heap) and by batch (disk)."""
    clock = Clock()
    b = make_backend("disk", clock)
    heap = make_backend("heap", clock)
    state = b.value_state("v", ttl=cfg)
    assert isinstance(state, DiskTtlValueState)
    one_by_one = heap.value_state("v", ttl=cfg)
    rng = np.random.default_rng(3)
    keys = list(range(60))
    pairs = [(k, rs.key_group_of(k, MAXP)) for k in keys]
    for _ in range(40):
        chosen = sorted(rng.choice(len(keys), size=int(rng.integers(1, 20)), replace=False))
        batch = [pairs[i] for i in chosen]
        want = []
        for k, g in batch:
            heap.set_current_key(k, g)
            want.append(one_by_one.value())
        stored = state.entry_keys([k for k, _ in batch], [g for _, g in batch])  # as reduce does
        assert state.values_at(stored) == want
        if rng.random() < 0.6:
            values = rng.integers(0, 100, len(batch)).tolist()
            state.update_at(stored, values)
            for (k, g), v in zip(batch, values):
                heap.set_current_key(k, g)
                one_by_one.update(v)
        clock.now += int(rng.integers(0, 60))
    assert dump_values(b, "v") == dump_values(heap, "v")


def dump_values(b, name: str) -> dict:
    """The values of a value state live at ``b``'s clock, through a snapshot of ``b``
    (which leaves the expired ones out) restored with a clock at 0 (nothing expires)."""
    r = (DiskKeyedStateBackend if isinstance(b, DiskKeyedStateBackend) else
         HeapKeyedStateBackend)(max_parallelism=MAXP, key_groups=range(MAXP),
                                ttl_time_provider=lambda: 0)
    try:
        r.restore(b.snapshot()())
        v = r.value_state(name, ttl=rs.StateTtlConfig(TTL, cleanup_per_access=0))
        out = {}
        for k in r.keys(name):
            r.set_current_key(k)
            out[k] = v.value()
        return out
    finally:
        if isinstance(r, DiskKeyedStateBackend):
            r.close()


# -- a real job on the disk backend through a subtask kill ------------------------------------

JOB_TTL_MS = 400
LONG_TTL_MS = 600_000


class Probe(rs.KeyedProcessFunction):
    """``put`` writes ``value`` (400 ms TTL), ``seen`` (a map, 400 ms TTL) and ``kept``
    (a long TTL); ``get`` reads ``value`` and ``kept``; ``audit`` reads ``seen``. Every
    row reports the wall clock just before and after its state access."""

    def open(self, ctx):
        self.value = ctx.value_state("value", ttl=rs.StateTtlConfig(JOB_TTL_MS))
        self.seen = ctx.map_state("seen", ttl=rs.StateTtlConfig(JOB_TTL_MS))
        self.kept = ctx.list_state("kept", ttl=rs.StateTtlConfig(LONG_TTL_MS))
        assert isinstance(self.value, DiskTtlValueState), "the job must run on the disk backend"

    def process_element(self, row, ctx):
        got = kept = None
        before = time.time() * 1000
        if row["op"] == "put":
            self.value.update(row["id"])
            self.seen.put("last", row["id"])
            self.kept.add(row["id"])
        elif row["op"] == "get":
            got, kept = self.value.value(), self.kept.get()
        else:
            got = self.seen.get("last")
        after = time.time() * 1000
        yield {"id": row["id"], "k": ctx.current_key, "op": row["op"], "got": got,
               "kept": kept, "before": before, "after": after}


def probe_input() -> list[dict]:
    """Rounds over keys 0-11: a put, a get right away, later a get and an audit; the
    rows are spaced by 30 ms so the job runs about 10 s (checkpoints, a kill, a restore
    in the middle)."""
    rows = []
    for round_ in range(4):
        for k in range(12):
            rows += [{"k": k, "op": "put"}, {"k": k, "op": "get"}]
        for k in range(12):
            rows += [{"k": k, "op": "get"}, {"k": k, "op": "audit"}]
        rows += [{"k": 100 + round_, "op": "put"}] * 40  # a slow gap between rounds
    return [{"id": i, "pause_ms": 30, **row} for i, row in enumerate(rows)]


@pytest.mark.slow
def test_ttl_state_on_the_disk_backend_through_a_subtask_kill(ray_session, tmp_path):
    import ray

    from tests.support.jobs import wait_for_checkpoint

    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk"),
                                        retained=2, state_backend="disk"),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    src = env.from_collection(probe_input(), schema=PROBE_SCHEMA, batch_size=1, name="rows",
                              parallelism=1).map_batches(pause, name="pause", parallelism=1)
    sink = src.key_by("k").process(Probe(), name="probe").collect()
    client = env.execute_async("disk-ttl-kill")
    completed = wait_for_checkpoint(client, after=2, timeout_s=120)
    ray.kill(client.subtask_actor("probe", 0))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1 and result.restores[0]["checkpoint_id"] >= completed
    out = result.table(sink).to_pandas().sort_values("id")
    assert out["id"].tolist() == [r["id"] for r in probe_input()]  # each row exactly once

    checked = {"live": 0, "expired": 0}
    for _, rows in out[out["k"] < 100].groupby("k"):
        put = None
        puts: list[int] = []
        for r in rows.itertuples():  # one key's rows are processed in input order
            if r.op == "put":
                put = r
                puts.append(r.id)
                continue
            assert put is not None
            got = None if r.got is None or pd.isna(r.got) else int(r.got)
            if r.after - put.before < JOB_TTL_MS - 1:
                assert got == put.id, r
                checked["live"] += 1
            elif r.before - put.after > JOB_TTL_MS + 1:
                assert got is None, r
                checked["expired"] += 1
            if r.op == "get":  # the long-TTL list keeps every put, through the restore
                assert list(r.kept) == puts, r
    assert checked["live"] >= 12 and checked["expired"] >= 12, checked
