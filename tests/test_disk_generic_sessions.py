"""Session windows of user functions on the disk state backend: a key's open sessions
and their small accumulators in a header entry, a ``ProcessWindowFunction``'s rows in
a chunk entry per batch, against the heap backend and pandas.

Operator-level tests drive a heap and a disk :class:`WindowOperator` (a user
``AggregateFunction`` or a ``ProcessWindowFunction`` over session windows) with the
same batches and watermarks (disorder, rows beyond the bound to the late side output,
allowed lateness) and check both against a pandas oracle; others merge sessions across
batches, feed one open session of a ``ProcessWindowFunction`` by many batches (one
chunk each, the header of constant size, no chunk rewritten, the rows fired in
arrival order), use string keys with nulls, restore snapshots at parallelism 1, then
2, then 3, move a heap snapshot into a disk job, restore an older checkpoint's
single-entry keys as headers and chunks and move disk sections into heap subtasks; Ray
jobs run through a subtask kill with full and incremental checkpoints.
"""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.disk_layout import pack_value, unpack_value
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.envelope import is_keyed_state
from raystream.checkpoint.sections import decode_parts
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.windows.disk_generic_sessions import (CHUNKS_KIND, CHUNKS_NAME, KIND,
                                                            STATE_NAME, DiskGenericSessions)
from raystream.engine.windows.functions import ProcessWindow, UserAggregate
from raystream.engine.windows.generic import DiskGenericSessionWindows, HeapGenericWindows
from raystream.engine.windows.operator import WindowOperator
from tests.chaos.model import SessionRun
from tests.support.disk import appended_one_chunk, own_entries, restore_moving_nothing
from tests.support.functions import Average, RowIds, Spread
from tests.support.inputs import BLOCK, JOB_GAP, session_events, session_input
from tests.support.jobs import disk_env, run_through_a_kill, savepoint_chain
from tests.support.operators import GAP, MAXP, SESSIONS, heap_and_disk_sessions, user_operator
from tests.support.oracles import WINDOW_KEYS, final_sessions, user_sessions_oracle
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

KINDS = ["aggregate", "process"]


def stored(op: WindowOperator) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """The headers (``kg | sid | len(key) | key``) and the chunks (a header's key and a
    seq) in the operator's RocksDB, by stored key."""
    backend = op.backend
    assert isinstance(backend, DiskKeyedStateBackend)
    sid = backend.raw_state_id(CHUNKS_NAME, CHUNKS_KIND)
    entries = [(k, v) for k, v in own_entries(op) if k[2:4] == sid]
    heads = {k: v for k, v in entries if len(k) == 8 + struct.unpack_from(">I", k, 4)[0]}
    return heads, {k: v for k, v in entries if k not in heads}


def stored_sessions(op: WindowOperator) -> dict:
    """Key -> (start, end) of its open sessions in RocksDB."""
    return {DiskKeyedStateBackend.decode_key(k[8:]): [(s, e) for s, e, _, _ in unpack_value(v)[1]]
            for k, v in stored(op)[0].items()}


def value_of(frame: pd.DataFrame) -> pd.Series:
    return pd.Series(frame["avg"] if "avg" in frame.columns else frame["spread"])


