"""Session window joins and co-groups on the disk state backend: each key's open
sessions in a small header entry and both sides' rows in a chunk entry per batch,
against the heap backend and pandas.

Operator-level tests drive a heap and a disk :class:`WindowJoinOperator` over session
windows with the same batches and watermarks (disorder, stragglers dropped as late)
and compare both with the pandas oracle of tests/support/oracles.py (sessions over
both sides' rows with ``groupby``/``diff``/``cumsum``); others merge sessions across
batches, feed one open session by many batches (one chunk each, the header one
session's bytes, no chunk rewritten), use string keys and null values (both row
formats), restore snapshots at parallelism 1, then 2, then 3, move heap snapshots
into disk subtasks and disk snapshots into heap subtasks, and restore an older
checkpoint's single-entry keys as chunks; Ray jobs run through a subtask kill (full and
incremental checkpoints), through savepoints at parallelism 1, 2 and 3, and from a
heap job's savepoint into a disk job.
"""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import RestoredState
from raystream.checkpoint.envelope import is_keyed_state
from raystream.checkpoint.sections import decode_parts
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators.disk_join import RowFormats
from raystream.engine.windows import disk_session_join
from raystream.engine.windows.disk_entries import is_header
from raystream.engine.windows.disk_session_join import DiskSessionRows
from raystream.engine.windows.join import WindowJoinKind, WindowJoinOperator
from tests.support.disk import appended_one_chunk, own_entries, restore_moving_nothing
from tests.support.functions import Average, co_groups
from tests.support.inputs import (JOB_GAP, STRAGGLER_START, join_events, join_input,
                                  session_events)
from tests.support.jobs import disk_env, run_through_a_kill, savepoint_chain, wait_for_checkpoint
from tests.support.operators import (JOIN_SESSION, MAXP, drive_join, output_of,
                                     window_join_operator, window_pairs_of, window_rows)
from tests.support.oracles import (expected_window_pairs, oracle_groups, oracle_pairs,
                                   rows_in_windows, user_sessions_oracle)
from tests.support.pacing import Throttle
from tests.support.pipelines import sides

crawl = Throttle(0.06)


def odd(left, right):
    """A JoinFunction: the pairs of an odd id sum."""
    return ({"id": left["id"], "id_right": right["id"]} if (left["id"] + right["id"]) % 2
            else None)


def finish(kind: WindowJoinKind, fn):
    return fn if fn is not None else (co_groups if kind is WindowJoinKind.CO_GROUP else None)


def disk_rows(op: WindowJoinOperator) -> DiskSessionRows:
    assert isinstance(op.disk_rows, DiskSessionRows)
    return op.disk_rows


def stored(op: WindowJoinOperator) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """The headers and the chunks in the operator's RocksDB, by stored key."""
    backend = op.backend
    assert isinstance(backend, DiskKeyedStateBackend)
    sid = backend.raw_state_id(disk_session_join.CHUNKS_NAME, disk_session_join.CHUNKS_KIND)
    entries = [(k, v) for k, v in own_entries(op) if k[2:4] == sid]
    return ({k: v for k, v in entries if is_header(k)},
            {k: v for k, v in entries if not is_header(k)})


@pytest.mark.parametrize("kind,fn", [(WindowJoinKind.JOIN, None), (WindowJoinKind.JOIN, odd),
                                     (WindowJoinKind.CO_GROUP, None)],
                         ids=["join", "apply", "co_group"])
