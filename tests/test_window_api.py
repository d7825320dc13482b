"""Window API (issue 16): chained windows on the results' event time, window_all, and the
rate-limited log of dropped late records — each against an independent pandas oracle.

Operator-level tests chain operators by hand (stage 1's output feeds stage 2 in order:
results before the watermark that fired them), so lateness is exact; job-level tests
run the same shapes on Ray.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.engine.windows.stream import ALL_KEY, with_all_key
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.functions import BuiltinAggregates, UserAggregate
from raystream.engine.windows.operator import WindowOperator
from raystream.engine.windows.pre_aggregate import WindowPreAggregator


class Feed:
    """An output that hands everything to the next operator at once, in order."""

    def __init__(self, op) -> None:
        self.op = op

    def emit(self, batch: pa.RecordBatch) -> None:
        self.op.process_batch(batch)

    def emit_watermark(self, watermark: int) -> None:
        self.op.process_watermark(watermark)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        pass


def start(op, output) -> None:
    op.setup(RuntimeContext.local(), output)
    op.initialize_state(None)
    op.open()


def disordered(seed: int, n: int = 3000, keys: int = 4, disorder: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ts = np.arange(n) * 7 + rng.integers(-disorder, disorder + 1, n) + 10_000
    return pd.DataFrame({"k": rng.integers(0, keys, n), "ts": ts,
                         "x": rng.integers(-50, 50, n).astype(np.float64)})


def run_source(first, df: pd.DataFrame, *, batch: int = 50, lag: int = 100) -> pd.Series:
    """Feed ``df`` in batches with a bounded-out-of-orderness watermark
    (max ts seen - lag - 1) after each; returns the watermark each row saw on arrival."""
    wm, seen, arrival = rs.MIN_WATERMARK, -(2 ** 62), []
    for i in range(0, len(df), batch):
        part = df.iloc[i:i + batch]
        first.process_batch(pa.RecordBatch.from_pandas(part, preserve_index=False))
        arrival += [wm] * len(part)
        seen = max(seen, int(part["ts"].max()))
        if seen - lag - 1 > wm:
            wm = seen - lag - 1
            first.process_watermark(wm)
    first.process_watermark(rs.MAX_WATERMARK)
    first.finish()
    return pd.Series(arrival, index=df.index)


def on_time(df: pd.DataFrame, arrival: pd.Series, size: int) -> pd.DataFrame:
    """Oracle: the rows a tumbling ``size`` window (no lateness) keeps: a row is late iff
    its window's end - 1 <= the watermark when it arrives."""
    end = df["ts"] // size * size + size
    return df[end - 1 > arrival]


def table_of(output: CollectingOutput) -> pd.DataFrame:
    return pa.Table.from_batches(output.batches).to_pandas() if output.batches else pd.DataFrame()


@pytest.mark.parametrize("pre_aggregate", [False, True])
def test_two_chained_tumbling_stages_equal_pandas_with_disorder(pre_aggregate):
    """1 s windows then 5 s windows on their results (no timestamp= on the second: it
    reads window_end - 1): equal pandas over the rows stage 1 kept, and stage 2 drops
    nothing as late."""
    df = disordered(seed=1 + pre_aggregate)
    spec1 = AggregateSpec.of({"n": ("count", None), "total": ("sum", "x")})
    spec2 = AggregateSpec.of({"n": ("sum", "n"), "total": ("sum", "total"),
                              "seconds": ("count", None)})
    assert rs.WINDOW_TIME == "window_end - 1"
    out = CollectingOutput()
    second = WindowOperator("five", KeySelector.of("k"), rs.TumblingEventTimeWindows(5000),
                            function=BuiltinAggregates(spec2), timestamp=rs.WINDOW_TIME,
                            partial_input=pre_aggregate)
    start(second, out)
    into_second = Feed(second)
    if pre_aggregate:  # the pre-aggregator reads the results' event time too
        pre = WindowPreAggregator("pre", ["k"], rs.TumblingEventTimeWindows(5000),
                                  timestamp=rs.WINDOW_TIME, spec=spec2)
        start(pre, into_second)
        into_second = Feed(pre)
    first = WindowOperator("one", KeySelector.of("k"), rs.TumblingEventTimeWindows(1000),
                           function=BuiltinAggregates(spec1), timestamp="ts")
    start(first, into_second)
    arrival = run_source(first, df)

    kept = on_time(df, arrival, 1000)
    assert 0 < first.late_dropped == len(df) - len(kept), "the input must have late rows"
    assert second.late_dropped == 0
    per_second = kept.assign(s=kept["ts"] // 1000).groupby(["k", "s"]).agg(
        n=("x", "size"), total=("x", "sum")).reset_index()
    expected = per_second.assign(window_start=per_second["s"] // 5 * 5000).groupby(
        ["k", "window_start"]).agg(n=("n", "sum"), total=("total", "sum"),
                                   seconds=("s", "size")).reset_index()
    got = table_of(out)
    assert (got["window_end"] - got["window_start"] == 5000).all()
    got = got.sort_values(["k", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["k", "window_start", "n", "total", "seconds"]],
                                  expected, check_dtype=False)


