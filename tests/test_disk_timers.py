"""Timers in RocksDB on the disk state backend (:mod:`raystream.timers.disk_service`).

The service against an independent model of timer sets (register, delete, fire by
watermark and clock, with its key table emptied in between); a keyed process function
registering event-time and processing-time timers, with disorder and rows beyond the
watermark bound, on the disk and heap backends against a pandas oracle; snapshots
restored at parallelisms 1, 2 and 3 and across backends (a savepoint's sections);
real Ray jobs through a subtask SIGKILL with full and incremental checkpoints, and
through savepoints that switch backends and parallelism: p=1 -> 2 -> 3.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.keygroups import key_group_of
from raystream.checkpoint.sections import decode_parts
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.operators.keyed import KeyedProcessOperator
from raystream.timers.disk_service import DiskTimerService
from tests.support.inputs import make_input
from tests.support.jobs import wait_for_checkpoint
from tests.support.pacing import Throttle

MAXP = 128
GAP = 40  # event-time timers at ts + GAP
PT_BASE = 10 ** 13  # processing-time timers far in the future: only the test's clock fires them
PT_STEP = 3  # the test's clock advances this much per batch


# -- the service against a model --------------------------------------------------------------

def fired_rows(timers: DiskTimerService, popped) -> list[tuple[int, object, int]]:
    ts, kids, ns = popped
    assert (np.diff(ts) >= 0).all(), "timers fire in timestamp order"
    return sorted(zip(ts.tolist(), timers.keys(kids), ns.tolist()), key=repr)


def pop_model(model: set, bound: int) -> list[tuple[int, object, int]]:
    due = {t for t in model if t[0] <= bound}
    model -= due
    return sorted(due, key=repr)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_service_equals_a_model_of_timer_sets(seed):
    rng = np.random.default_rng(seed)
    backend = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=range(20, 90))
    timers = DiskTimerService(backend, key_table_limit=40)
    universe = [k for k in [*range(300), *(f"k{i}" for i in range(300))]
                if 20 <= key_group_of(k, MAXP) < 90]
    event: set = set()
    processing: set = set()
    watermark = clock = -50
    for step in range(60):
        keys = [universe[i] for i in rng.integers(0, len(universe), 30)]
        groups = np.array([key_group_of(k, MAXP) for k in keys])
        ts = rng.integers(-100, 400, 30)
        ns = rng.integers(-2, 3, 30)
        kids = timers.key_ids(keys, groups)
        timers.register_event_time_timers(kids, ns, ts)
        event |= set(zip(ts.tolist(), keys, ns.tolist()))
        timers.register_processing_time_timers(kids[:10], ns[:10], ts[:10] + 7)
        processing |= set(zip((ts[:10] + 7).tolist(), keys[:10], ns[:10].tolist()))
        timers.register_event_time_timer(int(kids[0]), 5, 1000 + step)  # one at a time
        event.add((1000 + step, keys[0], 5))
        for k, kid in list(zip(keys, kids.tolist()))[::4]:  # delete some, present or not
            t = (int(rng.integers(-100, 400)), k, int(rng.integers(-2, 3)))
            if step % 2:
                old = next((e for e in event if e[1] == k), t)
                t = old
            timers.delete_event_time_timer(kid, t[2], t[0])
            event.discard(t)
        if step % 3 == 0:
            watermark += int(rng.integers(0, 40))
            assert fired_rows(timers, timers.advance_watermark(watermark)) == pop_model(
                event, watermark)
        if step % 4 == 0:
            clock += int(rng.integers(0, 50))
            assert fired_rows(timers, timers.fire_processing_time(clock)) == pop_model(
                processing, clock)
        assert timers.next_event_time() == min((t[0] for t in event), default=None)
        assert timers.next_processing_time() == min((t[0] for t in processing), default=None)
        timers.release_keys()  # a safe point: the table is emptied past its limit
        assert timers.num_keys <= 40 + 31
    assert timers.num_event_time_timers == len(event)
    assert timers.num_processing_time_timers == len(processing)
    # the earliest timer per key group is rebuilt from the database alone
    again = DiskTimerService(backend)
    assert again.next_event_time() == min((t[0] for t in event), default=None)
    assert fired_rows(again, again.advance_watermark(rs.MAX_WATERMARK)) == pop_model(
        event, rs.MAX_WATERMARK)
    assert again.next_event_time() is None and again.num_event_time_timers == 0
    backend.close()


# -- a keyed process function with timers, operator level --------------------------------

class Deadlines(rs.KeyedProcessFunction):
    """Counts rows per key; an event-time timer at ts + GAP and a processing-time timer
    per row; a firing emits the key, the timer and its domain."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        ctx.register_event_time_timer(row["ts"] + GAP)
        ctx.register_processing_time_timer(row["pt"])
        return None

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "t": timestamp, "domain": ctx.time_domain,
               "count": self.count.value()}


