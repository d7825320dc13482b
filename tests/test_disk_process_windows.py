"""ProcessWindowFunction windows on the disk state backend: appended chunks, against pandas.

A ``ProcessWindowFunction``'s (key, window) rows are appended to RocksDB as one chunk
per batch (:class:`raystream.engine.windows.disk_entries.DiskChunks`). The function
here returns the ids of a window's rows in the order it sees them, so the tests check
the rows and their order: a disk operator against a heap one and a pandas oracle
(disorder, rows beyond the bound, allowed lateness with re-firing, the late side
output); a window fed by N batches holds N chunks none of which a later batch
rewrote; snapshots restored through parallelisms 1, 2 and 3, a heap snapshot into
disk subtasks and an older checkpoint (one entry per window) restored as chunks; a
Ray job through a subtask kill with full and incremental checkpoints.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.windows import disk_entries
from raystream.engine.windows import operator as window_operator_module
from raystream.engine.windows.disk_entries import DiskChunks, DiskEntries
from raystream.engine.windows.functions import ProcessWindow
from raystream.engine.windows.generic import DiskGenericWindows
from raystream.engine.windows.operator import WindowOperator
from raystream.timers.disk_service import DiskTimerService
from tests.support.disk import own_entries, restore_moving_nothing, stored_entries
from tests.support.functions import RowIds
from tests.support.inputs import make_input, user_events
from tests.support.jobs import disk_env, run_through_a_kill
from tests.support.operators import MAXP, drive
from tests.support.oracles import kept_in_windows
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

ASSIGNERS = [rs.TumblingEventTimeWindows(size_ms=50),
             rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20)]
WINDOW = ["k", "window_start", "window_end"]


def pwf_operator(backend: StateBackend, assigner, *, lateness: int = 0, index: int = 0,
                 parallelism: int = 1) -> WindowOperator:
    op = WindowOperator("w", KeySelector.of("k"), assigner, function=ProcessWindow(RowIds()),
                        timestamp="ts", allowed_lateness_ms=lateness, late_output="late")
    op.setup(RuntimeContext("job", "w", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def oracle(assigner, lateness: int, key, ts, arrival) -> tuple[pd.DataFrame, list[int]]:
    """pandas: each row (id = its position) in every window it belongs to unless that
    window was past its lateness when the row arrived, ids in arrival order; the ids of
    rows no window kept are the late ones."""
    rows = pd.DataFrame({"k": key, "ts": ts, "wm": arrival, "id": np.arange(len(ts))})
    kept = kept_in_windows(assigner, lateness, rows).sort_values(by="id", kind="stable")
    ids = kept.groupby(WINDOW).agg(ids=("id", lambda s: ",".join(map(str, s))))
    late = rows.loc[~rows["id"].isin(kept["id"]), "id"]
    return ids.reset_index().astype({c: np.int64 for c in WINDOW}), sorted(late.tolist())


def final(results: pd.DataFrame) -> pd.DataFrame:
    """The last firing of each window (a re-firing holds all its rows so far), sorted."""
    out = results.drop_duplicates(WINDOW, keep="last").loc[:, [*WINDOW, "ids"]]
    out = out.astype({c: np.int64 for c in WINDOW})
    return out.sort_values(by=WINDOW).reset_index(drop=True)


@pytest.mark.parametrize("assigner", ASSIGNERS, ids=repr)
@pytest.mark.parametrize("lateness", [0, 25])
def test_disk_process_windows_equal_heap_and_pandas_in_row_order(assigner, lateness):
    key, ts, _ = make_input(seed=7 + lateness, n=600, keys=20, disorder=100)
    ids = np.arange(len(ts), dtype=np.float64)
    heap, heap_arrival, heap_late = drive(pwf_operator(StateBackend.HEAP, assigner,
                                                       lateness=lateness), key, ts, ids)
    op = pwf_operator(StateBackend.DISK, assigner, lateness=lateness)
    disk, arrival, late = drive(op, key, ts, ids)
    assert isinstance(op.store, DiskGenericWindows) and isinstance(op.store.disk, DiskChunks)
    assert stored_entries(op) == 0  # every marker and chunk deleted past the lateness
    pd.testing.assert_frame_equal(disk, heap)  # re-firings too, rows in the same order
    assert arrival == heap_arrival
    pd.testing.assert_frame_equal(late, heap_late)

    expected, expected_late = oracle(assigner, lateness, key, ts, arrival)
    assert len(expected_late), "the input must hold rows beyond the bound to mean something"
    if lateness:
        assert len(disk) > len(expected)  # some windows fired again
    pd.testing.assert_frame_equal(final(disk), expected)
    assert sorted(late["x"].astype(int).tolist()) == expected_late


def test_a_window_fed_by_n_batches_holds_n_chunks_none_rewritten():
    """An hour's window of one key fed by 30 batches: each batch adds one chunk (and
    rewrites the 16-byte marker), never an earlier chunk; the firing sees every row in
    arrival order and leaves nothing behind."""
    op = pwf_operator(StateBackend.DISK, rs.TumblingEventTimeWindows(size_ms=3_600_000))
    op.initialize_state(None)
    op.open()
    before: dict[bytes, bytes] = {}
    for n in range(1, 31):
        ids = np.arange((n - 1) * 50, n * 50, dtype=np.float64)
        op.process_batch(pa.record_batch({"k": np.zeros(50, np.int64),
                                          "ts": 1000 + ids.astype(np.int64), "x": ids}))
        now = dict(own_entries(op))
        markers = [k for k, v in now.items() if len(v) == 16]
        assert len(markers) == 1 and len(now) == n + 1  # n chunks beside the marker
        changed = {k for k in before if now[k] != before[k]}
        assert changed == (set(markers) if before else set())  # earlier chunks' bytes untouched
        added = set(now) - set(before)
        assert len(added) == (2 if n == 1 else 1)
        assert all(k.startswith(markers[0]) and len(k) == len(markers[0]) + 8
                   for k in added - set(markers))
        before = now
    chunk_sizes = [len(v) for k, v in before.items() if len(v) != 16]
    assert max(chunk_sizes) - min(chunk_sizes) < 64  # a chunk is one batch's rows
    op.process_watermark(rs.MAX_WATERMARK)
    out = pa.Table.from_batches(op.output.batches).to_pylist()  # pyright: ignore
    assert [r["ids"] for r in out] == [",".join(map(str, range(1500)))]
    assert stored_entries(op) == 0


# -- snapshots --------------------------------------------------------------------------------

def run_stage(backend: StateBackend, assigner, sections, parallelism: int, watermark_before,
              key, ts, ids, watermark_after: int, *, take_snapshot: bool = True):
    """Restore ``sections`` (None: a fresh start) into ``parallelism`` subtasks, feed each
    its keys' rows as one batch, advance to ``watermark_after``: (their outputs, the
    sections of their snapshot)."""
    floors = (None if watermark_before is None else
              WatermarkFloors.from_json(watermark_before, max_parallelism=MAXP))
    out, snapshot = [], {}
    for index in range(parallelism):
        op = pwf_operator(backend, assigner, lateness=30, index=index, parallelism=parallelism)
        groups = rs.key_group_range(index, parallelism, MAXP)
        op.initialize_state(None if sections is None else RestoredState(
            1, [], [(g, s) for g, s in sections.items() if g in groups], floors))
        op.open()
        assert backend is StateBackend.HEAP or not getattr(op.store, "entries", None)
        mine = np.array([rs.key_group_of(k, MAXP) in groups for k in key.tolist()])
        op.process_batch(pa.record_batch({"k": key[mine], "ts": ts[mine], "x": ids[mine]}))
        op.process_watermark(watermark_after)
        out.extend(op.output.batches)  # pyright: ignore
        if take_snapshot:
            keyed = op.snapshot_state(1).keyed_state
            assert keyed is not None
            snapshot.update(keyed())
    return out, snapshot


def staged(assigner, key, ts, ids, stages: list[tuple[StateBackend, int]]) -> pd.DataFrame:
    """The rows in ``len(stages)`` parts, each part run by its stage's backend and
    parallelism from the previous stage's snapshot: all their outputs."""
    parts = np.array_split(np.arange(len(ts)), len(stages))
    sections, watermark, out = None, None, []
    for number, ((backend, parallelism), part) in enumerate(zip(stages, parts)):
        last = number == len(stages) - 1
        after = rs.MAX_WATERMARK if last else int(ts[part].max()) - 40
        batches, sections = run_stage(backend, assigner, sections, parallelism, watermark,
                                      key[part], ts[part], ids[part], after,
                                      take_snapshot=not last)
        out.extend(batches)
        watermark = after
    return pa.Table.from_batches(out).to_pandas()