def results(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.assign(value=value_of(frame)).loc[:, [*WINDOW_KEYS, "rows", "value"]]
    return out.astype({"rows": np.int64}).sort_values(WINDOW_KEYS).reset_index(drop=True)


def model_results(run: SessionRun, kind: str) -> pd.DataFrame:
    """The model's emissions as :func:`results` gives the operator's."""
    out = pd.DataFrame([{"k": k, "window_start": s, "window_end": e, "rows": len(v),
                         "value": sum(v) / len(v) if kind == "aggregate" else max(v) - min(v)}
                        for k, s, e, v in run.emissions])
    return out.sort_values([*WINDOW_KEYS, "rows", "value"]).reset_index(drop=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lateness, straggle", [(0, 300), (30, 300), (0, 80), (30, 80)])
def test_disk_user_sessions_equal_heap_and_the_model(kind, lateness, straggle):
    key, ts, x = session_input(seed=lateness + 7, n=1200, keys=8, jitter=19 + lateness,
                               straggle=straggle)
    op, disk, run, arrival = heap_and_disk_sessions(
        lambda backend: user_operator(backend, SESSIONS, kind, lateness=lateness), key, ts, x,
        lateness)
    store = op.store
    assert isinstance(store, DiskGenericSessionWindows) and not store.entries and not store.sessions
    assert isinstance(op.backend, DiskKeyedStateBackend)
    assert op.backend.state_kind(CHUNKS_NAME) == CHUNKS_KIND
    got = results(disk).sort_values([*WINDOW_KEYS, "rows", "value"]).reset_index(drop=True)
    want = model_results(run, kind)
    pd.testing.assert_frame_equal(got[[*WINDOW_KEYS, "rows"]], want[[*WINDOW_KEYS, "rows"]],
                                  check_dtype=False)
    np.testing.assert_allclose(got["value"], want["value"])
    final = results(final_sessions(disk))
    if lateness:
        assert len(disk) > len(final)  # some sessions fired again
    else:
        assert len(disk) == len(final)
    own_late = int(np.count_nonzero(ts + GAP - 1 + lateness <= np.array(arrival)))
    assert own_late > 5, "the input must hold rows beyond the bound"
    assert (own_late > len(run.late)) == (straggle == 80)  # at 80 ms some rows are kept


def test_sessions_merge_across_batches_in_one_entry_per_key():
    op = user_operator(StateBackend.DISK, SESSIONS, "aggregate")
    op.initialize_state(None)
    op.open()
    for k, t, v in [("a", 100, 1.0), ("a", 120, 2.0), ("b", 100, 5.0)]:
        op.process_batch(pa.record_batch({"k": [k], "ts": [t], "x": [v]}))
    assert stored_sessions(op) == {"a": [(100, 115), (120, 135)], "b": [(100, 115)]}
    op.process_batch(pa.record_batch({"k": ["a"], "ts": [110], "x": [3.0]}))  # bridges both
    assert stored_sessions(op) == {"a": [(100, 135)], "b": [(100, 115)]}
    op.process_watermark(120)  # b's session ends at 115: fired and deleted
    assert stored_sessions(op) == {"a": [(100, 135)]}
    op.process_watermark(200)
    assert stored_sessions(op) == {} and not getattr(op.store, "entries", None)
    out = op.output
    assert isinstance(out, CollectingOutput)
    assert pa.Table.from_batches(out.batches).to_pylist() == [
        {"k": "b", "window_start": 100, "window_end": 115, "avg": 5.0, "rows": 1},
        {"k": "a", "window_start": 100, "window_end": 135, "avg": 2.0, "rows": 3}]


def test_a_process_function_session_fed_by_n_batches_holds_n_chunks_none_rewritten():
    """One key's session of a ProcessWindowFunction fed by 40 batches, each followed by
    a watermark that fires the timers of the session's earlier ends (nothing is due):
    each batch adds one chunk and rewrites only the header, whose size stays the same
    (one session, one run of seqs); no earlier chunk changes. The firing hands the
    function every row in arrival order, as the heap operator does, and leaves
    nothing behind."""
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = WindowOperator("w", KeySelector.of("k"), SESSIONS, function=ProcessWindow(RowIds()),
                            timestamp="ts")
        op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
                 CollectingOutput())
        op.initialize_state(None)
        op.open()
        before: dict[bytes, bytes] = {}
        sizes: set[int] = set()
        for n in range(1, 41):
            ids = np.arange((n - 1) * 10, n * 10)
            op.process_batch(pa.record_batch({"k": np.full(10, 7), "ts": 1000 + 5 * ids,
                                              "x": ids.astype(np.float64)}))
            op.process_watermark(1000 + 5 * int(ids[-1]) - 20)
            assert not op.output.batches  # pyright: ignore[reportAttributeAccessIssue]
            if backend is StateBackend.HEAP:
                continue
            heads, chunks = stored(op)
            head, before = appended_one_chunk(heads, chunks, before, n)
            sizes.add(len(heads[head]))
        if backend is StateBackend.DISK:
            assert len(sizes) == 1 and max(sizes) < 40  # [next seq, [[start, end, 1, [0, n]]]]
            chunk_sizes = {len(v) for k, v in before.items() if k not in stored(op)[0]}
            assert len(chunk_sizes) == 1  # a chunk is one batch's 10 rows
        op.process_watermark(rs.MAX_WATERMARK)
        outputs.append(pa.Table.from_batches(op.output.batches).to_pylist())  # pyright: ignore[reportAttributeAccessIssue]
        if backend is StateBackend.DISK:
            assert stored(op) == ({}, {})
    ts = 1000 + 5 * np.arange(400)
    assert outputs[1] == outputs[0] == [
        {"k": 7, "window_start": int(ts[0]), "window_end": int(ts[-1]) + GAP,
         "ids": ",".join(map(str, range(400)))}]


class ChunkReads:
    """The disk backend's RocksDB, wrapped: it records the size of each multi-get (a list
    of keys) of chunks of the sessions' state and passes every call on."""

    def __init__(self, db, sid: bytes) -> None:
        self.db, self.sid, self.sizes = db, sid, []

    def __getitem__(self, key):
        if isinstance(key, list) and key and all(
                k[2:4] == self.sid and len(k) > 8 + struct.unpack_from(">I", k, 4)[0]
                for k in key):
            self.sizes.append(len(key))
        return self.db[key]

    def __getattr__(self, name: str):
        return getattr(self.db, name)


@pytest.mark.parametrize("limit", [None, 10])
def test_a_firing_reads_the_chunks_of_all_its_sessions_with_one_multi_get(limit):
    """30 keys' ProcessWindowFunction sessions, each fed by 3 batches (3 chunks): the
    watermark that fires them all reads their 90 chunks with one multi-get (before, one
    per session), or one per pop of at most ``limit`` timers, and the results equal
    pandas' and the heap operator's."""
    rng = np.random.default_rng(5)
    frames = [pd.DataFrame({"k": np.arange(30), "ts": 1000 + 4 * n + rng.integers(0, 3, 30),
                            "x": rng.normal(size=30)}) for n in range(3)]
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = user_operator(backend, SESSIONS, "process")
        op.initialize_state(None)
        op.open()
        for frame in frames:
            op.process_batch(pa.RecordBatch.from_pandas(frame, preserve_index=False))
        if backend is StateBackend.DISK:
            disk = op.backend
            assert isinstance(disk, DiskKeyedStateBackend)
            if limit is not None:
                op.disk_timers.firing_limit = limit
            reads = ChunkReads(disk.raw_db, disk.raw_state_id(CHUNKS_NAME, CHUNKS_KIND))
            setattr(disk, "_db", reads)  # its database, observed through the wrapper
            op.process_watermark(rs.MAX_WATERMARK)
            setattr(disk, "_db", reads.db)
            if limit is None:
                assert reads.sizes == [90]
            else:  # a pop's sessions' chunks at a time
                assert sum(reads.sizes) == 90 and max(reads.sizes) <= 3 * limit
                assert len(reads.sizes) >= 90 // (3 * limit)
            assert stored(op) == ({}, {})
        else:
            op.process_watermark(rs.MAX_WATERMARK)
        out = op.output
        assert isinstance(out, CollectingOutput)
        outputs.append(results(pa.Table.from_batches(out.batches).to_pandas()))
    want = user_sessions_oracle(pd.concat(frames), "process", GAP)
    assert len(want) == 30
    for got in outputs:
        pd.testing.assert_frame_equal(got[[*WINDOW_KEYS, "rows"]], want[[*WINDOW_KEYS, "rows"]],
                                      check_dtype=False)
        np.testing.assert_allclose(got["value"], want["value"])


class NullAware:
    """Counts rows and sums the non-null ``x`` (an AggregateFunction)."""

    def create_accumulator(self):
        return {"rows": 0, "nulls": 0, "total": 0.0}

    def add(self, row, acc):
        acc["rows"] += 1
        if row["x"] is None:
            acc["nulls"] += 1
        else:
            acc["total"] += row["x"]
        return acc

    def merge(self, a, b):
        return {name: a[name] + b[name] for name in a}

    def get_result(self, acc):
        return dict(acc)


def test_string_keys_and_null_values_on_disk_equal_heap_and_pandas():
    rng = np.random.default_rng(4)
    n = 600
    names = np.array(["ann", "bo", "chris", "dé", "e" * 40], dtype=object)
    key = names[rng.integers(0, len(names), n)]  # a null key is a bad record: none here
    ts = np.cumsum(rng.integers(0, 5, n)) - rng.integers(0, 10, n)
    x = rng.integers(-9, 9, n).astype(object)
    x[rng.random(n) < 0.2] = None
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = WindowOperator("w", KeySelector.of("k"), SESSIONS,
                            function=UserAggregate(NullAware(), "result"),  # pyright: ignore[reportArgumentType]
                            timestamp="ts", late_output="late")
        op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
                 CollectingOutput())
        op.initialize_state(None)
        op.open()
        for i in range(0, n, 40):
            op.process_batch(pa.record_batch({"k": pa.array(key[i:i + 40].tolist(), pa.string()),
                                              "ts": ts[i:i + 40],
                                              "x": pa.array(x[i:i + 40].tolist(), pa.float64())}))
            op.process_watermark(int(ts[:i + 40].max()) - 30)
        op.process_watermark(rs.MAX_WATERMARK)
        assert isinstance(op.output, CollectingOutput)
        assert "late" not in op.output.side_batches  # the bound holds the disorder
        outputs.append(pa.Table.from_batches(op.output.batches).to_pandas())
    pd.testing.assert_frame_equal(outputs[1], outputs[0])
    got = outputs[1].sort_values(WINDOW_KEYS).reset_index(drop=True)
    frame = pd.DataFrame({"k": key, "ts": ts,
                          "x": pd.Series(x, dtype="float64")})
    frame = frame.sort_values(["k", "ts"], kind="stable")
    new = (frame["k"] != frame["k"].shift()) | (frame["ts"].diff() > GAP)
    grouped = frame.assign(session=new.cumsum()).groupby("session")
    want = pd.DataFrame({"k": grouped["k"].first(), "window_start": grouped["ts"].min(),
                         "window_end": np.asarray(grouped["ts"].max()) + GAP,
                         "rows": grouped.size(),
                         "nulls": grouped["x"].apply(lambda s: int(s.isna().sum())),
                         "total": grouped["x"].sum()}
                        ).sort_values(WINDOW_KEYS).reset_index(drop=True)
    assert got[[*WINDOW_KEYS, "rows", "nulls"]].astype(str).equals(
        want[[*WINDOW_KEYS, "rows", "nulls"]].astype(str))
    np.testing.assert_allclose(got["total"], want["total"])