def test_disk_session_join_equals_heap_and_pandas(kind, fn):
    """Disorder within the watermark's lag, stragglers a second late: the disk job's
    pairs (co-groups) are the heap's and pandas', and nothing is left stored."""
    frame = join_input(np.random.default_rng(5), 2000, keys=9, disorder=30)
    stragglers = frame.index[(frame.index % 89 == 88) & (frame.index > 300)]
    frame.loc[stragglers, "ts"] -= 1000
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = window_join_operator(backend, JOIN_SESSION, kind, finish(kind, fn))
        op.initialize_state(None)
        op.open()
        on_time, late = drive_join(op, frame, JOIN_SESSION)
        assert len(late) and op.metrics()["late_records_dropped"] == len(late)
        if backend is StateBackend.DISK:
            assert disk_rows(op).stored_entries() == 0 and not op.buffers[0].chunks
            assert op.timers.num_event_time_timers == 0
        outputs.append(window_rows(op, kind) if fn is None
                       else sorted(window_pairs_of(output_of(op))))
    left, right = (on_time.loc[on_time["side"] == side] for side in (0, 1))
    if kind is WindowJoinKind.CO_GROUP:
        expected = sorted(oracle_groups(left, right, JOIN_SESSION))
    else:
        expected = sorted(p for p in oracle_pairs(left, right, JOIN_SESSION)
                          if fn is None or fn({"id": p[0]}, {"id": p[1]}))
    assert outputs[1] == outputs[0] == expected and expected


def test_sessions_merge_across_batches_and_sides_in_one_header_per_key():
    op = window_join_operator(StateBackend.DISK, JOIN_SESSION)
    op.initialize_state(None)
    op.open()
    disk = disk_rows(op)

    def send(side: int, k: int, ts: int, id_: int) -> None:
        op.process_batch(pa.record_batch({"id": [id_], "k": [k], "ts": [ts]}), side)

    send(0, 1, 100, 0)
    send(1, 1, 200, 1)  # a session of its own: 200 > 100 + 30
    send(0, 2, 100, 2)
    assert disk.stored_entries() == 2
    op.process_watermark(129)  # key 1's first session and key 2's fire: no pair in either
    assert not op.output.batches and disk.stored_entries() == 1  # pyright: ignore[reportAttributeAccessIssue]
    send(1, 1, 170, 3)  # [170, 200) touches the right row's [200, 230): one session
    send(0, 1, 215, 4)
    op.process_watermark(300)
    assert sorted(window_pairs_of(output_of(op))) == [(4, 1, 170, 245), (4, 3, 170, 245)]
    assert disk.stored_entries() == 0


def test_a_session_fed_by_n_batches_holds_n_chunks_none_rewritten():
    """One key's session fed by 40 batches of alternating sides, each followed by a
    watermark that fires the timers of the session's earlier ends (nothing is due):
    each batch adds one chunk and rewrites only the header, which stays one session's
    28 bytes; no earlier chunk changes. The last watermark pairs every row as pandas
    says and leaves nothing behind."""
    op = window_join_operator(StateBackend.DISK, JOIN_SESSION)
    op.initialize_state(None)
    op.open()
    before: dict[bytes, bytes] = {}
    parts, heads, chunks = [], {}, {}
    for n in range(1, 41):
        ids = np.arange((n - 1) * 10, n * 10)
        part = pd.DataFrame({"id": ids, "k": 7, "ts": 1000 + 20 * ids, "side": n % 2})
        parts.append(part)
        op.process_batch(pa.RecordBatch.from_pandas(part[["id", "k", "ts"]],
                                                    preserve_index=False), n % 2)
        op.process_watermark(int(part["ts"].max()) - 40)
        assert not op.output.batches  # pyright: ignore[reportAttributeAccessIssue]
        heads, chunks = stored(op)
        head, before = appended_one_chunk(heads, chunks, before, n)
        assert len(heads[head]) == 12 + 16  # one session
    sizes = [len(v) for v in chunks.values()]
    assert max(sizes) == min(sizes)  # a chunk is one batch's 10 rows
    op.process_watermark(rs.MAX_WATERMARK)
    frame = pd.concat(parts)
    left, right = (frame.loc[frame["side"] == side] for side in (0, 1))
    expected = sorted(oracle_pairs(left, right, JOIN_SESSION))
    assert sorted(window_pairs_of(output_of(op))) == expected and len(expected) == 200 * 200
    assert disk_rows(op).stored_entries() == 0 and stored(op) == ({}, {})


