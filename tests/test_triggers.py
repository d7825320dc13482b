"""Triggers and global windows on both state backends.

Flink's own test cases (WindowOperatorTest, ContinuousProcessingTimeTriggerTest and the
trigger tests), translated: the same inputs, watermarks and clock steps, the same
outputs (compared as multisets between steps, as Flink's harness does). Then count
triggers against a pandas oracle over random, disordered input with late rows, and
through snapshots restored at other parallelisms.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.assigners import GLOBAL_END, GLOBAL_START
from raystream.engine.windows.functions import BuiltinAggregates, ProcessWindow
from raystream.engine.windows.operator import WindowOperator
from raystream.engine.windows.triggers import (Created, Due, Filled, Timers, TriggerResult,
                                               fires)
from raystream.timers.protocol import TimeDomain
from tests.support.inputs import N, numbers
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.operators import MAXP
from tests.support.pipelines import throttle

BACKENDS = [StateBackend.HEAP, StateBackend.DISK]
SUM = {"v": ("sum", "v")}


class Harness:
    """One window operator subtask driven as Flink's operator test harness drives one:
    records one at a time (``key:value@ts``), watermarks, and a clock the test sets."""

    def __init__(self, backend: StateBackend, assigner, trigger, *, function=None,
                 lateness: int = 0, index: int = 0, parallelism: int = 1,
                 restored: RestoredState | None = None, timestamp: str | None = "ts") -> None:
        self.now = 0
        self.op = WindowOperator(
            "w", KeySelector.of("k"), assigner,
            function=function or BuiltinAggregates(AggregateSpec.of(SUM)),
            timestamp=timestamp, allowed_lateness_ms=lateness, late_output="late",
            trigger=trigger, clock=lambda: self.now)
        self.op.setup(RuntimeContext("job", "w", index, parallelism, MAXP, 0,
                                     state_backend=backend), CollectingOutput())
        self.op.initialize_state(restored)
        self.op.open()
        self._read = 0

    def element(self, key: str, value: int, ts: int) -> None:
        self.elements([(key, value, ts)])

    def elements(self, rows: list[tuple[str, int, int]]) -> None:
        k, v, ts = zip(*rows)
        self.op.process_batch(pa.record_batch({"k": list(k), "v": list(v), "ts": list(ts)}))

    def watermark(self, watermark: int) -> None:
        self.op.process_watermark(watermark)

    def processing_time(self, now: int) -> None:
        self.now = now
        self.op.on_processing_time(now)

    def output(self) -> Counter:
        """The rows emitted since the last call, as a multiset of (key, value, start,
        end)."""
        out = self.op.output
        assert isinstance(out, CollectingOutput)
        batches, self._read = out.batches[self._read:], len(out.batches)
        rows = pa.Table.from_batches(batches).to_pylist() if batches else []
        return Counter((r["k"], r.get("v", r.get("rows")), r["window_start"], r["window_end"])
                       for r in rows)

    def late(self) -> list[tuple[str, int, int]]:
        out = self.op.output
        assert isinstance(out, CollectingOutput)
        batches = out.side_batches.get("late", [])
        return [(r["k"], r["v"], r["ts"]) for r in pa.Table.from_batches(batches).to_pylist()
                ] if batches else []

    def snapshot(self) -> dict[int, bytes]:
        snapshot = self.op.snapshot_state(1)
        assert snapshot is not None and snapshot.keyed_state is not None
        return snapshot.keyed_state()


def restored(sections: dict[int, bytes], watermark: int = rs.MIN_WATERMARK, *,
             index: int = 0, parallelism: int = 1) -> RestoredState:
    groups = rs.key_group_range(index, parallelism, MAXP)
    floors = WatermarkFloors.from_json(watermark, max_parallelism=MAXP)
    return RestoredState(1, [], [(g, s) for g, s in sections.items() if g in groups], floors)


def bag(*rows) -> Counter:
    return Counter(rows)


G = (GLOBAL_START, GLOBAL_END)  # a global window's start and end columns


# -- Flink's WindowOperatorTest, translated -----------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_continuous_watermark_trigger(backend):
    """testContinuousWatermarkTrigger: global windows fired every 3 s of event time from
    each key's first record; a firing with no new records repeats the same result."""
    h = Harness(backend, rs.GlobalWindows(), rs.ContinuousEventTimeTrigger(interval_ms=3000))
    for key, ts in [("key1", 0), ("key2", 3000), ("key2", 3999), ("key1", 20), ("key1", 999),
                    ("key2", 1998), ("key2", 1999), ("key2", 1000)]:
        h.element(key, 1, ts)
    expected = {1000: bag(), 2000: bag(), 3000: bag(("key1", 3, *G)), 4000: bag(),
                5000: bag(), 6000: bag(("key1", 3, *G), ("key2", 5, *G)), 7000: bag(),
                8000: bag()}
    for watermark, rows in expected.items():
        h.watermark(watermark)
        assert h.output() == rows, watermark


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_count_trigger_through_a_restore(backend):
    """testCountTrigger: global windows purged every 4 records of a key; the counts
    survive a snapshot and restore."""
    trigger = rs.PurgingTrigger(rs.CountTrigger(count=4))
    h = Harness(backend, rs.GlobalWindows(), trigger, timestamp=None)
    for key, ts in [("key2", 3000), ("key2", 3999), ("key1", 20), ("key1", 0), ("key1", 999),
                    ("key2", 1998), ("key2", 1999)]:
        h.element(key, 1, ts)
    before = h.output()
    assert before == bag(("key2", 4, *G))
    h = Harness(backend, rs.GlobalWindows(), trigger, timestamp=None,
                restored=restored(h.snapshot()))
    h.element("key2", 1, 1000)
    assert h.output() == bag()
    h.element("key1", 1, 10999)
    assert h.output() == bag(("key1", 4, *G))
    for _ in range(3):
        h.element("key2", 1, 1000)
    assert h.output() == bag(("key2", 4, *G))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_end_of_stream_trigger(backend):
    """testEndOfStreamTrigger: global windows with an event-time trigger fire once, at the
    end of the input."""
    h = Harness(backend, rs.GlobalWindows(), rs.EventTimeTrigger(), timestamp=None)
    for key, ts in [("key2", 3000), ("key2", 3999), ("key1", 20), ("key1", 0), ("key1", 999),
                    ("key2", 1998), ("key2", 1999), ("key2", 1000)]:
        h.element(key, 1, ts)
    h.watermark(10_000)
    assert h.output() == bag()
    h.watermark(rs.MAX_WATERMARK)
    assert h.output() == bag(("key1", 3, *G), ("key2", 5, *G))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_global_windows_never_fire_by_default(backend):
    """GlobalWindowsTest: every record is in the one window, which the default trigger
    never fires (Flink's NeverTrigger)."""
    h = Harness(backend, rs.GlobalWindows(), None, timestamp=None)
    h.elements([("a", 1, 0), ("a", 2, 4999), ("b", 3, 5000)])
    h.watermark(rs.MAX_WATERMARK)
    h.op.finish()
    assert h.output() == bag()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_lateness_with_a_purging_event_time_trigger(backend):
    """testLateness: a purging event-time trigger with 500 ms of allowed lateness fires a
    late record at once with only what came since the last firing; past the cleanup a
    record goes to the late output."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=2000),
                rs.PurgingTrigger(rs.EventTimeTrigger()), lateness=500)
    h.element("key2", 1, 500)
    h.watermark(1500)
    assert h.output() == bag()
    h.element("key2", 1, 1300)
    h.watermark(2300)
    assert h.output() == bag(("key2", 2, 0, 2000))
    h.element("key2", 1, 1997)
    assert h.output() == bag(("key2", 1, 0, 2000))
    h.watermark(6000)
    assert h.output() == bag()
    h.element("key2", 1, 1998)
    h.watermark(7000)
    assert h.output() == bag()
    assert h.late() == [("key2", 1, 1998)]


class AccumulatingGC(rs.Trigger):
    """testCleanupTimerWithEmptyListStateForTumblingWindows2's EventTimeTriggerAccumGC: an
    event-time trigger that fires and purges at the end and at the cleanup time (a
    trigger of the user's own, vectorized like the built-in ones)."""

    def __init__(self, cleanup: int) -> None:
        self.cleanup = cleanup
        self.domains = frozenset({TimeDomain.EVENT_TIME})

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        pending = np.flatnonzero(created.ends - 1 > created.watermarks)
        return (Timers(TimeDomain.EVENT_TIME, pending, created.ends[pending] - 1),)

    def on_records(self, filled: Filled) -> np.ndarray:
        return np.where(filled.ends - 1 <= filled.watermarks, TriggerResult.FIRE,
                        TriggerResult.CONTINUE).astype(np.int8)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        at = (due.timestamps == due.ends - 1) | (due.timestamps == due.ends - 1 + self.cleanup)
        return np.where(at, TriggerResult.FIRE_AND_PURGE, TriggerResult.CONTINUE
                        ).astype(np.int8), ()


class Rows(rs.ProcessWindowFunction):
    """Each firing's key and number of rows (Flink's PassThroughFunction2, counted)."""

    def process(self, key, window, rows):
        yield {"k": key, "rows": rows.num_rows, "window_start": window.start,
               "window_end": window.end}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_a_user_trigger_sees_the_cleanup_timer(backend):
    """testCleanupTimerWithEmptyListStateForTumblingWindows2: the cleanup timer reaches the
    trigger too; firing a purged window emits nothing."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=2000), AccumulatingGC(100),
                function=ProcessWindow(Rows()), lateness=100)
    h.element("key2", 1, 1000)
    steps = {1599: bag(), 1999: bag(("key2", 1, 0, 2000)), 2100: bag(), 5000: bag()}
    for watermark, rows in steps.items():
        h.watermark(watermark)
        assert h.output() == rows, watermark


class FireEverytime(rs.Trigger):
    """testCleanupTimerWithEmptyStateNoResultForTumblingWindows's trigger: fires on every
    record and every timer, never purges."""

    domains = frozenset({TimeDomain.EVENT_TIME})

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        index = np.arange(len(created.ends))  # one timer each 100 ms up to the end
        return tuple(Timers(TimeDomain.EVENT_TIME, index, created.ends - 1 - step)
                     for step in (400, 300, 200, 0))

    def on_records(self, filled: Filled) -> np.ndarray:
        return np.full(len(filled.ends), TriggerResult.FIRE, dtype=np.int8)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        return np.full(len(due.ends), TriggerResult.FIRE, dtype=np.int8), ()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_contents_stay_until_the_cleanup_time(backend):
    """testCleanupTimerWithEmptyStateNoResultForTumblingWindows: a trigger that fires
    without purging keeps the window's rows until end - 1 + lateness, then they are
    gone (firing the same timer after it emits nothing)."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=2000), FireEverytime(),
                function=ProcessWindow(Rows()), lateness=1)
    h.element("test_key", 1, 1000)
    assert h.output() == bag(("test_key", 1, 0, 2000))
    for watermark in (1599, 1699, 1799, 1999):
        h.watermark(watermark)
        assert h.output() == bag(("test_key", 1, 0, 2000)), watermark
    h.watermark(2000)  # the cleanup, end - 1 + 1: fires a last time, then drops the rows
    assert h.output() == bag(("test_key", 1, 0, 2000))
    h.watermark(5000)
    assert h.output() == bag()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_side_output_due_to_lateness_sliding(backend):
    """testSideOutputDueToLatenessSliding (the default trigger): a record late for its
    earliest window still counts in the later ones."""
    h = Harness(backend, rs.SlidingEventTimeWindows(size_ms=3000, slide_ms=1000), None)
    h.element("key2", 1, 1000)
    h.watermark(1999)
    assert h.output() == bag(("key2", 1, -1000, 2000))
    h.element("key2", 1, 2000)
    h.watermark(3000)
    assert h.output() == bag(("key2", 2, 0, 3000))
    for key, ts in [("key1", 3001), ("key2", 2400), ("key2", 2400), ("key1", 3001),
                    ("key2", 3900)]:
        h.element(key, 1, ts)
    h.watermark(6000)
    assert h.output() == bag(("key2", 5, 1000, 4000), ("key1", 2, 1000, 4000),
                             ("key2", 4, 2000, 5000), ("key1", 2, 2000, 5000),
                             ("key2", 1, 3000, 6000), ("key1", 2, 3000, 6000))
    h.element("key1", 1, 3001)
    h.watermark(25000)
    assert h.output() == bag()
    assert h.late() == [("key1", 1, 3001)]


