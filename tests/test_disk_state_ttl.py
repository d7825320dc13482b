"""State TTL on the disk (RocksDB) keyed state backend, against the heap backend's semantics.

Every scenario runs on both backends with an injected TTL clock
(``ttl_time_provider``) and is checked against a pure-Python model of what must be
visible (the ``Model`` of tests/test_state_ttl.py: dicts of ``(value, timestamp)``).
Snapshots are restored at another key-group range and into the other backend, and
must keep the timestamps; expired entries must be absent from full snapshot
sections; the incremental cleanup must bound what keys never read again keep;
a state gaining or losing its TTL on restore is refused. The job test runs a keyed
process function with TTL state on ``state_backend="disk"`` through a real subtask
kill and checks every read against the wall-clock times the job recorded around it.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import os
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raystream as rs
from raystream.checkpoint.disk_state import (DiskKeyedStateBackend, DiskStateOptions,
                                             DiskTtlValueState, section_entries)
from raystream.checkpoint.envelope import KEYED_STATE, SectionKind, read
from raystream.checkpoint.state import HeapKeyedStateBackend
from tests.test_state_ttl import MISSING, Clock, Model, Sum

MAXP = 16
TTL = 100
KINDS = ["heap", "disk"]


@contextlib.contextmanager
def backends():
    """``make(kind, clock, key_groups=range(MAXP))``: a backend of ``kind``
    ("heap" or "disk") with TTL clock ``clock``; disk ones are closed on exit."""
    made = []

    def build(kind: str, clock, key_groups: range = range(MAXP)):
        if kind == "heap":
            return HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                         ttl_time_provider=clock)
        b = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                  options=DiskStateOptions(memory_mb=8),
                                  ttl_time_provider=clock)
        made.append(b)
        return b
    try:
        yield build
    finally:
        for b in made:
            b.close()


@pytest.fixture
def make():
    with backends() as build:
        yield build


def handles(b, ttl: rs.StateTtlConfig) -> dict:
    return {"v": b.value_state("v", ttl=ttl), "l": b.list_state("l", ttl=ttl),
            "m": b.map_state("m", ttl=ttl),
            "r": b.reducing_state("r", lambda a, c: a + c, ttl=ttl),
            "a": b.aggregating_state("a", Sum(), ttl=ttl)}


def dump(b, ttl_ms: int) -> dict:
    """Everything visible in ``b`` at its clock, as ``{(state, key): value}`` (the
    ``Model.live_at`` shape), read through the public API with a plain TTL config."""
    h = handles(b, rs.StateTtlConfig(ttl_ms, cleanup_per_access=0))
    out = {}
    for name, handle in h.items():
        for key in list(b.keys(name)):
            b.set_current_key(key)
            if name == "v":
                got = handle.value()
            elif name == "l":
                got = handle.get() or None
            elif name == "m":
                got = dict(handle.items()) or None
            else:
                got = handle.get()
            if got is not None:
                out[(name, key)] = got
    return out


def stored_entries(sections: dict[int, bytes]) -> dict[str, int]:
    """How many stored values (values, lists, maps) each state has in full snapshot
    sections of either backend."""
    counts: dict[str, int] = {}
    for kg, data in sections.items():
        envelope, body = read(data, key_group=kg, max_parallelism=MAXP, kinds=KEYED_STATE)
        if envelope.kind is SectionKind.DISK_STATE:
            for name, *_ in section_entries(kg, body):
                counts[name] = counts.get(name, 0) + 1
        else:
            heap = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(kg, kg + 1))
            heap.restore([(kg, data)])
            for name in heap.state_names():
                counts[name] = counts.get(name, 0) + len(list(heap.keys(name)))
    return counts


def restore_split(make, kind: str, sections: dict[int, bytes], now: int, parts: int) -> list:
    """Backends of ``kind`` restored from ``sections`` at ``parts`` key-group ranges."""
    out = []
    for i in range(parts):
        r = make(kind, Clock(now), rs.key_group_range(i, parts, MAXP))
        r.restore(sections)
        out.append(r)
    return out


# -- the same scenarios, both backends ------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("update_on", ["create_and_write", "read_and_write"])
def test_every_kind_expires_and_reads_renew_only_when_asked(make, kind, update_on):
    clock = Clock()
    b = make(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, update_on=update_on))
    b.set_current_key("k")
    h["v"].update("x")
    h["l"].add(1)
    h["m"].put("a", 1)
    h["r"].add(1)
    h["a"].add(1)
    clock.now += TTL - 1

    def read():
        return (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get(), h["a"].get())
    assert read() == ("x", [1], [("a", 1)], 1, (1, 1))
    clock.now += 1
    if update_on == "read_and_write":  # renewed one ms ago
        assert read() == ("x", [1], [("a", 1)], 1, (1, 1))
        clock.now += TTL
    assert read() == (None, [], [], None, None)
    assert all(list(b.keys(name)) == [] for name in h)  # the reads deleted what expired


@pytest.mark.parametrize("kind", KINDS)
def test_list_elements_and_map_entries_expire_one_by_one(make, kind):
    clock = Clock()
    b = make(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL))
    b.set_current_key(7)
    h["l"].add_all([1, 2])
    h["m"].put_all({"a": 1, "b": 2})
    h["r"].add(10)
    h["a"].add(10)
    clock.now += 60
    h["l"].add(3)
    h["m"].put("b", 20)
    clock.now += 60
    assert h["l"].get() == [3]
    assert h["m"].items() == [("b", 20)] and h["m"].keys() == ["b"] and h["m"].values() == [20]
    assert not h["m"].contains("a") and h["m"].get("a", "gone") == "gone"
    h["r"].add(5)  # the expired 10 counts as unset
    h["a"].add(5)
    assert (h["r"].get(), h["a"].get()) == (5, (5, 1))
    h["m"].remove("b")
    assert h["m"].is_empty() and list(b.keys("m")) == []
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        h["l"].merge_namespaces("a", ["b"])


@pytest.mark.parametrize("kind", KINDS)
def test_return_expired_if_not_cleaned_up_returns_it_once(make, kind):
    clock = Clock()
    b = make(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                                     cleanup_per_access=0))
    b.set_current_key(1)
    h["v"].update("old")
    h["l"].add_all([1, 2])
    h["m"].put("a", 1)
    h["r"].add(4)
    clock.now += TTL
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get()) == \
        ("old", [1, 2], [("a", 1)], 4)
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get()) == \
        (None, [], [], None)


# -- model: random interleavings on both backends --------------------------------------------

KEYS = [0, 1, "a", ("t", 2), 5.5]
small = st.integers(-3, 9)
OPS = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(KEYS)),
    st.tuples(st.just("tick"), st.integers(0, 70)),
    st.tuples(st.just("v_set"), small),
    st.tuples(st.just("v_get")),
    st.tuples(st.just("l_add"), small),
    st.tuples(st.just("l_update"), st.lists(small, max_size=3)),
    st.tuples(st.just("l_get")),
    st.tuples(st.just("m_put"), st.integers(0, 3), small),
    st.tuples(st.just("m_get"), st.integers(0, 3)),
    st.tuples(st.just("m_contains"), st.integers(0, 3)),
    st.tuples(st.just("m_items")),
    st.tuples(st.just("m_remove"), st.integers(0, 3)),
    st.tuples(st.just("r_add"), small),
    st.tuples(st.just("r_get")),
    st.tuples(st.just("a_add"), small),
    st.tuples(st.just("a_get")),
    st.tuples(st.just("clear"), st.sampled_from("vlmra")),
    st.tuples(st.just("snap")),
    st.tuples(st.just("run"), st.integers(0, 5), st.integers(0, 150)),
)

CONFIGS = [rs.StateTtlConfig(TTL, cleanup_per_access=2),
           rs.StateTtlConfig(TTL, update_on="read_and_write"),
           rs.StateTtlConfig(TTL, update_on="read_and_write",
                             visibility="return_expired_if_not_cleaned_up",
                             cleanup_per_access=0)]


def step(h: dict, model: Model, key, now: int, kind: str, args: list) -> None:  # noqa: C901
    """Apply one operation to the state handles and the model, checking every read."""
    def want(v):
        return None if v is MISSING else v
    if kind == "v_set":
        h["v"].update(args[0])
        model.single["v"][key] = (args[0], now)
    elif kind == "v_get":
        assert h["v"].value() == want(model.read_single("v", key, now))
    elif kind == "l_add":
        h["l"].add(args[0])
        model.lists.setdefault(key, []).append((args[0], now))
    elif kind == "l_update":
        h["l"].update(args[0])
        if args[0]:
            model.lists[key] = [(v, now) for v in args[0]]
        else:
            model.lists.pop(key, None)
    elif kind == "l_get":
        assert h["l"].get() == model.read_list(key, now)
    elif kind == "m_put":
        h["m"].put(args[0], args[1])
        model.maps.setdefault(key, {})[args[0]] = (args[1], now)
    elif kind == "m_get":
        assert h["m"].get(args[0]) == want(model.read_map_key(key, args[0], now))
    elif kind == "m_contains":
        assert h["m"].contains(args[0]) == \
            (model.read_map_key(key, args[0], now) is not MISSING)
    elif kind == "m_items":
        assert h["m"].items() == model.read_map(key, now)
    elif kind == "m_remove":
        h["m"].remove(args[0])
        d = model.maps.get(key, {})
        d.pop(args[0], None)
        if not d:
            model.maps.pop(key, None)
    elif kind == "r_add":
        h["r"].add(args[0])
        cur = model.live_single("r", key, now)
        model.single["r"][key] = (args[0] if cur is MISSING else cur + args[0], now)
    elif kind == "r_get":
        assert h["r"].get() == want(model.read_single("r", key, now))
    elif kind == "a_add":
        h["a"].add(args[0])
        cur = model.live_single("a", key, now)
        acc = [0, 0] if cur is MISSING else list(cur)
        model.single["a"][key] = ([acc[0] + args[0], acc[1] + 1], now)
    elif kind == "a_get":
        got = model.read_single("a", key, now)
        assert h["a"].get() == (None if got is MISSING else tuple(got))
    elif kind == "clear":
        h[args[0]].clear()
        stores = {"l": model.lists, "m": model.maps, **model.single}
        stores[args[0]].pop(key, None)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OPS, max_size=70))
def test_model_on_both_backends_with_snapshots_restored_across_backends(cfg, ops):
    """Both backends follow the model op by op (the cleanup never changes what a read
    sees); a snapshot restored into either backend at two key-group ranges, read
    later, holds what the model held at the snapshot, expired at the later time (so
    the timestamps came through)."""
    with backends() as make:
        run_model(make, cfg, ops)


def run_model(make, cfg: rs.StateTtlConfig, ops: list) -> None:
    clock = Clock()
    backends = {kind: make(kind, clock) for kind in KINDS}
    hs = {kind: handles(b, cfg) for kind, b in backends.items()}
    models = {kind: Model(cfg) for kind in KINDS}
    key = KEYS[0]
    for b in backends.values():
        b.set_current_key(key)
    pending: list = []
    for op, *args in ops:
        now = clock.now
        if op == "key":
            key = args[0]
            for b in backends.values():
                b.set_current_key(key)
        elif op == "tick":
            clock.now += args[0]
        elif op == "snap":
            pending.append((now, {k: b.snapshot() for k, b in backends.items()},
                            copy.deepcopy(models["disk"])))
        elif op == "run" and pending:
            at, snaps, model = pending.pop(args[0] % len(pending))
            later = at + args[1]
            for source, snap in snaps.items():
                sections = snap()
                target = "heap" if source == "disk" else "disk"
                got = {}
                for r in restore_split(make, target, sections, later, 2):
                    got.update(dump(r, cfg.ttl_ms))
                assert got == model.live_at(later), (source, at, later)
        elif op not in ("run",):
            for kind in KINDS:
                step(hs[kind], models[kind], key, now, op, args)
    for kind, b in backends.items():
        r = make(kind, Clock(clock.now))
        r.restore(b.snapshot()())
        assert dump(r, cfg.ttl_ms) == models[kind].live_at(clock.now)
    for snap in (s for _, snaps, _ in pending for s in snaps.values()):
        snap.release()


# -- snapshots, restore, cleanup -----------------------------------------------------------

@pytest.mark.parametrize("source", KINDS)
def test_snapshot_leaves_expired_out_and_restores_keep_timestamps_across_backends(make, source):
    clock = Clock()
    b = make(source, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=0))
    for k in range(40):
        b.set_current_key(k)
        h["v"].update(k)
        h["l"].add(k)
        h["m"].put("x", k)
    clock.now += 60
    for k in range(20):  # written again: they outlive the others by 60 ms
        b.set_current_key(k)
        h["v"].update(-k)
        h["l"].add(-k)
        h["m"].put("y", -k)
    clock.now += 50  # the first writes expired (the list's and map's first parts too)
    sections = b.snapshot()()
    assert len(set(b.keys("v"))) == 40  # nothing was cleaned up in the live backend
    assert stored_entries(sections) == {"v": 20, "l": 20, "m": 20}  # but the snapshot ...
    for target in KINDS:  # ... holds only live values, restored anywhere
        for parts in (1, 3):
            shown = {}
            for r in restore_split(make, target, sections, clock.now, parts):
                rh = handles(r, rs.StateTtlConfig(
                    TTL, visibility="return_expired_if_not_cleaned_up", cleanup_per_access=0))
                for k in r.keys("v"):
                    r.set_current_key(k)
                    shown[k] = (rh["v"].value(), rh["l"].get(), rh["m"].items())
            assert shown == {k: (-k, [-k], [("y", -k)]) for k in range(20)}, (target, parts)
        # the timestamps came through: values written at +60 expire at +60 + TTL
        (r,) = restore_split(make, target, sections, clock.now + TTL - 51, 1)
        (gone,) = restore_split(make, target, sections, clock.now + TTL - 50, 1)
        assert dump(r, TTL) == {**{("v", k): -k for k in range(20)},
                                **{("l", k): [-k] for k in range(20)},
                                **{("m", k): {"y": -k} for k in range(20)}}
        assert dump(gone, TTL) == {}


def test_a_disk_snapshot_restored_into_disk_is_byte_for_byte_when_nothing_expired(make):
    clock = Clock()
    b = make("disk", clock)
    h = handles(b, rs.StateTtlConfig(TTL))
    for k in range(30):
        b.set_current_key(k)
        h["v"].update({"k": k})
        h["l"].add_all([k, (k, "t")])
        h["m"].put(("u", k), [k])
        h["r"].add(k)
        h["a"].add(k)
    sections = b.snapshot()()
    r = make("disk", clock)
    r.restore(sections)
    handles(r, rs.StateTtlConfig(TTL, cleanup_per_access=0))  # as dump() declares them
    assert r.snapshot()() == sections
    heap = make("heap", clock)  # and through the heap backend and back, the same state
    heap.restore(sections)
    back = make("disk", clock)
    back.restore(heap.snapshot()())
    assert dump(back, TTL) == dump(r, TTL) and len(dump(r, TTL)) == 5 * 30


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_cleanup_bounds_what_keys_never_read_again_keep(make, kind):
    clock = Clock()
    b = make(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=5))
    for k in range(500):
        b.set_current_key(k)
        h["v"].update(k)
        h["l"].add(k)
        h["m"].put(k, k)
        h["r"].add(k)
    assert all(len(set(b.keys(name))) == 500 for name in ("v", "l", "m", "r"))
    clock.now += TTL
    b.set_current_key("reader")  # one live key, touched over and over
    for _ in range(300):  # 5 entries per access: 1,500 slots for 500 entries and 16 groups
        h["v"].update(1)
        h["l"].get()
        h["m"].contains(0)
        h["r"].get()
    assert [sorted(map(str, b.keys(name))) for name in ("v", "l", "m", "r")] == \
        [["reader"], [], [], []]
    assert stored_entries(b.snapshot()()) == {"v": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_cleanup_removes_only_the_expired_elements_and_entries(make, kind):
    clock = Clock()
    b = make(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=3))
    for k in range(50):
        b.set_current_key(k)
        h["l"].add(k)
        h["m"].put("old", k)
    clock.now += 60
    for k in range(50):
        b.set_current_key(k)
        h["l"].add(-k)
        h["m"].put("new", -k)
    clock.now += 50
    b.set_current_key("reader")
    for _ in range(200):
        h["l"].get()
        h["m"].get("x")
    clock.now = 0  # a snapshot at time 0 leaves nothing out: the stored values as they are
    stored = make(kind, Clock(0))
    stored.restore(b.snapshot()())
    rh = handles(stored, rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                                          cleanup_per_access=0))
    for k in range(50):
        stored.set_current_key(k)
        assert rh["l"].get() == [-k] and rh["m"].items() == [("new", -k)]


@pytest.mark.parametrize("source", KINDS)
@pytest.mark.parametrize("target", KINDS)
def test_a_state_cannot_gain_or_lose_its_ttl_across_a_restore(make, source, target):
    clock = Clock()
    b = make(source, clock)
    b.set_current_key(1)
    b.value_state("plain").update(1)
    b.list_state("timed", ttl=rs.StateTtlConfig(TTL)).add(2)
    sections = b.snapshot()()
    r = make(target, clock)
    r.restore(sections)
    with pytest.raises(ValueError, match="state 'plain' has no TTL .*restored from a "
                                         "checkpoint.* now declared with one"):
        r.value_state("plain", ttl=rs.StateTtlConfig(TTL))
    with pytest.raises(ValueError, match="state 'timed' has a TTL .* now declared without "
                                         "one: a state cannot gain or lose its TTL"):
        r.list_state("timed")
    with pytest.raises(ValueError, match="state 'timed' is list\\+ttl state, not map\\+ttl"):
        r.map_state("timed", ttl=rs.StateTtlConfig(TTL))
    r.list_state("timed", ttl=rs.StateTtlConfig(2 * TTL))  # another ttl_ms is fine
    with pytest.raises(ValueError, match="state 'timed' is declared with two TTLs"):
        r.list_state("timed", ttl=rs.StateTtlConfig(TTL))
    with pytest.raises(TypeError, match="state 'x': ttl must be a rs.StateTtlConfig, got int"):
        r.value_state("x", ttl=100)


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
        assert stored_entries(savepoint) == {"v": 50}
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


def test_the_database_compacts_files_full_of_deletions(make):
    """TTL through compaction on this binding: expired values are deleted, and the
    database's options carry RocksDB's compact-on-deletion collector, so files that
    fill with those tombstones are compacted (RocksDB records its options in the
    database directory)."""
    b = make("disk", Clock())
    options = "".join(open(f).read() for f in glob.glob(os.path.join(b.path, "OPTIONS-*")))
    assert "CompactOnDeletionCollector" in options


# -- the vectorized path -----------------------------------------------------------------------

@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
def test_batch_reads_and_writes_follow_the_per_key_semantics(make, cfg):
    """The batch reads and writes of a TTL value state against a dict model, with the
    same key both read one by one (heap) and by batch (disk)."""
    clock = Clock()
    b = make("disk", clock)
    heap = make("heap", clock)
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
        stored = state.entry_keys(batch)  # as keyed reduce reads and writes a batch
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
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("op", pa.string()),
                    ("pause_ms", pa.int64())])


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


def pause(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(sum(batch["pause_ms"].to_pylist()) / 1000)
    return batch


def test_ttl_state_on_the_disk_backend_through_a_subtask_kill(ray_session, tmp_path):
    import ray

    from tests.test_exactly_once import wait_for_checkpoint

    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk"),
                                        retained=2, state_backend="disk"),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    src = env.from_collection(probe_input(), schema=SCHEMA, batch_size=1, name="rows",
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