def test_window_all_equals_pandas_with_late_rows_and_a_user_aggregate():
    """window_all: one window per time range over every key; results have no key column;
    late rows go to the side output as they came (without the internal key)."""
    df = disordered(seed=5, keys=9)
    spec = AggregateSpec.of({"n": ("count", None), "top": ("max", "x"), "avg": ("mean", "x")})
    out = CollectingOutput()
    op = WindowOperator("all", KeySelector.of(ALL_KEY), rs.TumblingEventTimeWindows(1000),
                        function=BuiltinAggregates(spec), timestamp="ts", late_output="late",
                        emit_keys=False)
    start(op, out)

    class AddKey:  # what window_all puts in front of its window operator
        def __init__(self, op):
            self.op = op

        def process_batch(self, batch):
            self.op.process_batch(with_all_key(batch))

        def process_watermark(self, wm):
            self.op.process_watermark(wm)

        def finish(self):
            self.op.finish()

    arrival = run_source(AddKey(op), df)
    kept = on_time(df, arrival, 1000)
    expected = kept.assign(window_start=kept["ts"] // 1000 * 1000).groupby("window_start").agg(
        n=("x", "size"), top=("x", "max"), avg=("x", "mean")).reset_index()
    got = table_of(out)
    assert list(got.columns) == ["window_start", "window_end", "n", "top", "avg"]
    pd.testing.assert_frame_equal(got.sort_values("window_start").reset_index(drop=True)[
        ["window_start", "n", "top", "avg"]], expected, check_dtype=False)
    late = pa.Table.from_batches(out.side_batches["late"]).to_pandas()
    assert list(late.columns) == ["k", "ts", "x"]
    assert len(late) == len(df) - len(kept) > 0

    class Total:
        def create_accumulator(self):
            return 0.0

        def add(self, row, acc):
            assert ALL_KEY in row  # the user sees rows with it; results do not
            return acc + row["x"]

        def merge(self, a, b):
            return a + b

        def get_result(self, acc):
            return acc

    out = CollectingOutput()
    op = WindowOperator("all", KeySelector.of(ALL_KEY), rs.TumblingEventTimeWindows(1000),
                        function=UserAggregate(Total(), "total"), timestamp="ts",
                        emit_keys=False)
    start(op, out)
    run_source(AddKey(op), df)
    got = table_of(out).sort_values("window_start").reset_index(drop=True)
    assert list(got.columns) == ["window_start", "window_end", "total"]
    totals = kept.groupby(kept["ts"] // 1000 * 1000)["x"].sum()
    assert got["total"].tolist() == pytest.approx(totals.tolist())


def test_dropped_late_records_are_logged_once_then_at_most_every_interval(caplog):
    op = WindowOperator("late-one", KeySelector.of("k"), rs.TumblingEventTimeWindows(10),
                        function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None)})),
                        timestamp="ts")
    start(op, CollectingOutput())
    caplog.set_level(logging.WARNING, logger="raystream.engine.windows.operator")
    op.process_watermark(100)

    def late(n):
        op.process_batch(pa.record_batch({"k": [1] * n, "ts": [5] * n}))

    late(3)
    late(2)
    assert [r.getMessage() for r in caplog.records] == [
        "window 'late-one' dropped 3 late record(s) (3 in total; pass late_output=tag to "
        "keep them, or allowed_lateness_ms)"]
    op._late_logged_at -= 61  # as if a minute went by
    late(4)
    assert len(caplog.records) == 2
    assert "dropped 6 late record(s) (9 in total" in caplog.records[1].getMessage()
    assert op.metrics()["late_records_dropped"] == 9