def test_string_keys_and_null_values_in_both_row_formats():
    """Numbers without nulls are stored as fixed-width records, the rest as Arrow IPC:
    string keys, a nullable string column on the left, a float column on the right."""
    rng = np.random.default_rng(8)
    n = 900
    names = np.array(["ann", "bo", "chris", "dé"], dtype=object)
    frame = pd.DataFrame({"id": np.arange(n), "k": names[rng.integers(0, 4, n)],
                          "ts": np.sort(rng.integers(0, 12 * n, n)) + rng.integers(0, 20, n),
                          "side": rng.integers(0, 2, n)})
    note = pd.Series(rng.choice(np.array(["x", "y", None], dtype=object), n), dtype=object)
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = window_join_operator(backend, JOIN_SESSION)
        op.initialize_state(None)
        op.open()
        for start in range(0, n, 31):
            chunk = frame.iloc[start:start + 31]
            for side in (0, 1):
                part = chunk[chunk["side"] == side]
                if not len(part):
                    continue
                columns = {"id": part["id"].to_numpy(), "k": part["k"].tolist(),
                           "ts": part["ts"].to_numpy()}
                if side == 0:
                    columns["note"] = pa.array(note[part.index].tolist(), pa.string())
                else:
                    columns["score"] = part["id"].to_numpy() / 2
                op.process_batch(pa.record_batch(columns), side)
            op.process_watermark(int(chunk["ts"].max()) - 41)
        op.process_watermark(rs.MAX_WATERMARK)
        table = output_of(op)
        outputs.append(sorted(zip(table["id"].to_pylist(), table["id_right"].to_pylist(),
                                  table["window_start"].to_pylist(),
                                  table["window_end"].to_pylist(), table["note"].to_pylist(),
                                  table["score"].to_pylist())))
    left, right = (frame.loc[frame["side"] == side] for side in (0, 1))
    expected = sorted((a, b, s, e, note[a], b / 2)
                      for a, b, s, e in oracle_pairs(left, right, JOIN_SESSION))
    assert outputs[1] == outputs[0] == expected and expected
    assert any(row[4] is None for row in expected)


# -- snapshots --------------------------------------------------------------------------------

def restored(backend: StateBackend, kind: WindowJoinKind, sections: dict, index: int,
             parallelism: int, floor: int) -> WindowJoinOperator:
    op = window_join_operator(backend, JOIN_SESSION, kind, finish(kind, None), index=index,
                              parallelism=parallelism)
    groups = rs.key_group_range(index, parallelism, MAXP)
    op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items() if g in groups],
                                      WatermarkFloors.from_json(floor, max_parallelism=MAXP)))
    op.open()
    return op


def feed(op: WindowJoinOperator, frame: pd.DataFrame) -> None:
    groups = rs.key_group_range(op.ctx.subtask_index, op.ctx.parallelism, MAXP)
    mine = frame[[rs.key_group_of(k, MAXP) in groups for k in frame["k"].tolist()]]
    for side in (0, 1):
        part = mine[mine["side"] == side]
        if len(part):
            op.process_batch(pa.RecordBatch.from_pandas(part[["id", "k", "ts"]],
                                                        preserve_index=False), side)


def results(ops: list[WindowJoinOperator], kind: WindowJoinKind) -> list:
    return [row for op in ops for row in window_rows(op, kind)]


