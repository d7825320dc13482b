"""Disk timers fire in bounded chunks (:attr:`DiskTimerService.firing_limit`).

A window that ends for every key at once (a daily window at midnight) must not pop
all of its timers at once. With a firing limit of ``FIRING`` timers and a key table of
``LIMIT`` keys: the service alone against a model of timer sets (every due timer
once, never early, timestamps never going back from one chunk to the next, timers
registered or deleted between chunks); then a keyed process function, tumbling,
sliding and session windows (built-in aggregates and a user ``AggregateFunction``)
and session window joins, each run by hand on the disk backend with hundreds of
keys due in one watermark step, against the heap backend's output and a pandas
oracle, the key table never holding more than its limit plus one chunk's keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.keygroups import key_group_of
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.operators.keyed import KeyedProcessOperator, KeyedOperator
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.functions import BuiltinAggregates, UserAggregate
from raystream.engine.windows.join import WindowJoinKind, WindowJoinOperator, WindowJoinSpec
from raystream.engine.windows.dense import DiskDenseWindows
from raystream.engine.windows.operator import WindowOperator
from raystream.timers.disk_service import DiskTimerService
from tests.support.functions import Average, co_groups
from tests.support.oracles import oracle_groups, oracle_pairs, windows_of

MAXP = 128
FIRING = 7  # timers per pop
LIMIT = 10  # keys in the key table before a safe point empties it
KEYS = 600


# -- the service against a model ---------------------------------------------------------------

@pytest.mark.parametrize(("seed", "groups", "firing"), [
    (1, range(10, 100), FIRING), (2, range(10, 100), FIRING), (3, range(40, 43), FIRING),
    (4, range(127, 128), FIRING), (5, range(40, 43), 100), (6, range(10, 13), 150)])
def test_chunks_of_the_service_equal_a_model(seed, groups, firing):
    """Many key groups (each read up to its share), or a few that hold many due timers
    each (read up to the cap, below the limit of 100 or 150: the rest stays, the chunk
    ends at the earliest last-read timestamp of the groups cut)."""
    rng = np.random.default_rng(seed)
    backend = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=groups)
    timers = DiskTimerService(backend, key_table_limit=LIMIT, firing_limit=firing)
    universe = [k for k in [*range(3000), *(f"k{i}" for i in range(1000))]
                if key_group_of(k, MAXP) in groups]
    groups_of = {k: key_group_of(k, MAXP) for k in universe}
    model = {"event": set(), "processing": set()}
    register = {"event": timers.register_event_time_timers,
                "processing": timers.register_processing_time_timers}
    delete = {"event": timers.delete_event_time_timer,
              "processing": timers.delete_processing_time_timer}
    pop = {"event": timers.advance_watermark, "processing": timers.fire_processing_time}

    def add(domain: str, keys: list, ns: np.ndarray, ts: np.ndarray) -> set:
        kids = timers.key_ids(keys, np.array([groups_of[k] for k in keys]))
        register[domain](kids, ns, ts)
        new = set(zip(ts.tolist(), keys, ns.tolist()))
        model[domain] |= new
        return new

    bound = {"event": -1, "processing": -1}
    for step in range(8):
        for domain in ("event", "processing"):
            # many keys at a few shared timestamps (a window ending for all), some spread
            n = 300 if firing == FIRING else 1500  # more than the cap due per group
            keys = [universe[i] for i in rng.integers(0, len(universe), n)]
            shared = rng.choice([100, 200, 300], n) + 400 * step
            spread = rng.integers(-50, 450, n) + 400 * step
            ts = np.where(rng.random(n) < 0.7, shared, spread)
            add(domain, keys, rng.integers(-2, 3, n), ts)
            timers.release_keys()
            bound[domain] = 400 * step + int(rng.integers(150, 350))
            until, last, chunks = bound[domain], None, 0
            fired: set[tuple[int, object, int]] = set()
            while True:
                ts_, kids, ns = pop[domain](until)
                if not len(ts_):
                    break
                chunks += 1
                assert len(ts_) <= firing
                assert (np.diff(ts_) >= 0).all() and ts_.max() <= until  # none early
                assert last is None or ts_[0] >= last, "timestamps never go back"
                last = int(ts_[-1])
                assert timers.num_keys <= LIMIT + firing
                chunk = list(zip(ts_.tolist(), timers.keys(kids), ns.tolist()))
                assert not set(chunk) & set(fired), "each timer fires once"
                assert set(chunk) <= model[domain]
                fired |= set(chunk)
                model[domain] -= set(chunk)
                # between chunks: a safe point, new timers (due ones at or after the last
                # fired, later ones), deletions of pending ones
                timers.release_keys()
                if chunks % 5 == 0:
                    more = [universe[i] for i in rng.integers(0, len(universe), 4)]
                    fired -= add(domain, more, np.zeros(4, np.int64),  # may fire again
                                 np.array([last, last + 1, until, until + 60]))
                    pending = sorted(model[domain], key=repr)[:2]
                    for t, k, n in pending:
                        delete[domain](timers.key_id(k, groups_of[k]), n, t)
                        model[domain].discard((t, k, n))
                    timers.release_keys()
            assert chunks > (10 if firing == FIRING else 2)
            assert not {t for t in model[domain] if t[0] <= until}, "every due timer fired"
        assert timers.next_event_time() == min((t[0] for t in model["event"]), default=None)
        assert timers.next_processing_time() == min((t[0] for t in model["processing"]),
                                                    default=None)
    for domain in ("event", "processing"):
        rest: list = []
        while len(popped := pop[domain](rs.MAX_WATERMARK)[0]):
            rest += popped.tolist()
        assert sorted(rest) == rest and len(rest) == len(model[domain])
    assert timers.num_event_time_timers == timers.num_processing_time_timers == 0
    backend.close()


# -- operators by hand -------------------------------------------------------------------------

@dataclass
class Watch:
    """The key table's size at every safe point (its peak: before it may be emptied) by
    phase, and the size of every pop."""

    phase: str = "batch"
    peaks: dict[str, list[int]] = field(default_factory=lambda: {"batch": [], "fire": []})
    pops: list[int] = field(default_factory=list)

    def attach(self, timers: DiskTimerService) -> None:
        release, advance, fire = (timers.release_keys, timers.advance_watermark,
                                  timers.fire_processing_time)

        def release_keys(*, force: bool = False) -> bool:
            self.peaks[self.phase].append(timers.num_keys)
            return release(force=force)

        def advance_watermark(watermark: int):
            popped = advance(watermark)
            self.pops.append(len(popped[0]))
            return popped

        def fire_processing_time(now_ms: int):
            popped = fire(now_ms)
            self.pops.append(len(popped[0]))
            return popped

        timers.release_keys = release_keys
        timers.advance_watermark = advance_watermark
        timers.fire_processing_time = fire_processing_time


def started(op: KeyedOperator, backend: StateBackend) -> tuple[KeyedOperator, Watch]:
    op.setup(RuntimeContext("job", op.name, 0, 1, MAXP, 0, state_backend=backend),
             CollectingOutput())
    op.initialize_state(None)
    op.open()
    watch = Watch()
    if backend is StateBackend.DISK:
        timers = op.disk_timers
        timers.key_table_limit, timers.firing_limit = LIMIT, FIRING
        watch.attach(timers)
    return op, watch


def output_of(op: KeyedOperator) -> list[dict]:
    output = op.output
    assert isinstance(output, CollectingOutput)
    return [r for b in output.batches for r in b.to_pylist()]


def check_chunks(watch: Watch, bound: int) -> None:
    """Many chunks of at most FIRING timers; the key table at most ``bound`` at the safe
    points of firings, and emptied in between."""
    assert max(watch.pops) <= FIRING and sum(1 for n in watch.pops if n) > 10
    fire = watch.peaks["fire"]
    assert fire and max(fire) <= bound, (max(fire), bound)
    assert sum(1 for n in fire if n > LIMIT) > 10  # emptied again and again


def keys_input(seed: int, n: int = 1500) -> pd.DataFrame:
    """KEYS keys; most rows at a few shared times, so hundreds of keys' timers fall due
    at the same timestamp, the others spread before and after."""
    rng = np.random.default_rng(seed)
    ts = np.where(rng.random(n) < 0.6, rng.choice([0, 120, 900], n), rng.integers(0, 1400, n))
    return pd.DataFrame({"k": rng.integers(0, KEYS, n), "ts": ts.astype(np.int64),
                         "x": rng.integers(-50, 50, n).astype(np.float64),
                         "side": rng.integers(0, 2, n)})


W1 = 999  # the watermark step that ends the first tumbling window of every key
BATCH = 100


def run(op: KeyedOperator, watch: Watch, frame: pd.DataFrame, columns: list[str], *,
        sides: int = 1, clock: bool = False) -> list[dict]:
    """Every row first (no watermark yet), then the watermark W1 (and the clock to W1),
    then the end of time: the output rows with the step (1, 2) that produced them."""
    for a in range(0, len(frame), BATCH):
        part = frame.iloc[a:a + BATCH]
        for side in range(sides):
            rows = part[part["side"] == side] if sides > 1 else part
            op.process_batch(pa.RecordBatch.from_pandas(rows[columns], preserve_index=False),
                             side)
    assert not output_of(op)
    out = []
    op.release_key_ids()  # the batches' safe point (windows release at a batch's start)
    watch.phase = "fire"
    for step, bound in ((1, W1), (2, rs.MAX_WATERMARK)):
        op.process_watermark(bound)
        if clock:
            op.on_processing_time(bound)  # pyright: ignore[reportAttributeAccessIssue]
        out += [dict(r, step=step) for r in output_of(op)]
        op.output.batches.clear()  # pyright: ignore[reportAttributeAccessIssue]
    return out


# -- a keyed process function --------------------------------------------------------------------

class Rounds(rs.KeyedProcessFunction):
    """Per row: an event-time timer at its time rounded down to 100 and a processing-time
    timer at ts + 5; a firing at a round time registers a timer one later (due already
    when the watermark passed it)."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        ctx.register_event_time_timer(row["ts"] // 100 * 100)
        ctx.register_processing_time_timer(row["ts"] + 5)
        return None

    def on_timer(self, timestamp, ctx):
        if ctx.time_domain == "event_time" and timestamp % 100 == 0:
            ctx.register_event_time_timer(timestamp + 1)
        yield {"k": ctx.current_key, "t": timestamp, "domain": ctx.time_domain,
               "count": self.count.value()}