# -- max_by and top_k --------------------------------------------------------------------
PICKS = {"n": ("count", None), "best": ("max_by", ("v", "b")), "top": ("top_k", ("v", 3)),
         "itop": ("top_k", ("i", 2))}


def picking_input(seed: int, n: int = 3000) -> pd.DataFrame:
    """Few distinct ``b`` (ties on it are common), nulls (NaN) in ``v`` and ``b``."""
    df = disordered(seed, n=n, keys=3)
    rng = np.random.default_rng(seed + 100)
    v = rng.integers(0, 1000, n).astype(np.float64)
    v[rng.random(n) < 0.1] = np.nan
    b = rng.integers(0, 4, n).astype(np.float64)
    b[rng.random(n) < 0.1] = np.nan
    return df.assign(v=v, b=b, i=rng.integers(-5, 5, n))


def picking_oracle(group: pd.DataFrame) -> pd.Series:
    """The documented rules, in pandas: max_by skips rows with a null in either column
    and breaks ties on b by the smallest v; top_k: the largest non-null values, first."""
    valid = group.dropna(subset=["v", "b"])
    best = valid.loc[valid["b"] == valid["b"].max(), "v"].min() if len(valid) else None
    return pd.Series({"n": len(group), "best": best,
                      "top": sorted(group["v"].dropna().tolist(), reverse=True)[:3],
                      "itop": sorted(group["i"].tolist(), reverse=True)[:2]})


def same_picks(got: pd.DataFrame, expected: pd.DataFrame, by: list[str]) -> None:
    got = got.sort_values(by).reset_index(drop=True)
    expected = expected.sort_values(by).reset_index(drop=True)
    assert got[by].values.tolist() == expected[by].values.tolist()
    assert got["n"].tolist() == expected["n"].tolist()
    assert [None if pd.isna(x) else x for x in got["best"]] == \
        [None if x is None or pd.isna(x) else x for x in expected["best"]]
    assert [list(x) for x in got["top"]] == [list(x) for x in expected["top"]]
    assert [list(x) for x in got["itop"]] == [list(x) for x in expected["itop"]]


def test_max_by_and_top_k_partials_merge_in_any_split_like_pandas():
    df = picking_input(seed=3, n=600)
    df.loc[df["k"] == 2, "v"] = np.nan  # a group with no non-null value: null / []
    spec = AggregateSpec.of(PICKS)
    table = pa.Table.from_pandas(df[["k", "v", "b", "i"]], preserve_index=False)
    expected = df.groupby("k").apply(picking_oracle, include_groups=False).reset_index()
    for parts in (1, 2, 7):
        edges = np.linspace(0, len(df), parts + 1).astype(int)
        partials = pa.concat_tables([spec.partials_of_rows(table.slice(a, b - a), ["k"])
                                     for a, b in zip(edges[:-1], edges[1:])])
        merged = spec.merge_partials(partials, ["k"])
        results = spec.results({c: merged[c].to_numpy() for c in spec.partial_columns})
        got = pa.table({"k": merged["k"], **results}).to_pandas()
        same_picks(got, expected, ["k"])
        # the generic path (session windows): an accumulator dict per chunk, merged
        function = BuiltinAggregates(spec)
        zero = table.filter(pa.array(df["k"].to_numpy() == 0))
        edges = np.linspace(0, zero.num_rows, parts + 1).astype(int)
        accs = [function.accumulate(zero.slice(a, b - a), np.array([0, b - a]))[0]
                for a, b in zip(edges[:-1], edges[1:])]
        acc = accs[0]
        for other in accs[1:]:
            acc = function.merge(acc, other)
        row = {n: c[0].as_py() for n, c in function.results([acc]).items()}
        want = expected[expected["k"] == 0].iloc[0]
        assert row["n"] == want["n"] and row["best"] == want["best"]
        assert row["top"] == want["top"] and row["itop"] == want["itop"]


