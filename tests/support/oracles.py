"""Oracles: what the engine must compute, from the definitions, in plain Python, numpy
and pandas (never from the code under test): the windows of a timestamp, the rows a
window keeps, sessions, the pairs of interval and window joins, and the exactly-once
running sum."""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd
import pyarrow as pa

import raystream as rs
from tests.chaos.model import session_run
from tests.support.inputs import KEYS, N, SPLITS, STRAGGLER_START, join_events, numbers

# -- windows ----------------------------------------------------------------------------------

def windows_of(assigner, ts: int) -> list[tuple[int, int]]:
    """The windows of one timestamp, from the definitions (not the code under test)."""
    if isinstance(assigner, rs.TumblingEventTimeWindows):
        start = (ts - assigner.offset_ms) // assigner.size_ms * assigner.size_ms + assigner.offset_ms
        return [(start, start + assigner.size_ms)]
    if isinstance(assigner, rs.SlidingEventTimeWindows):
        return [(s, s + assigner.size_ms)
                for s in range(ts - assigner.size_ms + 1, ts + 1)
                if (s - assigner.offset_ms) % assigner.slide_ms == 0]
    if isinstance(assigner, rs.CumulativeEventTimeWindows):  # every end after ts, up to max
        size, step = assigner.max_size_ms, assigner.step_ms
        start = (ts - assigner.offset_ms) // size * size + assigner.offset_ms
        return [(start, end) for end in range(start + step, start + size + 1, step) if end > ts]
    raise TypeError(assigner)


def kept_in_windows(assigner, lateness: int, rows: pd.DataFrame) -> pd.DataFrame:
    """pandas: each of ``rows`` (``ts``, and ``wm`` the watermark it arrived at) once per
    window it belongs to (``window_start``, ``window_end``; its index kept) unless that
    window was past its lateness when the row arrived."""
    exploded = rows.assign(window=[windows_of(assigner, t) for t in rows["ts"].tolist()]
                           ).explode("window")
    exploded["window_start"] = [w[0] for w in exploded["window"]]
    exploded["window_end"] = [w[1] for w in exploded["window"]]
    return exploded.loc[exploded["window_end"] - 1 + lateness > exploded["wm"]]