# -- snapshots --------------------------------------------------------------------------------

def start(backend: StateBackend, kind: str, sections: dict, index: int, parallelism: int,
          floor: int) -> WindowOperator:
    op = user_operator(backend, SESSIONS, kind, index=index, parallelism=parallelism)
    groups = rs.key_group_range(index, parallelism, MAXP)
    op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items() if g in groups],
                                      WatermarkFloors.from_json(floor, max_parallelism=MAXP)))
    op.open()
    return op


def feed(op: WindowOperator, frame: pd.DataFrame) -> None:
    groups = rs.key_group_range(op.ctx.subtask_index, op.ctx.parallelism, MAXP)
    mine = frame[[rs.key_group_of(k, MAXP) in groups for k in frame["k"].tolist()]]
    if len(mine):
        op.process_batch(pa.RecordBatch.from_pandas(mine[["k", "ts", "x"]], preserve_index=False))


def outputs_of(ops: list[WindowOperator]) -> pd.DataFrame:
    batches = [b for op in ops for b in op.output.batches]  # pyright: ignore[reportAttributeAccessIssue]
    return (pa.Table.from_batches(batches).to_pandas() if batches
            else pd.DataFrame({name: [] for name in [*WINDOW_KEYS, "rows"]}))


@pytest.mark.parametrize("kind", KINDS)
def test_snapshots_restore_at_1_then_2_then_3_and_heap_snapshots_move_in(kind):
    """A snapshot at parallelism 1 (sessions open on disk) restored at 2, a snapshot of
    those restored at 3: every session fires once, as pandas says; the same from a heap
    snapshot at 1, and from a disk snapshot at 1 into heap subtasks at 2 and 3."""
    rng = np.random.default_rng(2)
    n = 900
    frame = pd.DataFrame({"k": rng.integers(0, 40, n), "ts": np.sort(rng.integers(0, 6 * n, n)),
                          "x": rng.integers(-50, 50, n).astype(np.float64)})
    thirds = [frame.iloc[:300], frame.iloc[300:600], frame.iloc[600:]]
    floors = [int(third["ts"].max()) - 40 for third in thirds[:2]]

    def run(first: StateBackend, after: StateBackend = StateBackend.DISK) -> pd.DataFrame:
        op = user_operator(first, SESSIONS, kind)
        op.initialize_state(None)
        op.open()
        feed(op, thirds[0])
        op.process_watermark(floors[0])
        sections = op.snapshot_state(1).keyed_state
        assert sections is not None
        parts = [outputs_of([op])]
        snapshot = sections()
        if first is StateBackend.DISK:
            assert stored_sessions(op)  # sessions open at the snapshot
            assert not any("windows" in decode_parts(s) for s in snapshot.values()
                           if not is_keyed_state(s))  # the sessions are keyed state
        ops = [start(after, kind, snapshot, i, 2, floors[0]) for i in range(2)]
        snapshots = {}
        for op in ops:
            if after is StateBackend.DISK:  # restored into RocksDB
                assert not getattr(op.store, "entries", None) and stored_sessions(op)
            feed(op, thirds[1])
            op.process_watermark(floors[1])
            taken = op.snapshot_state(2).keyed_state
            assert taken is not None
            snapshots.update(taken())
        parts.append(outputs_of(ops))
        ops = [start(after, kind, snapshots, i, 3, floors[1]) for i in range(3)]
        for op in ops:
            feed(op, thirds[2])
            op.process_watermark(rs.MAX_WATERMARK)
            if after is StateBackend.DISK:
                assert stored_sessions(op) == {}
        parts.append(outputs_of(ops))
        return pd.concat(parts, ignore_index=True)

    want = user_sessions_oracle(frame, kind, GAP)
    for first, after in [(StateBackend.DISK, StateBackend.DISK),
                         (StateBackend.HEAP, StateBackend.DISK),  # heap at p=1 into disk
                         (StateBackend.DISK, StateBackend.HEAP)]:  # disk at p=1 into heap
        pd.testing.assert_frame_equal(results(run(first, after)), want, check_dtype=False)