@pytest.mark.parametrize("kind", list(WindowJoinKind), ids=lambda k: k.value)
def test_snapshots_restore_at_1_then_2_then_3_and_heap_snapshots_move_in(kind):
    """A snapshot at parallelism 1 (sessions open on disk) restored at 2, a snapshot of
    those restored at 3: every pair (co-group) once, as pandas says; the same from a
    heap snapshot at 1, and from a disk snapshot at 1 restored into heap jobs at 2 and 3
    (its rows read back through a scratch database)."""
    frame = join_input(np.random.default_rng(6), 1500, keys=40, disorder=0)
    thirds = [frame.iloc[:500], frame.iloc[500:1000], frame.iloc[1000:]]
    floors = [int(third["ts"].max()) - 40 for third in thirds[:2]]

    def run(first: StateBackend, after: StateBackend = StateBackend.DISK) -> list:
        op = window_join_operator(first, JOIN_SESSION, kind, finish(kind, None))
        op.initialize_state(None)
        op.open()
        feed(op, thirds[0])
        op.process_watermark(floors[0])
        taken = op.snapshot_state(1).keyed_state
        assert taken is not None
        snapshot = taken()
        if first is StateBackend.DISK:
            assert disk_rows(op).stored_entries()  # sessions open at the snapshot
            assert not any("join" in decode_parts(s) for s in snapshot.values()
                           if not is_keyed_state(s))  # the rows are keyed state
        got = results([op], kind)
        ops = [restored(after, kind, snapshot, i, 2, floors[0]) for i in range(2)]
        snapshots = {}
        for op in ops:
            if after is StateBackend.DISK:
                assert disk_rows(op).stored_entries()  # restored into RocksDB
            feed(op, thirds[1])
            op.process_watermark(floors[1])
            later = op.snapshot_state(2).keyed_state
            assert later is not None
            snapshots.update(later())
        got += results(ops, kind)
        ops = [restored(after, kind, snapshots, i, 3, floors[1]) for i in range(3)]
        for op in ops:
            feed(op, thirds[2])
            op.process_watermark(rs.MAX_WATERMARK)
            if after is StateBackend.DISK:
                assert disk_rows(op).stored_entries() == 0
        return sorted(got + results(ops, kind))

    left, right = (frame.loc[frame["side"] == side] for side in (0, 1))
    expected = sorted(oracle_pairs(left, right, JOIN_SESSION) if kind is WindowJoinKind.JOIN
                      else oracle_groups(left, right, JOIN_SESSION))
    assert run(StateBackend.DISK) == expected and expected
    assert run(StateBackend.HEAP) == expected
    assert run(StateBackend.DISK, StateBackend.HEAP) == expected


def write_older_entries(op: WindowJoinOperator, frame: pd.DataFrame) -> None:
    """Store ``frame``'s rows (column ``side``) as raystream stored a session join's keys
    before chunks: one entry per key, ``n | n x (start, end) | chunks``, each chunk
    ``side | format fingerprint | len | rows`` (one per side here), with a timer at each
    session's end - 1. No checkpoint of that layout is at hand, so the entries are
    written through the backend's raw API, the formats through :class:`RowFormats`."""
    import rocksdict

    backend, timers = op.backend, op.disk_timers
    assert isinstance(backend, DiskKeyedStateBackend)
    sid = backend.raw_state_id(disk_session_join.STATE_NAME, disk_session_join.KIND)
    formats, writes = RowFormats(backend), rocksdict.WriteBatch(raw_mode=True)
    windows = rows_in_windows(frame, JOIN_SESSION)
    for k, rows in windows.groupby("k"):
        group = rs.key_group_of(k, MAXP)
        kid = timers.key_ids([k], np.array([group]))
        sessions = np.unique(rows[["window_start", "window_end"]].to_numpy(np.int64), axis=0)
        timers.register_event_time_timers(np.repeat(kid, len(sessions)), sessions[:, 0],
                                          sessions[:, 1] - 1)
        value = struct.pack("<I", len(sessions)) + sessions.tobytes()
        for side in (0, 1):
            part = rows.loc[rows["side"] == side, ["id", "k", "ts"]]
            if not len(part):
                continue
            batch = pa.RecordBatch.from_pandas(part, preserve_index=False)
            batch = batch.append_column("__ts", batch.column("ts"))
            fp, fmt = formats.of(batch, np.array([group - backend.key_groups.start]), writes)
            (payload,) = fmt.payloads(batch, [0], [batch.num_rows])
            value += struct.pack("<B8sI", side, fp, len(payload)) + payload
        writes.put(backend.entry_keys(sid, [k], [group])[0], value)
    backend.raw_db.write(writes)