# -- ContinuousProcessingTimeTriggerTest ---------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_continuous_processing_time_trigger_on_processing_time_windows(backend):
    """testProcessingTimeWindowFiring: every 5 ms of the clock and at the window's end."""
    h = Harness(backend, rs.TumblingProcessingTimeWindows(size_ms=10),
                rs.ContinuousProcessingTimeTrigger(interval_ms=5), timestamp=None)
    steps = [(0, 1, None), (2, 2, None), (5, None, (3, 0, 10)), (7, 3, None),
             (9, None, (6, 0, 10)), (10, 3, None), (15, None, (3, 10, 20)), (18, 3, None),
             (20, None, (6, 10, 20))]
    for now, value, fired in steps:
        h.processing_time(now)
        assert h.output() == (bag() if fired is None else bag(("x", *fired))), now
        if value is not None:
            h.element("x", value, 0)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_continuous_processing_time_trigger_on_event_time_windows(backend):
    """testEventTimeWindowFiring (FLINK-35069): a processing-time trigger on event-time
    windows fires at the window's end in processing time once, not without end."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=10),
                rs.ContinuousProcessingTimeTrigger(interval_ms=5))
    h.processing_time(0)
    h.elements([("x", 1, 1), ("x", 2, 3), ("x", 3, 7)])
    h.processing_time(5)
    assert h.output() == bag(("x", 6, 0, 10))
    h.element("x", 3, 8)
    h.processing_time(10)
    assert h.output() == bag(("x", 9, 0, 10))
    h.element("x", 3, 12)
    h.processing_time(15)
    assert h.output() == bag(("x", 3, 10, 20))


# -- the trigger tests: CountTrigger, ContinuousEventTimeTrigger, PurgingTrigger ----------------

@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_count_trigger_separates_windows(backend):
    """CountTriggerTest.testWindowSeparationAndFiring: each window counts its own records
    and starts again after it fires (without purging: it emits everything so far)."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=2), rs.CountTrigger(count=3))
    h.element("k", 1, 0)
    h.element("k", 1, 2)
    h.element("k", 1, 1)
    assert h.output() == bag()
    h.element("k", 1, 0)
    assert h.output() == bag(("k", 3, 0, 2))
    h.element("k", 1, 3)
    assert h.output() == bag()
    h.element("k", 1, 2)
    assert h.output() == bag(("k", 3, 2, 4))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_continuous_event_time_trigger_separates_windows_and_fires_late_ones(backend):
    """ContinuousEventTimeTriggerTest.testWindowSeparationAndFiring and
    testLateElementTriggersImmediately: a window fires at its end once the watermark
    passes it; a record for a window the watermark has passed fires it at once."""
    h = Harness(backend, rs.TumblingEventTimeWindows(size_ms=2),
                rs.ContinuousEventTimeTrigger(interval_ms=3_600_000), lateness=10)
    h.elements([("k", 1, 0), ("k", 1, 1), ("k", 1, 0), ("k", 1, 2), ("k", 1, 3)])
    h.watermark(2)
    assert h.output() == bag(("k", 3, 0, 2))
    h.watermark(4)
    assert h.output() == bag(("k", 2, 2, 4))
    h.element("k", 1, 1)  # late for [0, 2), within the lateness
    assert h.output() == bag(("k", 4, 0, 2))