@pytest.mark.parametrize("kind", KINDS)
def test_an_older_checkpoint_of_single_entry_keys_restores_as_headers_and_chunks(kind,
                                                                                 monkeypatch):
    """A checkpoint whose keys are one entry each, ``[[start, end, accumulator], ...]``
    with a ProcessWindowFunction's rows inline (the layout before chunks), restored
    into 2 subtasks: the keys become headers (and a chunk per session of rows), nothing
    stays in the older state, every session fires once, as pandas says; a checkpoint
    written since restores as it is, without a search for older entries. No checkpoint
    of that layout is at hand: the heap path's sessions (what the older code loaded
    and stored) are written as its entries through the backend's raw API."""
    rng = np.random.default_rng(12)
    n = 900
    frame = pd.DataFrame({"k": rng.integers(0, 30, n), "ts": np.sort(rng.integers(0, 6 * n, n)),
                          "x": rng.integers(-50, 50, n).astype(np.float64)})
    first, rest = frame.iloc[:450], frame.iloc[450:]
    floor = int(first["ts"].max()) - 40
    old = user_operator(StateBackend.DISK, SESSIONS, kind)
    with monkeypatch.context() as patch:  # the heap path's sessions beside a disk backend
        patch.setattr(WindowOperator, "open_store", lambda self: HeapGenericWindows(self))
        old.initialize_state(None)
        old.open()
        feed(old, first)
        old.process_watermark(floor)
        backend, timers = old.backend, old.disk_timers
        heap = old.store
        assert isinstance(heap, HeapGenericWindows) and not isinstance(heap, DiskGenericSessionWindows)
        assert isinstance(backend, DiskKeyedStateBackend) and heap.sessions
        sid = backend.raw_state_id(STATE_NAME, KIND)
        kids = list(heap.sessions)
        keys = backend.entry_keys(sid, [timers.key(k) for k in kids],
                                  timers.key_groups_of(np.array(kids)))
        for kid, key in zip(kids, keys):  # the older code's _store
            backend.raw_db[key] = pack_value([[start, *heap.entries[(kid, start)]]
                                         for start in sorted(heap.sessions[kid])])
        n_sessions = len(heap.entries)
        heap.entries.clear()
        heap.sessions.clear()
        taken = old.snapshot_state(1).keyed_state
        assert taken is not None
        sections = taken()
    ops = [start(StateBackend.DISK, kind, sections, i, 2, floor) for i in range(2)]
    n_heads = n_chunks = 0
    for op in ops:
        backend = op.backend
        assert isinstance(backend, DiskKeyedStateBackend)
        old_sid = backend.raw_state_id(STATE_NAME, KIND)
        assert not any(k[2:4] == old_sid for k, _ in own_entries(op))
        heads, chunks = stored(op)
        n_heads, n_chunks = n_heads + len(heads), n_chunks + len(chunks)
    assert n_heads == len(kids) and n_chunks == (n_sessions if kind == "process" else 0)
    later = ops[0].snapshot_state(2).keyed_state
    assert later is not None
    entries = dict(own_entries(ops[0]))
    again = restore_moving_nothing(monkeypatch, DiskGenericSessions,
                                   lambda: start(StateBackend.DISK, kind, later(), 0, 2, floor))
    assert dict(own_entries(again)) == entries
    for op in (again, ops[1]):
        feed(op, rest)
        op.process_watermark(rs.MAX_WATERMARK)
        assert stored(op) == ({}, {})
    got = pd.concat([outputs_of([old]), outputs_of([again, ops[1]])], ignore_index=True)
    pd.testing.assert_frame_equal(results(got), user_sessions_oracle(frame, kind, GAP),
                                  check_dtype=False)