def test_an_older_checkpoint_of_single_entry_keys_restores_as_chunks(monkeypatch):
    """A checkpoint of one entry per key (the layout before chunks, written by
    :func:`write_older_entries`) restored into 2 subtasks: the keys become headers and
    chunks, nothing stays in the older state, and with the rest of the rows every pair
    comes once, as pandas says; a checkpoint written since restores as it is, without
    a search for older entries."""
    frame = join_input(np.random.default_rng(11), 1200, keys=6, disorder=0)
    first, rest = frame.iloc[:600], frame.iloc[600:]
    floor = int(first["ts"].min()) - 1  # no session had fired yet
    old = window_join_operator(StateBackend.DISK, JOIN_SESSION)
    with monkeypatch.context() as patch:  # a backend without the chunks' state
        patch.setattr(WindowJoinOperator, "_disk_rows", lambda self: None)
        old.initialize_state(None)
        write_older_entries(old, first)
        taken = old.snapshot_state(1).keyed_state
        assert taken is not None
        sections = taken()
    ops = [restored(StateBackend.DISK, WindowJoinKind.JOIN, sections, i, 2, floor)
           for i in range(2)]
    n_heads = n_chunks = 0
    for op in ops:
        backend = op.backend
        assert isinstance(backend, DiskKeyedStateBackend)
        old_sid = backend.raw_state_id(disk_session_join.STATE_NAME, disk_session_join.KIND)
        assert not any(k[2:4] == old_sid for k, _ in own_entries(op))
        heads, chunks = stored(op)
        assert disk_rows(op).stored_entries() == len(heads) > 0
        counts = {h: struct.unpack_from("<Q", v)[0] for h, v in heads.items()}
        assert sorted(chunks) == sorted(h + struct.pack(">Q", seq) for h, n in counts.items()
                                        for seq in range(n))  # the chunks each header counts
        n_heads, n_chunks = n_heads + len(heads), n_chunks + len(chunks)
    # a header per key, a chunk per side a key had rows of
    assert (n_heads, n_chunks) == (first["k"].nunique(),
                                   int(first.groupby("k")["side"].nunique().sum()))
    later = ops[0].snapshot_state(2).keyed_state
    assert later is not None
    entries = dict(own_entries(ops[0]))
    again = restore_moving_nothing(
        monkeypatch, DiskSessionRows,
        lambda: restored(StateBackend.DISK, WindowJoinKind.JOIN, later(), 0, 2, floor))
    assert dict(own_entries(again)) == entries
    for op in (again, ops[1]):
        feed(op, rest)
        op.process_watermark(rs.MAX_WATERMARK)
        assert disk_rows(op).stored_entries() == 0
    left, right = (frame.loc[frame["side"] == side] for side in (0, 1))
    expected = sorted(oracle_pairs(left, right, JOIN_SESSION))
    assert sorted(results([again, ops[1]], WindowJoinKind.JOIN)) == expected and expected


# -- jobs on Ray ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_session_join_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                              incremental):
    n = 10_000
    env = disk_env(str(tmp_path / "chk"), 2, incremental=incremental)
    left, right = sides(env, n)
    sink = left.join(right).where("k").equal_to("k").window(JOIN_SESSION, timestamp="ts") \
        .join(name="join").collect()
    job = run_through_a_kill(env, f"disk-session-join-kill-{incremental}", "join")
    got = window_pairs_of(job.table(sink))
    assert len(got) == len(set(got))  # no pair twice, though one subtask died midway
    expected = expected_window_pairs(n, JOIN_SESSION)
    assert set(got) == expected and len(expected) > 1000