def test_purging_trigger_maps_every_firing_to_a_purge():
    """PurgingTriggerTest.testForwarding: FIRE and FIRE_AND_PURGE become FIRE_AND_PURGE,
    CONTINUE and PURGE stay."""

    class Fixed(rs.Trigger):
        def __init__(self, results):
            self.results = np.array(results, dtype=np.int8)

        def on_records(self, filled):
            return self.results

        def on_timers(self, due):
            return self.results, ()

    results = [TriggerResult.CONTINUE, TriggerResult.FIRE, TriggerResult.FIRE_AND_PURGE,
               TriggerResult.PURGE]
    purging = rs.PurgingTrigger(Fixed(results))
    expected = [TriggerResult.CONTINUE, TriggerResult.FIRE_AND_PURGE,
                TriggerResult.FIRE_AND_PURGE, TriggerResult.PURGE]
    filled = Filled(np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64))
    assert [TriggerResult(r) for r in purging.on_records(filled)] == expected
    due = Due(TimeDomain.EVENT_TIME, np.zeros(4, np.int64), np.zeros(4, np.int64),
              np.zeros(4, np.int64), 0)
    assert [TriggerResult(r) for r in purging.on_timers(due)[0]] == expected
    assert fires(np.array(expected, dtype=np.int8)).tolist() == [False, True, True, False]