@pytest.mark.parametrize("pre_aggregate", [False, True])
def test_max_by_and_top_k_windows_equal_pandas_with_disorder(pre_aggregate):
    df = picking_input(seed=7 + pre_aggregate)
    spec = AggregateSpec.of(PICKS)
    out = CollectingOutput()
    op = WindowOperator("w", KeySelector.of("k"), rs.TumblingEventTimeWindows(500),
                        function=BuiltinAggregates(spec), timestamp="ts",
                        partial_input=pre_aggregate)
    start(op, out)
    first = op
    if pre_aggregate:
        first = WindowPreAggregator("pre", ["k"], rs.TumblingEventTimeWindows(500),
                                    timestamp="ts", spec=spec, max_buffered_rows=40)
        start(first, Feed(op))
    arrival = run_source(first, df)
    kept = on_time(df, arrival, 500)
    assert len(kept) < len(df)
    expected = kept.assign(window_start=kept["ts"] // 500 * 500).groupby(
        ["k", "window_start"]).apply(picking_oracle, include_groups=False).reset_index()
    same_picks(table_of(out), expected, ["k", "window_start"])


# -- count windows ----------------------------------------------------------------------
COUNTS = {"n": ("count", None), "total": ("sum", "x"), "top": ("top_k", ("x", 2))}


def count_oracle(df: pd.DataFrame, size: int, slide: int | None) -> list[tuple]:
    """Per key in arrival order: a window at every ``slide``-th record (tumbling:
    ``size``-th) over the last ``size`` records (fewer at the start)."""
    slide = slide or size
    out = []
    for k, xs in df.groupby("k", sort=False)["x"]:
        xs = xs.tolist()
        for p in range(slide - 1, len(xs), slide):
            window = xs[max(0, p - size + 1):p + 1]
            out.append((k, len(window), sum(window), sorted(window, reverse=True)[:2]))
    return sorted(out)


def count_rows(batches: list[pa.RecordBatch]) -> list[tuple]:
    if not batches:
        return []
    got = pa.Table.from_batches(batches).to_pylist()
    return sorted((r["k"], r["n"], r["total"], r["top"]) for r in got)


def count_operator(size, slide, index=0, parallelism=1):
    from raystream.engine.windows.count import CountWindowOperator
    op = CountWindowOperator("c", KeySelector.of("k"), size=size, slide=slide,
                             spec=AggregateSpec.of(COUNTS))
    op.setup(RuntimeContext("job", "c", index, parallelism, 128, 0), CollectingOutput())
    return op


def batches_of(df: pd.DataFrame, sizes) -> list[pa.RecordBatch]:
    out, i = [], 0
    for n in sizes:
        if i >= len(df):
            break
        out.append(pa.RecordBatch.from_pandas(df.iloc[i:i + n], preserve_index=False))
        i += n
    return out


@pytest.mark.parametrize("size,slide", [(5, None), (4, 1), (6, 4), (3, 5)])
def test_count_windows_equal_pandas_and_survive_a_restore_at_other_parallelism(size, slide):
    rng = np.random.default_rng(size * 10 + (slide or 0))
    df = pd.DataFrame({"k": rng.integers(0, 30, 1200), "x": rng.integers(0, 100, 1200)})
    sizes = rng.integers(1, 60, 200).tolist()
    batches = batches_of(df, sizes)
    whole = count_operator(size, slide)
    whole.initialize_state(None)
    for batch in batches:
        whole.process_batch(batch)
    assert count_rows(whole.output.batches) == count_oracle(df, size, slide)

    # snapshot after half the batches; the rest changes state before the async part runs
    half = len(batches) // 2
    first = count_operator(size, slide)
    first.initialize_state(None)
    for batch in batches[:half]:
        first.process_batch(batch)
    before = count_rows(first.output.batches)
    snapshot = first.snapshot_state(1).keyed_state
    for batch in batches[half:]:
        first.process_batch(batch)
    sections = snapshot()
    assert count_rows(first.output.batches) == count_oracle(df, size, slide)
    expected_after = count_rows(first.output.batches)
    for row in before:
        expected_after.remove(row)
    rest = pa.Table.from_batches(batches[half:])
    for parallelism in (1, 2, 3):
        got = []
        for index in range(parallelism):
            op = count_operator(size, slide, index, parallelism)
            groups = rs.key_group_range(index, parallelism, 128)
            op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                      if g in groups], None))
            mine = np.array([rs.key_group_of(k, 128) in groups
                             for k in rest["k"].to_pylist()], dtype=bool)
            for batch in rest.filter(pa.array(mine)).to_batches(max_chunksize=37):
                op.process_batch(batch)
            got += count_rows(op.output.batches)
        assert sorted(got) == expected_after, parallelism