# -- jobs on Ray ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_user_sessions_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                                 incremental):
    n = 16_000
    env = disk_env(str(tmp_path / "chk"), incremental=incremental)
    src = env.from_sequence(n, session_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=50))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.EventTimeSessionWindows(gap_ms=JOB_GAP), timestamp="ts").aggregate(
        Average()).collect()  # pyright: ignore[reportArgumentType]
    job = run_through_a_kill(env, f"disk-user-sessions-kill-{incremental}", "window")
    got = (job.table(sink).to_pandas().rename(columns={"user": "k"})
           .loc[:, [*WINDOW_KEYS, "rows", "avg"]].sort_values(WINDOW_KEYS).reset_index(drop=True))
    assert not got.duplicated(WINDOW_KEYS).any()  # no session emitted twice
    e = pd.DataFrame(session_events(np.arange(n))).rename(columns={"user": "k"})
    want = user_sessions_oracle(e, "aggregate", JOB_GAP)
    assert len(want) == 7 * -(-n // BLOCK)
    pd.testing.assert_frame_equal(got[[*WINDOW_KEYS, "rows"]], want[[*WINDOW_KEYS, "rows"]],
                                  check_dtype=False)
    np.testing.assert_allclose(got["avg"], want["value"])


@pytest.mark.slow
def test_process_function_sessions_through_savepoints_at_1_2_3(ray_session, tmp_path):
    """A ProcessWindowFunction over sessions on disk, stopped with a savepoint at
    parallelism 1, restored at 2, stopped again, restored at 3: every session once over
    the three runs, as pandas says."""
    n = 12_000

    def job(parallelism: int):
        env = disk_env(str(tmp_path / f"chk{parallelism}"), parallelism)
        src = env.from_sequence(n, session_events, batch_size=200,
                                watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=50))
        if parallelism < 3:
            src = src.map_batches(throttle, name="throttle")
        return env, src.key_by("user").window(
            rs.EventTimeSessionWindows(gap_ms=JOB_GAP), timestamp="ts").process(
            Spread()).collect()

    tables = [result.table(sink)
              for result, sink in savepoint_chain(tmp_path, "disk-user-sessions", job)]
    got = results(pa.concat_tables([t for t in tables if t.num_rows]).to_pandas())
    assert not got.duplicated(WINDOW_KEYS).any()
    e = pd.DataFrame(session_events(np.arange(n))).rename(columns={"user": "k"})
    want = user_sessions_oracle(e, "process", JOB_GAP)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