def process_operator(backend: StateBackend, *, index: int = 0, parallelism: int = 1
                     ) -> KeyedProcessOperator:
    op = KeyedProcessOperator("p", Deadlines(), KeySelector.of("k"))
    op.setup(RuntimeContext("job", "p", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def timer_input(seed: int, n: int = 600, keys: int = 40):
    """Keys, event times with disorder (some beyond the watermark bound) and each row's
    processing-time timer."""
    key, ts, _ = make_input(seed=seed, n=n, keys=keys, disorder=60)
    pt = PT_BASE + np.arange(n) // 25 * PT_STEP + ts % 11
    return key, ts, pt


def drive(ops: list[KeyedProcessOperator], key, ts, pt, *, start: int = 0, batch: int = 25,
          lag: int = 20, watermark: int = rs.MIN_WATERMARK, seen: int = -(2 ** 62)):
    """Feed rows ``start:`` in batches to the operator owning each row's key group (all of
    them get the watermark ``max(ts seen) - lag - 1`` after every batch and the clock
    ``PT_BASE + step * PT_STEP``): the output rows with the step that produced them."""
    out = []
    steps = range(start // batch, (len(ts) + batch - 1) // batch)
    for step in steps:
        sl = slice(step * batch, (step + 1) * batch)
        seen = max(seen, int(ts[sl].max()))
        watermark = max(watermark, seen - lag - 1)
        for op in ops:
            mine = np.array([key_group_of(k, MAXP) in op.timers.key_groups
                             for k in key[sl].tolist()])
            op.process_batch(pa.record_batch({"k": key[sl][mine], "ts": ts[sl][mine],
                                              "pt": pt[sl][mine]}))
            op.process_watermark(watermark)
            op.on_processing_time(PT_BASE + step * PT_STEP)
            out.extend(collected(op, step))
    return out


def collected(op: KeyedProcessOperator, step: int) -> list[dict]:
    output = op.output
    assert isinstance(output, CollectingOutput)
    rows = [dict(r, step=step) for b in output.batches for r in b.to_pylist()]
    output.batches.clear()
    return rows


def watermarks_of(ts, *, batch: int = 25, lag: int = 20) -> np.ndarray:
    """The watermark after each step of :func:`drive`."""
    seen = pd.Series(ts).groupby(np.arange(len(ts)) // batch).max().cummax().to_numpy()
    return np.maximum.accumulate(seen - lag - 1)


def oracle(key, ts, pt, *, batch: int = 25, lag: int = 20) -> pd.DataFrame:
    """pandas: a timer registered in step i fires in the first step j >= i whose watermark
    (clock) reaches it, once per (key, timer, step): a row beyond the bound registers a
    timer due already, which fires in its own step."""
    steps = (len(ts) + batch - 1) // batch
    step = np.arange(len(ts)) // batch
    watermarks = watermarks_of(ts, batch=batch, lag=lag)
    clocks = PT_BASE + np.arange(steps) * PT_STEP
    frames = []
    for domain, t, bounds in (("event_time", ts + GAP, watermarks),
                              ("processing_time", pt, clocks)):
        fire = np.maximum(step, np.searchsorted(bounds, t, side="left"))
        frames.append(pd.DataFrame({"k": key, "t": t, "domain": domain, "step": fire}))
    timers = pd.concat(frames).drop_duplicates()
    return timers[timers["step"] < steps]


def normalized(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["k", "t", "domain", "step"])
    return frame.sort_values(["step", "domain", "k", "t"]).reset_index(drop=True).astype(
        {"k": np.int64, "t": np.int64, "step": np.int64})


@pytest.mark.parametrize("seed", [5, 6])
def test_process_function_timers_on_disk_equal_heap_and_pandas(seed):
    key, ts, pt = timer_input(seed)
    runs = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = process_operator(backend)
        op.initialize_state(None)
        op.open()
        runs[backend] = drive([op], key, ts, pt)
        if backend is StateBackend.DISK:
            assert isinstance(op.timers, DiskTimerService)
        assert op.timers.next_event_time() is not None  # timers past the last watermark
    # the same firings in the same order (timestamp, then key id) on both backends
    assert runs[StateBackend.DISK] == runs[StateBackend.HEAP]
    expected = oracle(key, ts, pt)
    arrival = np.concatenate(([rs.MIN_WATERMARK], watermarks_of(ts)))[np.arange(len(ts)) // 25]
    assert (ts + GAP <= arrival).any(), "some rows must come beyond the watermark bound"
    got = normalized([{k: r[k] for k in ("k", "t", "domain", "step")}
                      for r in runs[StateBackend.DISK]])
    pd.testing.assert_frame_equal(got, normalized(expected))


def test_key_table_of_a_disk_process_function_stays_bounded():
    """Keys keep coming; the key table is emptied at the operator's safe points once past
    its limit, and firing still finds every key."""
    op = process_operator(StateBackend.DISK)
    op.initialize_state(None)
    op.open()
    timers = op.disk_timers
    timers.key_table_limit = 100  # a small table for the test
    n = 3000
    key = np.arange(n) % 1500  # 1500 keys: 15 times the table
    ts = np.arange(n) * 2
    pt = np.full(n, PT_BASE * 2)
    sizes = []
    for i in range(0, n, 50):
        op.process_batch(pa.record_batch({"k": key[i:i + 50], "ts": ts[i:i + 50],
                                          "pt": pt[i:i + 50]}))
        sizes.append(timers.num_keys)
    assert max(sizes) <= 100 and min(sizes) < 50  # emptied, more than once
    op.process_watermark(rs.MAX_WATERMARK)
    rows = collected(op, 0)
    got = sorted((r["k"], r["t"], r["count"]) for r in rows)
    expected = pd.DataFrame({"k": key, "t": ts + GAP})
    counts = expected.groupby("k").size()
    assert got == sorted((int(k), int(t), int(counts[k]))
                         for k, t in zip(expected["k"], expected["t"]))
    assert timers.num_keys <= 100


@pytest.mark.parametrize("layout", ["dense", "sessions", "generic"])
def test_window_timers_of_a_disk_job_are_in_rocksdb(layout):
    """Windows on disk register their timers in RocksDB (dense windows one per key group
    and window, sessions and user functions one per key and window) as many as on the
    heap, and fire them all: the results equal the heap backend's, no timer is left."""
    from tests.support.operators import user_operator, window_operator

    assigner = (rs.EventTimeSessionWindows(gap_ms=15) if layout == "sessions"
                else rs.TumblingEventTimeWindows(size_ms=50))
    key, ts, x = make_input(seed=4, n=400, keys=30, disorder=40)
    results, pending = {}, {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = (user_operator(backend, assigner, "aggregate") if layout == "generic"
              else window_operator(backend, assigner))
        op.initialize_state(None)
        op.open()
        op.process_batch(pa.record_batch({"k": key[:200], "ts": ts[:200], "x": x[:200]}))
        op.process_watermark(int(ts[:200].max()) - 100)
        pending[backend] = (op.timers.num_event_time_timers, op.timers.next_event_time())
        op.process_batch(pa.record_batch({"k": key[200:], "ts": ts[200:], "x": x[200:]}))
        op.process_watermark(rs.MAX_WATERMARK)
        assert op.timers.num_event_time_timers == 0
        if backend is StateBackend.DISK:
            assert isinstance(op.timers, DiskTimerService)
        output = op.output
        assert isinstance(output, CollectingOutput)
        results[backend] = pa.Table.from_batches(output.batches).to_pandas()
    assert pending[StateBackend.DISK] == pending[StateBackend.HEAP]
    assert pending[StateBackend.DISK][0] > 0
    # (dense windows on disk emit a window's keys by key group, not in key-id order)
    disk, heap = (results[b].sort_values(list(results[b].columns)).reset_index(drop=True)
                  for b in (StateBackend.DISK, StateBackend.HEAP))
    pd.testing.assert_frame_equal(disk, heap)


def feed_windows(op, key, ts, x, *, watermark: int = rs.MIN_WATERMARK) -> int:
    """Batches of 25 rows, each followed by the watermark max(ts seen) - 30."""
    for i in range(0, len(ts), 25):
        op.process_batch(pa.record_batch({"k": key[i:i + 25], "ts": ts[i:i + 25],
                                          "x": x[i:i + 25]}))
        watermark = max(watermark, int(ts[:i + 25].max()) - 30)
        op.process_watermark(watermark)
    return watermark


@pytest.mark.parametrize("layout", ["dense", "sessions", "generic"])
def test_disk_windows_with_a_small_key_table_through_a_restore_equal_the_heap(layout):
    """The key table of a window on disk emptied every few batches (panes then tell their
    entries by the table's generation), and a restore after which half of the keys never
    come again (their timers bring their keys back): the heap backend's results."""
    from tests.support.operators import user_operator, window_operator

    assigner = (rs.EventTimeSessionWindows(gap_ms=15) if layout == "sessions"
                else rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20))
    key, ts, x = make_input(seed=8, n=800, keys=120, disorder=20)
    half = 400
    rest = slice(half, None)
    again = key[rest] % 2 == 0  # after the restore, only the even keys come again

    def operator(backend: StateBackend):
        return (user_operator(backend, assigner, "aggregate") if layout == "generic"
                else window_operator(backend, assigner))

    results = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        first = operator(backend)
        first.initialize_state(None)
        first.open()
        if backend is StateBackend.DISK:
            first.disk_timers.key_table_limit = 20
        watermark = feed_windows(first, key[:half], ts[:half], x[:half])
        snapshot = first.snapshot_state(1).keyed_state
        assert snapshot is not None
        restored = RestoredState(1, [], list(snapshot().items()), None)
        second = operator(backend)
        second.initialize_state(restored)
        second.open()
        if backend is StateBackend.DISK:
            timers = second.disk_timers
            timers.key_table_limit = 20
            generation = timers.generation
        feed_windows(second, key[rest][again], ts[rest][again], x[rest][again],
                     watermark=watermark)
        second.process_watermark(rs.MAX_WATERMARK)
        if backend is StateBackend.DISK:
            assert second.disk_timers.generation > generation + 2  # emptied again and again
        frames = [pa.Table.from_batches(op.output.batches).to_pandas()  # pyright: ignore
                  for op in (first, second) if op.output.batches]  # pyright: ignore
        frame = pd.concat(frames)
        results[backend] = frame.sort_values(list(frame.columns)).reset_index(drop=True)
    assert len(results[StateBackend.DISK])
    pd.testing.assert_frame_equal(results[StateBackend.DISK], results[StateBackend.HEAP])


# -- snapshots, rescaling, switching backends -----------------------------------------------

def snapshot_midway(backend: StateBackend, key, ts, pt, half: int):
    """Run the first ``half`` rows, snapshot (the synchronous part), go on before the
    asynchronous part runs: (sections, the rows fired after the snapshot, the watermark
    and the max timestamp seen at the snapshot)."""
    op = process_operator(backend)
    op.initialize_state(None)
    op.open()
    drive([op], key[:half], ts[:half], pt[:half])
    snapshot = op.snapshot_state(1).keyed_state
    assert snapshot is not None
    watermark = op.current_watermark
    after = drive([op], key, ts, pt, start=half, watermark=watermark,
                  seen=int(ts[:half].max()))
    sections = snapshot()
    return sections, after, watermark


@pytest.mark.parametrize("source,target", [("disk", "disk"), ("disk", "heap"),
                                           ("heap", "disk")])
def test_snapshot_restores_timers_at_parallelism_1_2_3_and_across_backends(source, target):
    """A disk snapshot carries its timers in the backend's sections; a savepoint (full)
    restores into the other backend with them. Restored at 1, 2 and 3 subtasks, the rest
    of the input fires exactly what the uninterrupted run fired after the snapshot."""
    key, ts, pt = timer_input(seed=9, n=500, keys=60)
    half = 250
    sections, after, watermark = snapshot_midway(StateBackend(source), key, ts, pt, half)
    parts = {name for section in sections.values() for name in decode_parts(section)}
    assert parts == ({"state"} if source == "disk" else {"state", "timers"})
    for parallelism in (1, 2, 3):
        ops = []
        floors = WatermarkFloors.from_json(watermark, max_parallelism=MAXP)
        for index in range(parallelism):
            op = process_operator(StateBackend(target), index=index, parallelism=parallelism)
            groups = rs.key_group_range(index, parallelism, MAXP)
            op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                       if g in groups], floors))
            op.open()
            ops.append(op)
        got = drive(ops, key, ts, pt, start=half, watermark=watermark,
                    seen=int(ts[:half].max()))
        key_of = ["k", "t", "domain", "step", "count"]
        assert sorted(tuple(r[c] for c in key_of) for r in got) == sorted(
            tuple(r[c] for c in key_of) for r in after), (parallelism, source, target)


# -- real jobs -------------------------------------------------------------------------------

BASE = 1_700_000_000_000
SECOND = 1000


def job_events(i: np.ndarray) -> dict:
    jitter = (i * 7919) % 300  # out of order by up to 300 ms
    return {"user": i % 53, "ts": BASE + i * 4 - jitter, "x": (i % 13).astype(np.int64)}


class PerSecond(rs.KeyedProcessFunction):
    """Sums per user and second in map state, emitted by an event-time timer at the
    second's end (a tumbling window written by hand)."""

    def open(self, ctx):
        self.sums = ctx.map_state("sums")

    def process_element(self, row, ctx):
        second = row["ts"] // SECOND * SECOND
        total = self.sums.get(second, (0, 0))
        self.sums.put(second, (total[0] + 1, total[1] + row["x"]))
        ctx.register_event_time_timer(second + SECOND - 1)
        return None

    def on_timer(self, timestamp, ctx):
        second = timestamp + 1 - SECOND
        n, total = self.sums.get(second)
        self.sums.remove(second)
        yield {"user": ctx.current_key, "second": second, "n": n, "total": total}


throttle = Throttle(0.03)  # keeps the job running long enough to kill or stop it midway


def per_second_job(env: rs.StreamEnvironment, n: int, *, slow: bool = True):
    src = env.from_sequence(n, job_events, batch_size=200,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=400))
    if slow:
        src = src.map_batches(throttle, name="throttle")
    return src.key_by("user").process(PerSecond(), name="timers").collect()


def per_second_oracle(n: int) -> pd.DataFrame:
    e = pd.DataFrame(job_events(np.arange(n)))
    e["second"] = e["ts"] // SECOND * SECOND
    return (e.groupby(["user", "second"]).agg(n=("x", "size"), total=("x", "sum"))
            .reset_index().sort_values(["user", "second"]).reset_index(drop=True))


def rows_of(table: pa.Table) -> pd.DataFrame:
    return (table.to_pandas()[["user", "second", "n", "total"]]
            .sort_values(["user", "second"]).reset_index(drop=True))


def env_of(storage: str, parallelism: int, backend, *, incremental: bool = False
           ) -> rs.StreamEnvironment:
    state_backend = rs.DiskStateOptions(incremental=incremental) if backend == "disk" else backend
    return rs.StreamEnvironment(
        parallelism=parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=storage, retained=2,
                                        state_backend=state_backend),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))