# -- real jobs on Ray -------------------------------------------------------------------
BASE = 1_700_000_000_000


def events(i: np.ndarray) -> dict:
    jitter = (i * 7919) % 400  # out of order by up to 400 ms (the bound is 500: none late)
    return {"user": i % 13, "ts": BASE + i * 3 - jitter, "x": (i % 11).astype(np.float64)}


@pytest.mark.slow
def test_chained_windows_and_window_all_job_equal_pandas(ray_session):
    n = 20_000
    env = rs.StreamEnvironment(parallelism=2)
    src = env.from_sequence(n, events, watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    per_second = src.key_by("user").window(rs.TumblingEventTimeWindows(1000),
                                           timestamp="ts").agg(n=("count", None),
                                                               total=("sum", "x"))
    assert per_second.default_timestamp == rs.WINDOW_TIME
    per_five = per_second.key_by("user").window(rs.TumblingEventTimeWindows(5000)).agg(
        n=("sum", "n"), total=("sum", "total"))
    everyone = per_second.window_all(rs.TumblingEventTimeWindows(5000)).agg(
        n=("sum", "n"), busiest=("max_by", ("user", "n")), top=("top_k", ("n", 3)))
    assert everyone.transformation.parallelism == 1
    sinks = per_five.collect(), everyone.collect()
    job = env.execute("chained-windows")

    df = pd.DataFrame(events(np.arange(n)))
    df["w"] = (df["ts"] // 5000) * 5000
    expected = df.groupby(["user", "w"]).agg(n=("x", "size"), total=("x", "sum")).reset_index()
    got = job.table(sinks[0]).to_pandas().sort_values(["user", "window_start"])
    pd.testing.assert_frame_equal(
        got[["user", "window_start", "n", "total"]].reset_index(drop=True),
        expected.rename(columns={"w": "window_start"}), check_dtype=False)
    got_all = job.table(sinks[1]).to_pandas().sort_values("window_start")
    assert list(got_all.columns) == ["window_start", "window_end", "n", "busiest", "top"]
    assert got_all["n"].tolist() == df.groupby("w").size().tolist()
    # per 5 s: the user with the most records in one second (ties: the smallest user)
    seconds = df.assign(s=df["ts"] // 1000).groupby(["w", "user", "s"]).size().rename(
        "n").reset_index()
    best = seconds[seconds["n"] == seconds.groupby("w")["n"].transform("max")]
    assert got_all["busiest"].tolist() == best.groupby("w")["user"].min().tolist()
    assert [list(t) for t in got_all["top"]] == [
        sorted(g.tolist(), reverse=True)[:3] for _, g in seconds.groupby("w")["n"]]


@pytest.mark.slow
def test_count_window_job_fires_every_size_records_per_key(ray_session):
    """On Ray (parallelism 2, so a key's records may interleave from two source
    subtasks): order-free facts against pandas — per key, count // size windows of
    size records each, and sliding windows every slide records."""
    n, size = 5000, 7
    env = rs.StreamEnvironment(parallelism=2)
    src = env.from_sequence(n, events)
    tumbling = src.key_by("user").count_window(size).agg(n=("count", None), total=("sum", "x"))
    sliding = src.key_by("user").count_window(size, slide=3).count()
    sinks = tumbling.collect(), sliding.collect()
    job = env.execute("count-windows")
    per_key = pd.DataFrame(events(np.arange(n))).groupby("user").size()
    got = job.table(sinks[0]).to_pandas()
    assert (got["n"] == size).all()
    assert got.groupby("user").size().to_dict() == (per_key // size)[per_key >= size].to_dict()
    slid = job.table(sinks[1]).to_pandas()
    assert slid.groupby("user").size().to_dict() == (per_key // 3).to_dict()
    assert slid["count"].max() == size and slid["count"].min() == 3