def sorted_firings(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype({c: np.int64 for c in WINDOW}).sort_values(
        by=[*WINDOW, "ids"]).reset_index(drop=True)


@pytest.mark.parametrize("assigner", ASSIGNERS, ids=repr)
def test_disk_process_windows_restore_through_parallelisms_and_from_the_heap(assigner):
    """Snapshots restored at 1 -> 2 -> 3 subtasks (and a heap snapshot into disk ones)
    fire every window with the rows, in the order, of one heap run, and so do disk
    snapshots restored into heap subtasks (the chunks read back through a scratch
    database)."""
    key, ts, _ = make_input(seed=5, n=900, keys=40, disorder=60)
    ids = np.arange(len(ts), dtype=np.float64)
    disk, heap = StateBackend.DISK, StateBackend.HEAP
    expected = sorted_firings(staged(assigner, key, ts, ids, [(heap, 1)] * 3))
    assert expected["ids"].str.contains(",").any()
    for stages in ([(disk, 1), (disk, 2), (disk, 3)], [(heap, 1), (disk, 2), (disk, 3)],
                   [(disk, 1), (heap, 2), (heap, 3)], [(disk, 2), (heap, 1), (disk, 3)]):
        pd.testing.assert_frame_equal(sorted_firings(staged(assigner, key, ts, ids, stages)),
                                      expected)


def test_an_older_checkpoint_of_single_entry_windows_restores_as_chunks(monkeypatch):
    """A checkpoint whose ProcessWindowFunction windows are one entry each (the layout of
    ``DiskEntries``, as raystream wrote them before chunks) restores into 2 subtasks: the
    windows become chunks and fire with all their rows in order."""
    assigner = rs.TumblingEventTimeWindows(size_ms=50)
    key, ts, _ = make_input(seed=9, n=600, keys=30, disorder=40)
    ids = np.arange(len(ts), dtype=np.float64)
    expected = sorted_firings(staged(assigner, key, ts, ids, [(StateBackend.HEAP, 1)] * 2))

    class NotAProcessWindow:  # the operator opens the older layout for this function
        pass

    part = np.arange(300)
    with monkeypatch.context() as patch:
        patch.setattr(window_operator_module, "ProcessWindow", NotAProcessWindow)
        old = pwf_operator(StateBackend.DISK, assigner, lateness=30)
        old.initialize_state(None)
        old.open()
        assert isinstance(old.store, DiskGenericWindows) and type(old.store.disk) is DiskEntries
        old.process_batch(pa.record_batch({"k": key[part], "ts": ts[part], "x": ids[part]}))
        watermark = int(ts[part].max()) - 40
        old.process_watermark(watermark)
        keyed = old.snapshot_state(1).keyed_state
        assert keyed is not None and stored_entries(old) > 0
        sections = keyed()
    rest = np.arange(300, len(ts))
    out, _ = run_stage(StateBackend.DISK, assigner, sections, 2, watermark, key[rest],
                       ts[rest], ids[rest], rs.MAX_WATERMARK, take_snapshot=False)
    got = pa.Table.from_batches([*old.output.batches, *out]).to_pandas()  # pyright: ignore
    pd.testing.assert_frame_equal(sorted_firings(got), expected)

    # after the move the older state holds nothing: restored windows are markers + chunks
    op = pwf_operator(StateBackend.DISK, assigner, lateness=30)
    op.initialize_state(RestoredState(1, [], list(sections.items()),
                                      WatermarkFloors.from_json(watermark, max_parallelism=MAXP)))
    backend = op.backend
    assert isinstance(backend, DiskKeyedStateBackend)
    old_sid = backend.raw_state_id(disk_entries.STATE_NAME, disk_entries.KIND)
    entries = dict(own_entries(op))
    assert entries and not any(k[2:4] == old_sid for k in entries)

    # a checkpoint written since names the chunks' state: its restores move nothing
    keyed = op.snapshot_state(2).keyed_state
    assert keyed is not None
    def restore() -> WindowOperator:
        op = pwf_operator(StateBackend.DISK, assigner, lateness=30)
        op.initialize_state(RestoredState(2, [], list(keyed().items()), WatermarkFloors
                                          .from_json(watermark, max_parallelism=MAXP)))
        return op
    again = restore_moving_nothing(monkeypatch, DiskChunks, restore)
    assert isinstance(again, WindowOperator) and isinstance(again.store, DiskGenericWindows)
    assert isinstance(again.store.disk, DiskChunks)
    assert dict(own_entries(again)) == entries


def test_a_delete_after_appends_removes_the_chunks_appended_since_the_read(disk_backend):
    """``delete`` counts a window's chunks from the markers ``get`` just read, unless
    rows were appended since: then it reads them again and leaves nothing behind."""
    timers = DiskTimerService(disk_backend)
    chunks = DiskChunks(disk_backend, timers)
    keys = chunks.entry_keys(timers.key_ids(["a", "b"], np.array([1, 2])), np.array([10, 10]))
    sid = disk_backend.raw_state_id(disk_entries.CHUNKS_NAME, disk_entries.CHUNKS_KIND)

    def stored() -> int:  # markers and chunks
        return sum(1 for k in disk_backend.raw_db.keys() if k[2:4] == sid)

    rows = [tuple(pa.table({"x": [i]}).to_batches()) for i in range(2)]
    chunks.append(keys, np.array([0, 0]), rows)
    assert chunks.get(keys) == [(0, rows[0]), (0, rows[1])]
    chunks.append(keys, np.array([0, 0]), rows)
    assert chunks.chunks_of(keys) == [2, 2] and stored() == 6
    chunks.delete(keys)
    assert chunks.chunks_of(keys) == [0, 0] and stored() == 0


# -- a job on Ray -----------------------------------------------------------------------------

class Summary(rs.ProcessWindowFunction):
    def process(self, key, window, rows):
        xs = rows["x"].to_numpy()
        yield {"user": key, "window_start": window.start, "rows": len(xs),
               "total": float(xs.sum()), "spread": float(xs.max() - xs.min())}


@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_process_windows_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                                   incremental):
    n, size = 30_000, 1000
    env = disk_env(str(tmp_path / "chk"), incremental=incremental)
    src = env.from_sequence(n, user_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts").process(Summary()).collect()
    job = run_through_a_kill(env, "disk-process-windows-kill", "window")
    got = (job.table(sink).to_pandas()[["user", "window_start", "rows", "total", "spread"]]
           .sort_values(["user", "window_start"]).reset_index(drop=True))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    e = pd.DataFrame(user_events(np.arange(n)))
    e["window_start"] = e["ts"] // size * size
    expected = (e.groupby(["user", "window_start"])["x"]
                .agg(rows="size", total="sum", spread=lambda s: s.max() - s.min())
                .reset_index().sort_values(["user", "window_start"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