def test_keyed_process_function_fires_in_chunks():
    frame = keys_input(4)
    runs = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op, watch = started(KeyedProcessOperator("p", Rounds(), KeySelector.of("k")), backend)
        got = pd.DataFrame(run(op, watch, frame, ["k", "ts"], clock=True))
        runs[backend] = got.sort_values(list(got.columns)).reset_index(drop=True)
        if backend is StateBackend.DISK:
            check_chunks(watch, LIMIT + FIRING)
    # pandas: every timer once, in the first step whose bound reaches it
    counts = frame.groupby("k").size()
    event = (frame["ts"] // 100 * 100).to_numpy()
    timers = pd.concat([
        pd.DataFrame({"k": frame["k"], "t": event, "domain": "event_time"}),
        pd.DataFrame({"k": frame["k"], "t": event + 1, "domain": "event_time"}),
        pd.DataFrame({"k": frame["k"], "t": frame["ts"] + 5, "domain": "processing_time"}),
    ]).drop_duplicates()
    expected = timers.assign(count=counts[timers["k"]].to_numpy(),
                             step=np.where(timers["t"] <= W1, 1, 2))
    expected = expected.sort_values(list(runs[StateBackend.DISK].columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(runs[StateBackend.DISK], runs[StateBackend.HEAP])
    pd.testing.assert_frame_equal(runs[StateBackend.DISK], expected[runs[StateBackend.DISK]
                                                                    .columns], check_dtype=False)
    assert (expected["step"] == 1).sum() > 20 * FIRING


# -- windows --------------------------------------------------------------------------------------

GAP = 50
ASSIGNERS = {"tumbling": rs.TumblingEventTimeWindows(size_ms=1000),
             "sliding": rs.SlidingEventTimeWindows(size_ms=1000, slide_ms=500),
             "session": rs.EventTimeSessionWindows(gap_ms=GAP)}


def windows_oracle(frame: pd.DataFrame, assigner) -> pd.DataFrame:
    """pandas: (k, window_start, window_end, rows, total, step) of every window."""
    if isinstance(assigner, rs.EventTimeSessionWindows):
        rows = frame.sort_values(["k", "ts"])
        session = ((rows["k"].diff() != 0) | (rows["ts"].diff() > GAP)).cumsum()
        grouped = rows.groupby(session)
        out = pd.DataFrame({"k": grouped["k"].first(), "window_start": grouped["ts"].min(),
                            "window_end": grouped["ts"].max() + GAP, "rows": grouped.size(),
                            "total": grouped["x"].sum()})
    else:
        rows = frame.assign(window=[windows_of(assigner, t) for t in frame["ts"].tolist()])
        rows = rows.explode("window")
        rows["window_start"] = [w[0] for w in rows["window"]]
        rows["window_end"] = [w[1] for w in rows["window"]]
        grouped = rows.groupby(["k", "window_start", "window_end"])
        out = pd.DataFrame({"rows": grouped.size(), "total": grouped["x"].sum()}).reset_index()
    return out.assign(step=np.where(out["window_end"] - 1 <= W1, 1, 2))


def window_rows(rows: list[dict], function: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if function == "user":
        frame = frame.assign(total=frame["avg"] * frame["rows"])
    frame = frame[["k", "window_start", "window_end", "rows", "total", "step"]].astype(
        {"k": np.int64, "window_start": np.int64, "window_end": np.int64, "rows": np.int64,
         "step": np.int64})
    return frame.sort_values(["k", "window_start", "window_end"]).reset_index(drop=True)


@pytest.mark.parametrize("function", ["builtin", "user"])
@pytest.mark.parametrize("assigner", list(ASSIGNERS), ids=str)
def test_windows_fire_in_chunks(assigner, function):
    frame = keys_input(5)
    results = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        window_function = (
            UserAggregate(Average(), "result")  # pyright: ignore[reportArgumentType]
            if function == "user" else
            BuiltinAggregates(AggregateSpec.of({"rows": ("count", None), "total": ("sum", "x")})))
        op, watch = started(WindowOperator("w", KeySelector.of("k"), ASSIGNERS[assigner],
                                           function=window_function, timestamp="ts"), backend)
        results[backend] = window_rows(run(op, watch, frame, ["k", "ts", "x"]), function)
        if backend is StateBackend.DISK:
            assert isinstance(op, WindowOperator)
            if isinstance(op.store, DiskDenseWindows):
                # a pane timer stands for its key group: a chunk fires its groups' keys
                per_group = frame.groupby(frame["k"].map(lambda k: key_group_of(k, MAXP)))
                largest = sorted(per_group["k"].nunique().tolist())[-FIRING:]
                check_chunks(watch, LIMIT + FIRING + sum(largest))
            else:
                check_chunks(watch, LIMIT + FIRING)
    expected = windows_oracle(frame, ASSIGNERS[assigner])
    expected = expected.sort_values(["k", "window_start", "window_end"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(results[StateBackend.DISK], results[StateBackend.HEAP])
    pd.testing.assert_frame_equal(results[StateBackend.DISK], expected, check_dtype=False)
    assert (expected["step"] == 1).sum() > 20 * FIRING


# -- session window joins ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(WindowJoinKind), ids=lambda k: k.value)
def test_session_window_joins_fire_in_chunks(kind):
    assigner = ASSIGNERS["session"]
    frame = keys_input(6).assign(id=np.arange(1500))
    fn = co_groups if kind is WindowJoinKind.CO_GROUP else None
    results = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        spec = WindowJoinSpec(kind, assigner, (KeySelector.of("k"), KeySelector.of("k")),
                              ("ts", "ts"))
        op, watch = started(WindowJoinOperator("wjoin", spec, fn), backend)
        rows = run(op, watch, frame, ["id", "k", "ts"], sides=2)
        if kind is WindowJoinKind.JOIN:
            results[backend] = sorted((r["id"], r["id_right"], r["window_start"],
                                       r["window_end"]) for r in rows)
        else:
            results[backend] = sorted((r["k"], r["window_start"], r["window_end"],
                                       tuple(r["left"]), tuple(r["right"])) for r in rows)
        if backend is StateBackend.DISK:
            check_chunks(watch, LIMIT + FIRING)
    left, right = (frame[frame["side"] == side] for side in (0, 1))
    expected = sorted(oracle_pairs(left, right, assigner) if kind is WindowJoinKind.JOIN
                      else oracle_groups(left, right, assigner))
    assert results[StateBackend.DISK] == results[StateBackend.HEAP] == expected and expected