@pytest.mark.slow
def test_disk_session_co_group_through_savepoints_at_1_2_3(ray_session, tmp_path):
    """Stopped with a savepoint at parallelism 1 with sessions on disk, restored at 2,
    stopped again, restored at 3: each (key, session)'s co-group once over the three
    runs, as pandas says."""
    n = 10_000

    def count(key, lrows, rrows, window):
        return [{"k": key, "left": lrows.num_rows, "right": rrows.num_rows}]

    def job(parallelism: int):
        env = disk_env(str(tmp_path / f"chk{parallelism}"), parallelism)
        left, right = sides(env, n, pace=crawl if parallelism < 3 else None)
        return env, left.co_group(right).where("k").equal_to("k").window(
            JOIN_SESSION, timestamp="ts").apply(count, name="co_group").collect()

    tables = [result.table(sink)
              for result, sink in savepoint_chain(tmp_path, "disk-session-co-group", job)]
    got = sorted((r["k"], r["window_start"], r["window_end"], r["left"], r["right"])
                 for r in pa.concat_tables([t for t in tables if t.num_rows]).to_pylist())
    frame = pd.DataFrame(join_events(np.arange(n)))
    i = frame["id"].to_numpy()
    on_time = frame[~((i % 400 == 399) & (i > STRAGGLER_START))]
    groups = oracle_groups(on_time.loc[on_time["side"] == 0],
                           on_time.loc[on_time["side"] == 1], JOIN_SESSION)
    assert got == sorted((k, s, e, len(lids), len(rids)) for k, s, e, lids, rids in groups)


@pytest.mark.slow
def test_heap_savepoint_of_sessions_restores_into_a_disk_job(ray_session, tmp_path):
    """A heap job (session windows of a user AggregateFunction and a session co-group)
    stopped with a savepoint at parallelism 2, restored as a disk job at 3: their state
    moves into RocksDB, and each session's result comes once over both runs."""
    n = 10_000

    def count(key, lrows, rrows, window):
        return [{"k": key, "left": lrows.num_rows, "right": rrows.num_rows}]

    def job(parallelism: int):
        disk = parallelism == 3
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.2, storage=str(tmp_path / f"chk{parallelism}"),
            state_backend=rs.DiskStateOptions() if disk else "heap"))
        pace = None if disk else crawl
        left, right = sides(env, n, pace=pace)
        groups = left.co_group(right).where("k").equal_to("k").window(
            JOIN_SESSION, timestamp="ts").apply(count, name="co_group").collect()
        src = env.from_sequence(n, session_events, batch_size=200,
                                watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=50))
        if pace is not None:
            src = src.map_batches(pace, name="pace")
        averages = src.key_by("user").window(rs.EventTimeSessionWindows(gap_ms=JOB_GAP),
                                             timestamp="ts").aggregate(
            Average(), name="sessions").collect()  # pyright: ignore[reportArgumentType]
        return env, (groups, averages)

    env, sinks = job(2)
    client = env.execute_async("heap-sessions-before")
    wait_for_checkpoint(client, after=1)
    savepoint = str(tmp_path / "savepoint")
    first = client.stop_with_savepoint(savepoint)
    env, sinks_after = job(3)
    second = env.execute("disk-sessions-after", restore_from=savepoint)
    assert all(second.table(b).num_rows for b in sinks_after)  # stopped midway
    tables = [pa.concat_tables([t for t in (first.table(a), second.table(b)) if t.num_rows])
              for a, b in zip(sinks, sinks_after)]
    got = sorted((r["k"], r["window_start"], r["window_end"], r["left"], r["right"])
                 for r in tables[0].to_pylist())
    frame = pd.DataFrame(join_events(np.arange(n)))
    i = frame["id"].to_numpy()
    on_time = frame[~((i % 400 == 399) & (i > STRAGGLER_START))]
    groups = oracle_groups(on_time.loc[on_time["side"] == 0],
                           on_time.loc[on_time["side"] == 1], JOIN_SESSION)
    assert got == sorted((k, s, e, len(lids), len(rids)) for k, s, e, lids, rids in groups)
    averages = (tables[1].to_pandas().rename(columns={"user": "k"})
                .sort_values(["k", "window_start"]).reset_index(drop=True))
    want = user_sessions_oracle(
        pd.DataFrame(session_events(np.arange(n))).rename(columns={"user": "k"}), "aggregate",
        JOB_GAP)
    assert averages["k"].tolist() == want["k"].tolist()
    assert averages["window_start"].tolist() == want["window_start"].tolist()
    assert averages["rows"].tolist() == want["rows"].tolist()
    np.testing.assert_allclose(averages["avg"], want["value"])