def aggregates_in_windows(assigner, lateness: int, key, ts, x, arrival
                          ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """pandas: the ``AGGS`` of ``x`` (``n``, ``total``, ``low``, ``high``, ``avg``) per
    (``k``, ``window_start``, ``window_end``) of the rows each window keeps
    (:func:`kept_in_windows`; ``arrival``: the watermark each row arrived at), and the
    rows kept by no window (``k``, ``ts``, ``x``): the late ones."""
    rows = pd.DataFrame({"k": key, "ts": ts, "x": x, "wm": arrival})
    kept = kept_in_windows(assigner, lateness, rows)
    results = kept.groupby(["k", "window_start", "window_end"]).agg(
        n=("x", "size"), total=("x", "sum"), low=("x", "min"), high=("x", "max"),
        avg=("x", "mean")).reset_index()
    late = rows.loc[~rows.index.isin(kept.index), ["k", "ts", "x"]]
    return results, late


def user_window_sums(make, n: int, size: int, slide: int | None = None, keep=None
                     ) -> pd.DataFrame:
    """pandas: the count ``n`` and sum ``total`` of ``x`` per user and event-time window
    (tumbling of ``size``, or sliding by ``slide``) over rows ``make(0..n-1)``, those of
    ``keep`` (a mask) only; sorted, as :func:`user_window_rows` puts a job's output."""
    e = pd.DataFrame(make(np.arange(n)))
    if keep is not None:
        e = e[keep]
    slide = slide or size
    first_start = e["ts"] // slide * slide - size + slide  # each row: its size // slide windows
    e = pd.concat([e.assign(window_start=first_start + j * slide) for j in range(size // slide)])
    return (e.groupby(["user", "window_start"]).agg(n=("x", "size"), total=("x", "sum"))
            .reset_index().sort_values(["user", "window_start"]).reset_index(drop=True))


def user_window_rows(table: pa.Table) -> pd.DataFrame:
    """A window job's output (``user``, ``window_start``, ``n``, ``total``) sorted, to
    compare with :func:`user_window_sums`."""
    return (table.to_pandas()[["user", "window_start", "n", "total"]]
            .sort_values(["user", "window_start"]).reset_index(drop=True))


# -- sessions ---------------------------------------------------------------------------------

WINDOW_KEYS = ["k", "window_start", "window_end"]  # the columns that name a result row


def final_sessions(rows: pd.DataFrame) -> pd.DataFrame:
    """The emitted rows that no later emission replaced: a session that fired again (rows
    within the allowed lateness) replaces its earlier result, which it covers."""
    last = rows.drop_duplicates(["k", "window_start"], keep="last")
    pairs = last.merge(last, on="k", suffixes=("", "_by"))
    covered = pairs[(pairs["window_start_by"] <= pairs["window_start"])
                    & (pairs["window_end_by"] >= pairs["window_end"])
                    & ((pairs["window_start_by"] != pairs["window_start"])
                       | (pairs["window_end_by"] != pairs["window_end"]))]
    gone = pd.MultiIndex.from_frame(covered.loc[:, WINDOW_KEYS])
    return last.loc[~pd.MultiIndex.from_frame(last.loc[:, WINDOW_KEYS]).isin(gone)]


def user_sessions_oracle(rows: pd.DataFrame, kind: str, gap: int) -> pd.DataFrame:
    """pandas: per key, the rows by time, a new session where the time is more than
    ``gap`` after the one before; per session its row count and the value of the user
    function (``kind``): the mean of ``x`` (``Average``) or its spread (``Spread``)."""
    rows = rows.sort_values(["k", "ts"], kind="stable")
    new = (rows["k"] != rows["k"].shift()) | (rows["ts"].diff() > gap)
    grouped = rows.assign(session=new.cumsum()).groupby("session")
    out = pd.DataFrame({"k": grouped["k"].first(), "window_start": grouped["ts"].min(),
                        "window_end": np.asarray(grouped["ts"].max()) + gap,
                        "rows": grouped.size(),
                        "value": (grouped["x"].mean() if kind == "aggregate"
                                  else np.asarray(grouped["x"].max())
                                  - np.asarray(grouped["x"].min()))})
    return out.sort_values(WINDOW_KEYS).reset_index(drop=True)


# -- the interval join ------------------------------------------------------------------------

def interval_oracle(left: pd.DataFrame, right: pd.DataFrame, lower: int, upper: int) -> set:
    """(left id, right id) of every pair with equal keys and right.ts - left.ts in
    [lower, upper] (inclusive)."""
    merged = left.merge(right, on="k", suffixes=("", "_right"))
    gap = merged["ts_right"] - merged["ts"]
    merged = merged[(gap >= lower) & (gap <= upper)]
    return set(zip(merged["id"].tolist(), merged["id_right"].tolist()))


def expected_pairs(n: int, lower: int, upper: int) -> set:
    """The pairs of an interval join over the first ``n`` rows of ``join_events``, its
    minute-late stragglers dropped."""
    frame = pd.DataFrame(join_events(np.arange(n)))
    i = frame["id"].to_numpy()
    on_time = frame[~((i % 400 == 399) & (i > STRAGGLER_START))]
    return interval_oracle(on_time[on_time["side"] == 0], on_time[on_time["side"] == 1],
                           lower, upper)


# -- the window join: windows computed their own way, pandas arithmetic per assigner ----------

def rows_in_windows(frame: pd.DataFrame, assigner) -> pd.DataFrame:
    """``frame`` with columns window_start, window_end: one row per (row, window)."""
    if isinstance(assigner, rs.EventTimeSessionWindows) and "call" in frame:
        return frame.join(fed_sessions(frame, assigner.gap_ms))
    if isinstance(assigner, rs.EventTimeSessionWindows):
        frame = frame.sort_values(["k", "ts"], kind="stable")
        new = (frame["k"] != frame["k"].shift()) | (frame["ts"].diff() > assigner.gap_ms)
        session = new.cumsum()
        grouped = frame["ts"].groupby(session)
        return frame.assign(window_start=grouped.transform("min"),
                            window_end=grouped.transform("max") + assigner.gap_ms)
    slide = getattr(assigner, "slide_ms", assigner.size_ms)
    last = frame["ts"] - frame["ts"] % slide
    parts = []
    for j in range(-(-assigner.size_ms // slide)):
        start = last - j * slide
        part = frame.assign(window_start=start, window_end=start + assigner.size_ms)
        keep = part["window_end"] > part["ts"]
        if "wm" in part:  # a row joins only the windows not yet fired when it came (Flink's)
            keep &= part["window_end"] - 1 > part["wm"]
        parts.append(part[keep])
    return pd.concat(parts)


def _on_time_windows(left: pd.DataFrame, right: pd.DataFrame, assigner
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each side's rows by window (sessions: of both sides' rows together)."""
    if isinstance(assigner, rs.EventTimeSessionWindows):  # sessions of both sides together
        both = rows_in_windows(pd.concat([left.assign(side=0), right.assign(side=1)]), assigner)
        return both[both["side"] == 0], both[both["side"] == 1]
    return rows_in_windows(left, assigner), rows_in_windows(right, assigner)


def oracle_pairs(left: pd.DataFrame, right: pd.DataFrame, assigner) -> set:
    """(left id, right id, window start, window end) of every pair of equal key in a window."""
    lw, rw = _on_time_windows(left, right, assigner)
    merged = lw.merge(rw, on=["k", "window_start", "window_end"], suffixes=("", "_right"))
    return set(zip(merged["id"], merged["id_right"], merged["window_start"],
                   merged["window_end"]))


def oracle_groups(left: pd.DataFrame, right: pd.DataFrame, assigner) -> set:
    """(key, window start, window end, left ids, right ids) per key and window with rows."""
    lw, rw = _on_time_windows(left, right, assigner)
    by = ["k", "window_start", "window_end"]
    ids = [w.groupby(by)["id"].agg(lambda s: tuple(sorted(s))).rename(n)
           for w, n in ((lw, "left"), (rw, "right"))]
    outer = pd.concat(ids, axis=1).reset_index()
    return {(r.k, r.window_start, r.window_end,
             r.left if isinstance(r.left, tuple) else (),
             r.right if isinstance(r.right, tuple) else ()) for r in outer.itertuples()}


def fed_sessions(fed: pd.DataFrame, gap: int) -> pd.DataFrame:
    """The session of each row :func:`tests.support.operators.drive_join` fed (``call``:
    its ``process_batch`` call in order, ``wm``: the watermark then) as the model makes
    them from both sides' rows (lateness 0): columns window_start, window_end (NaN for a
    late row) by the rows' index."""
    ordered = fed.sort_values("call", kind="stable")
    run = session_run(ordered["k"], ordered["ts"], ordered.index, ordered["wm"],
                      ordered["call"], gap, 0)
    found = {row: (start, end) for _, start, end, rows in run.emissions for row in rows}
    return pd.DataFrame([found.get(i, (np.nan, np.nan)) for i in fed.index], index=fed.index,
                        columns=["window_start", "window_end"])


def is_late(ts: pd.Series, assigner, watermark: int) -> pd.Series:
    """The window operator's rule for windows that do not merge: late for every window."""
    slide = getattr(assigner, "slide_ms", assigner.size_ms)
    return ts - ts % slide + assigner.size_ms - 1 <= watermark


def expected_window_pairs(n: int, assigner, fn=None) -> set:
    """The pairs of a window join over the first ``n`` rows of ``join_events``, its
    minute-late stragglers dropped; with ``fn`` (a JoinFunction), those it keeps."""
    frame = pd.DataFrame(join_events(np.arange(n)))
    i = frame["id"].to_numpy()
    on_time = frame[~((i % 400 == 399) & (i > STRAGGLER_START))]
    pairs = oracle_pairs(on_time[on_time["side"] == 0], on_time[on_time["side"] == 1], assigner)
    return pairs if fn is None else {p for p in pairs if fn({"id": p[0]}, {"id": p[1]})}


# -- the exactly-once job ---------------------------------------------------------------------

def assert_exactly_once(table: pa.Table) -> None:
    """The running sums of the exactly-once job over all of ``numbers``: for every key,
    the updates are numbered 1..count exactly once (nothing lost or doubled), each
    update's sum is the previous one plus exactly one input of that key, and within a
    key the inputs of each source split are applied in split order (no reordering)."""
    index = np.arange(N)
    keys, values = numbers(index)["k"], numbers(index)["v"]
    split_of = index // (N // SPLITS)
    updates = collections.defaultdict(list)
    for k, v, i, n in zip(*(table.column(c).to_pylist() for c in ("k", "v", "i", "n"))):
        updates[k].append((n, v, i))
    assert sorted(updates) == list(range(KEYS))
    for key, rows in updates.items():
        rows.sort()
        expected_count = int((keys == key).sum())
        assert [n for n, _, _ in rows] == list(range(1, expected_count + 1)), f"key {key}"
        sums = np.array([v for _, v, _ in rows])
        applied = np.diff(sums, prepend=0)
        last_index = np.array([i for _, _, i in rows])
        assert np.array_equal(applied, values[last_index]), f"key {key}: a sum skipped an input"
        assert np.array_equal(np.sort(last_index), np.flatnonzero(keys == key)), f"key {key}"
        for split in range(SPLITS):
            in_split = last_index[split_of[last_index] == split]
            assert np.all(np.diff(in_split) > 0), f"key {key}, split {split}: reordered"