def test_triggers_are_checked_where_the_window_is_built():
    env = rs.StreamEnvironment(parallelism=1)
    keyed = env.from_collection([{"k": 1, "ts": 0}]).key_by("k")
    with pytest.raises(ValueError, match="session windows keep their default trigger"):
        keyed.window(rs.EventTimeSessionWindows(gap_ms=10), timestamp="ts",
                     trigger=rs.CountTrigger(count=2))
    with pytest.raises(TypeError, match="takes a trigger"):
        keyed.window(rs.TumblingEventTimeWindows(size_ms=10), timestamp="ts",
                     trigger="count")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="positive number of records"):
        rs.CountTrigger(count=0)
    with pytest.raises(ValueError, match="interval_ms"):
        rs.ContinuousEventTimeTrigger(interval_ms=-5)


# -- count triggers against a pandas oracle -------------------------------------------------------

def random_input(seed: int, n: int = 400) -> pd.DataFrame:
    """Keys a..d, event times in 0..1999 in disorder (a row ~300 ms behind the newest
    now and then), values 0..9."""
    rng = np.random.default_rng(seed)
    base = np.sort(rng.integers(0, 2000, n))
    ts = base - rng.integers(0, 300, n) * (rng.random(n) < 0.3)
    return pd.DataFrame({"k": rng.choice(list("abcd"), n), "v": rng.integers(0, 10, n),
                         "ts": ts.clip(0)})