@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_timers_exactly_once_through_a_subtask_sigkill(ray_session, tmp_path,
                                                             incremental):
    n = 30_000
    env = env_of(str(tmp_path / "chk"), 2, "disk", incremental=incremental)
    sink = per_second_job(env, n)
    client = env.execute_async("disk-timers-kill")
    completed = wait_for_checkpoint(client)
    completed = wait_for_checkpoint(client, after=completed)  # incremental: an increment
    pid = ray.get(client.subtask_actor("timers", 1).metrics.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    job = client.wait(timeout_s=240)
    assert job.restarts == 1, job.failures
    assert job.restores[0]["checkpoint_id"] >= completed
    got = rows_of(job.table(sink))
    assert not got.duplicated(["user", "second"]).any()  # no timer fired twice
    pd.testing.assert_frame_equal(got, per_second_oracle(n), check_dtype=False)


@pytest.mark.slow
@pytest.mark.parametrize("backends", [("heap", "disk", "heap"), ("disk", "heap", "disk")],
                         ids="-".join)
def test_timers_follow_savepoints_across_backends_at_1_2_3(ray_session, tmp_path, backends):
    """Stopped with a savepoint while timers are pending at p=1, restored at p=2 on the
    other backend, stopped again, restored at p=3 on the first: every (user, second)
    fires exactly once over the three runs."""
    n = 24_000
    tables, savepoint = [], None
    for parallelism, backend in zip((1, 2, 3), backends):
        env = env_of(str(tmp_path / f"chk{parallelism}"), parallelism, backend)
        sink = per_second_job(env, n, slow=parallelism < 3)
        if parallelism < 3:
            client = env.execute_async(f"timers-{backend}-{parallelism}", restore_from=savepoint)
            wait_for_checkpoint(client)
            savepoint = str(tmp_path / f"savepoint{parallelism}")
            result = client.stop_with_savepoint(savepoint)
            assert result.table(sink).num_rows > 0
        else:
            result = env.execute(f"timers-{backend}-{parallelism}", restore_from=savepoint)
        tables.append(result.table(sink))
    got = rows_of(pa.concat_tables(tables))
    assert not got.duplicated(["user", "second"]).any()
    pd.testing.assert_frame_equal(got, per_second_oracle(n), check_dtype=False)