def feed(h: Harness, frame: pd.DataFrame, *, batch: int, lag: int) -> list[int]:
    """Batches of ``frame``; after each the watermark max(ts) - lag - 1. Returns the
    watermark each row met on arrival."""
    wm, seen, met = rs.MIN_WATERMARK, rs.MIN_WATERMARK, []
    for i in range(0, len(frame), batch):
        part = frame.iloc[i:i + batch]
        h.op.process_batch(pa.RecordBatch.from_pandas(part, preserve_index=False))
        met += [wm] * len(part)
        seen = max(seen, int(part.ts.max()))
        if seen - lag - 1 > wm:
            wm = seen - lag - 1
            h.watermark(wm)
    return met


def count_oracle(frame: pd.DataFrame, met: list[int], *, size: int | None, slide: int | None,
                 count: int, purging: bool, lateness: int) -> Counter:
    """Each window's firings, record by record in arrival order: a record joins each of
    its windows that is not late for it (end - 1 + lateness > the watermark it met);
    every ``count`` records of a window emit its sum (since the last firing if
    purging)."""
    held: dict[tuple, list[int]] = {}
    out: Counter = Counter()
    for (k, v, ts), watermark in zip(frame[["k", "v", "ts"]].itertuples(index=False), met):
        if size is None:
            windows = [G]
        else:
            step = slide or size
            last = ts - ts % step
            windows = [(s, s + size) for s in range(last, ts - size, -step) if s + size > ts]
        for start, end in windows:
            if size is not None and end - 1 + lateness <= watermark:
                continue
            rows = held.setdefault((k, start, end), [0, 0])
            rows[0] += 1
            rows[1] += int(v)
            if rows[0] % count == 0:
                out[(k, rows[1], start, end)] += 1
                if purging:
                    rows[1] = 0
    return out


CASES = [  # (assigner, size, slide)
    (rs.GlobalWindows(), None, None),
    (rs.TumblingEventTimeWindows(size_ms=500), 500, None),
    (rs.SlidingEventTimeWindows(size_ms=600, slide_ms=200), 600, 200),
]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("purging", [True, False], ids=["purging", "accumulating"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=["global", "tumbling", "sliding"])
def test_count_trigger_matches_the_oracle(backend, purging, case):
    assigner, size, slide = CASES[case]
    trigger = rs.CountTrigger(count=3)
    trigger = rs.PurgingTrigger(trigger) if purging else trigger
    for seed, batch in ((1, 7), (2, 50)):
        frame = random_input(seed)
        lateness = 0 if size is None else 100  # global windows are never late
        h = Harness(backend, assigner, trigger, lateness=lateness)
        met = feed(h, frame, batch=batch, lag=150)
        h.watermark(rs.MAX_WATERMARK)
        expected = count_oracle(frame, met, size=size, slide=slide, count=3, purging=purging,
                                lateness=lateness)
        assert sum(expected.values()) > 20
        assert h.output() == expected, (seed, batch)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_count_trigger_restores_at_other_parallelisms(backend, parallelism):
    """A snapshot midway restored into 1, 2 or 3 subtasks: what they emit after it, with
    what came before, is what the uninterrupted run emitted (each key's count goes on
    where it was); the other backend's snapshot restores into these subtasks too."""
    frame = random_input(3)
    half = len(frame) // 2
    trigger = rs.PurgingTrigger(rs.CountTrigger(count=4))
    whole = Harness(backend, rs.GlobalWindows(), trigger)
    feed(whole, frame.iloc[:half], batch=13, lag=150)
    before = whole.output()
    sections = whole.snapshot()
    feed(whole, frame.iloc[half:], batch=13, lag=150)
    expected = whole.output()
    snapshots = {backend: sections}
    other = StateBackend.DISK if backend is StateBackend.HEAP else StateBackend.HEAP
    moving = Harness(other, rs.GlobalWindows(), trigger)  # its snapshot moves in
    feed(moving, frame.iloc[:half], batch=13, lag=150)
    assert moving.output() == before
    snapshots[other] = moving.snapshot()
    for sections in snapshots.values():
        after: Counter = Counter()
        for index in range(parallelism):
            h = Harness(backend, rs.GlobalWindows(), trigger, index=index,
                        parallelism=parallelism,
                        restored=restored(sections, index=index, parallelism=parallelism))
            groups = rs.key_group_range(index, parallelism, MAXP)
            rest = frame.iloc[half:]
            mine = rest[[rs.key_group_of(k, MAXP) in groups for k in rest.k]]
            if len(mine):
                feed(h, mine, batch=13, lag=150)
            after += h.output()
        assert after == expected


# -- a job, through a kill --------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["heap", pytest.param("disk", marks=pytest.mark.slow)])
def test_a_count_triggered_job_is_exactly_once_through_a_kill(ray_session, tmp_path, backend):
    """Every 5 records of a key, their sum, from one ordered reader: a kill of the window
    subtask after a checkpoint neither loses nor repeats a group (pandas over the same
    input groups each key's values 5 by 5)."""
    env = checkpointed_env(str(tmp_path / "checkpoints"), state_backend=backend)
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=1, name="numbers")
    sink = (source.map_batches(throttle, name="throttle").key_by("k")
            .window(rs.GlobalWindows(), trigger=rs.PurgingTrigger(rs.CountTrigger(count=5)))
            .agg(n=("count", None), total=("sum", "v"), name="every5").collect(name="out"))
    client = env.execute_async(f"count-trigger-kill-{backend}")
    wait_for_checkpoint(client)
    ray.kill(client.subtask_actor("every5", 1))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1
    frame = pd.DataFrame(numbers(np.arange(N)))
    frame["group"] = frame.groupby("k").cumcount() // 5
    full = frame.groupby(["k", "group"]).agg(n=("v", "size"), total=("v", "sum")).reset_index()
    expected = full[full.n == 5].sort_values(["k", "total"]).reset_index(drop=True)
    got = (result.table(sink).to_pandas()[["k", "n", "total"]].sort_values(["k", "total"])
           .reset_index(drop=True))
    pd.testing.assert_frame_equal(got, expected[["k", "n", "total"]], check_dtype=False)
