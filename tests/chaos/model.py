"""The input of the failure harness and an independent numpy model of what jobs make of it.

One reader (one split, source parallelism 1) emits batches of ``batch`` rows
and a watermark after each, so the watermark every row meets downstream is
known exactly, and with it which rows are late, which update a window that
already fired, and so the exact list of emissions per (key, window). Batch
maxima only grow (disorder is under a batch's time span), so a reader that
resumes from a checkpoint emits the same watermarks as one that never stopped.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import pandas as pd

import raystream as rs

BASE = 1_700_000_000_000


@dataclass(frozen=True)
class Events:
    """``n`` rows, 2 ms apart, out of order by less than ``bound_ms``; one row in
    ``late_every`` (after the first ``on_time_prefix``) arrives 3 to 4.6 s late."""

    n: int = 20_000
    batch: int = 500
    bound_ms: int = 300
    keys: int = 23
    late_every: int = 100
    on_time_prefix: int = 2000
    string_keys: bool = False

    def __post_init__(self) -> None:
        if self.n % self.batch:
            raise ValueError("n must be a multiple of batch")

    def columns(self, i: np.ndarray) -> dict:
        disorder = (i * 7919) % 200
        late = (i % self.late_every == 37 % self.late_every) & (i > self.on_time_prefix)
        user = i % self.keys
        return {"user": np.char.add("u", user.astype(str)) if self.string_keys else user,
                "ts": BASE + i * 2 - disorder - np.where(late, 3000 + i % 3 * 800, 0),
                "x": (i % 11).astype(np.float64)}

    def all(self) -> dict:
        return self.columns(np.arange(self.n))

    def watermark_seen(self) -> np.ndarray:
        """The watermark each row meets: the one the reader emitted after the batch before."""
        return watermarks_before(self.all()["ts"], self.batch, self.bound_ms)


def window_starts(assigner, ts: np.ndarray) -> list[np.ndarray]:
    """Per window a row belongs to, every row's window start (from the definitions)."""
    if isinstance(assigner, rs.TumblingEventTimeWindows):
        return [ts // assigner.size_ms * assigner.size_ms]
    last = ts // assigner.slide_ms * assigner.slide_ms
    return [last - k * assigner.slide_ms for k in range(assigner.size_ms // assigner.slide_ms)]


Emissions = dict[tuple, list[tuple]]  # (key, window start) -> sorted (count, sum, ...)


def window_emissions(events: Events, assigner, lateness: int) -> tuple[Emissions, list]:
    """Every emission per (key, window) of a count-and-sum window, and the rows late for
    every window they belong to, as (key, ts)."""
    e = events.all()
    wm = events.watermark_seen()
    user, ts, x = e["user"], e["ts"], e["x"]
    batch = np.arange(events.n) // events.batch
    kept_anywhere = np.zeros(len(ts), dtype=bool)
    per = collections.defaultdict(list)  # (user, window start) -> [(fired, batch, x)]
    for starts in window_starts(assigner, ts):
        end = starts + assigner.size_ms
        late = end - 1 + lateness <= wm
        fired = end - 1 <= wm  # the window fired before this row arrived
        kept_anywhere |= ~late
        for u, s, f, b, v in zip(*(a[~late].tolist() for a in (user, starts, fired, batch, x))):
            per[(u, s)].append((f, b, v))
    emissions: Emissions = {}
    for window, items in per.items():
        # on time: one emission when the watermark passes the end; then one re-firing
        # per batch that brought rows within the allowed lateness
        on_time = [v for f, _, v in items if not f]
        out = [(len(on_time), sum(on_time))] if on_time else []
        count, total = len(on_time), sum(on_time)
        for b in sorted({b for f, b, _ in items if f}):
            more = [v for f, bb, v in items if f and bb == b]
            count, total = count + len(more), total + sum(more)
            out.append((count, total))
        emissions[window] = sorted(out)
    late_rows = sorted(zip(user[~kept_anywhere].tolist(), ts[~kept_anywhere].tolist()))
    return emissions, late_rows


def count_trigger_emissions(events: Events, size_ms: int, lateness: int, count: int,
                            purging: bool) -> Emissions:
    """Every emission per (key, tumbling window) of a count-and-sum window fired by a count
    trigger: each ``count`` rows the window took in, in the input's order (rows of a window
    whose cleanup time ``end - 1 + lateness`` the watermark has passed are dropped), it
    emits the rows since it last fired (``purging``) or all so far; rows short of the next
    count are never emitted."""
    e = events.all()
    wm = events.watermark_seen()
    starts = e["ts"] // size_ms * size_ms
    kept = ~(starts + size_ms - 1 + lateness <= wm)
    per = collections.defaultdict(list)  # (user, window start) -> values in arrival order
    for u, s, v in zip(*(a[kept].tolist() for a in (e["user"], starts, e["x"]))):
        per[(u, s)].append(v)
    emissions: Emissions = {}
    for window, values in per.items():
        fired = len(values) // count
        if not fired:
            continue
        emissions[window] = sorted(
            (count, sum(values[k * count:(k + 1) * count])) if purging else
            ((k + 1) * count, sum(values[:(k + 1) * count])) for k in range(fired))
    return emissions


def emissions_of(rows: list[dict]) -> Emissions:
    got = collections.defaultdict(list)
    for r in rows:
        got[(r["user"], r["window_start"])].append((r["n"], r["total"]))
    return {w: sorted(v) for w, v in got.items()}


def emission_differences(got: Emissions, expected: Emissions) -> list[str]:
    out = []
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    if missing:
        out.append(f"{len(missing)} windows never emitted, e.g. {sorted(missing)[:3]}")
    if extra:
        out.append(f"{len(extra)} windows emitted that should not be, e.g. "
                   f"{[(w, got[w]) for w in sorted(extra)[:3]]}")
    wrong = [w for w in expected if w in got and got[w] != expected[w]]
    if wrong:
        out.append(f"{len(wrong)} windows emitted differently (got, expected), e.g. "
                   f"{[(w, got[w], expected[w]) for w in wrong[:3]]}")
    return out


class CountAndSum:
    """A user ``AggregateFunction`` (the generic window path) computing what
    ``agg(n=("count", None), total=("sum", "x"))`` does."""

    def create_accumulator(self):
        return [0, 0.0]

    def add(self, value, accumulator):
        accumulator[0] += 1
        accumulator[1] += value["x"]
        return accumulator

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]

    def get_result(self, accumulator):
        return {"n": accumulator[0], "total": accumulator[1]}


def watermarks_before(ts: np.ndarray, batch: int, bound_ms: int) -> np.ndarray:
    """The watermark each row of one reader meets (as :meth:`Events.watermark_seen`)."""
    batch_max = np.maximum.accumulate(ts.reshape(-1, batch).max(axis=1))
    before = np.concatenate([[rs.MIN_WATERMARK], batch_max[:-1] - bound_ms - 1])
    return np.repeat(before, batch)


def window_join_emissions(events: Events, left: dict, right: dict, gap_ms: int | None,
                          size_ms: int = 1000) -> Emissions:
    """The window join of ``left`` and ``right`` (columns user, ts and x or y, each the
    rows of one reader in order) per key and window, its pairs counted per (key, window
    of ``size_ms`` by their event time ``window_end - 1``) downstream: per such window,
    [(pairs, sum of the right rows' y over the pairs, earliest join window start, latest
    join window end)].

    Join windows: tumbling ones of ``size_ms`` when ``gap_ms`` is None; else sessions,
    made by the rows of *both* sides of a key: sorted by time, a row more than
    ``gap_ms`` after the one before starts a new one, ``[first ts, last ts + gap)``
    (docs/joins.md). A window pairs every left row of the key in it with every right one.

    Late rows (docs/joins.md: a row whose tumbling window ends at or before the join's
    watermark is dropped; a row whose own session window ``[ts, ts + gap)`` does is
    dropped unless it meets a session that has not fired) would depend on timing:
    the join's watermark is the minimum of its two inputs', not replayable. So the
    model takes only inputs where no row can be late, nor touch a session that fired
    before it came (which would then start a new one): every row more than one ms past
    the watermark its own reader sent before it, which bounds the join's. It raises
    ValueError otherwise."""
    sides = []
    for side, columns in enumerate((left, right)):
        ts = np.asarray(columns["ts"])
        seen = watermarks_before(ts, events.batch, events.bound_ms)
        if not (ts > seen + 1).all():
            raise ValueError(f"input {side}: {(ts <= seen + 1).sum()} rows may be late or meet "
                             f"a fired session: not replayable in a two-input job")
        sides.append(pd.DataFrame({"user": columns["user"], "ts": ts, "left": 1 - side,
                                   "right": side, "y": columns["y"] if side else 0.0}))
    rows = pd.concat(sides, ignore_index=True).sort_values(["user", "ts"], kind="stable")
    if gap_ms is None:
        rows["window"] = rows["ts"] // size_ms
    else:  # a row more than the gap after the key's row before starts a session
        rows["window"] = ((rows["user"] != rows["user"].shift())
                          | (rows["ts"].diff() > gap_ms)).cumsum()
    windows = rows.groupby(["user", "window"]).agg(
        first_ts=("ts", "min"), last_ts=("ts", "max"), n_left=("left", "sum"),
        n_right=("right", "sum"), y_right=("y", "sum")).reset_index()
    if gap_ms is None:
        windows["start"] = windows["window"] * size_ms
        windows["end"] = windows["start"] + size_ms
    else:
        windows["start"] = windows["first_ts"]
        windows["end"] = windows["last_ts"] + gap_ms
    windows["pairs"] = windows["n_left"] * windows["n_right"]
    windows["total"] = windows["n_left"] * windows["y_right"]
    windows = windows[windows["pairs"] > 0]
    # downstream: the pairs' event time is their window's end - 1
    windows["downstream"] = (windows["end"] - 1) // size_ms * size_ms
    per = windows.groupby(["user", "downstream"]).agg(
        n=("pairs", "sum"), total=("total", "sum"), first=("start", "min"),
        last=("end", "max")).reset_index()
    return {(u, w): [(n, t, f, last)] for u, w, n, t, f, last in zip(
        per["user"].tolist(), per["downstream"].tolist(), per["n"].tolist(),
        per["total"].astype(float).tolist(), per["first"].tolist(), per["last"].tolist())}


@dataclass(frozen=True)
class SessionRun:
    """What a session window makes of batches of rows (:func:`session_run`): every
    emission, in order, as (key, start, end, values of its rows), and the late rows as
    (key, ts, value)."""

    emissions: list[tuple]
    late: list[tuple]


def session_run(keys, ts, values, arrival, batch, gap, lateness: int) -> SessionRun:
    """Plain Python, row by row, from the rule (docs/concepts.md): the rows in order, in
    batches of ``batch`` rows (or, a sequence, each row's batch number: a batch is a run of
    equal ones), ``arrival`` the watermark each row meets (the same within a batch; the one
    after the last batch is ``MAX_WATERMARK``). A session window join is one with lateness
    0 over both sides' rows. ``gap``: one gap for every row, or each row's own (dynamic
    gaps: a row's own window is ``[ts, ts + its gap)``).

    Per batch: the rows whose own window ``[ts, ts + gap)`` is not late (``ts + gap - 1 +
    lateness > watermark``) merge with their key's open sessions (windows that intersect
    or touch merge); then each other row is kept if its window intersects (or touches) one
    of its key's sessions that is not late (``end - 1 + lateness > watermark``) as they are
    now, and merges like the others; the rest are late. A session that took in rows and
    has ``end - 1 <= watermark`` (it fired) emits again. Then the watermark advances:
    sessions with ``end - 1`` up to it fire, those with ``end - 1 + lateness`` up to it
    are gone."""
    sessions: dict = collections.defaultdict(list)  # key -> [[start, end, values], ...]
    emissions, late = [], []

    def merge(key, start: int, end: int, taken: list) -> list:
        mine = sessions[key]
        touching = [s for s in mine if s[0] <= end and s[1] >= start]
        for s in touching:
            mine.remove(s)
            start, end, taken = min(start, s[0]), max(end, s[1]), s[2] + taken
        session = [start, end, taken]
        mine.append(session)
        return session

    rows = list(zip(np.asarray(keys).tolist(), np.asarray(ts).tolist(),
                    np.asarray(values).tolist(), np.asarray(arrival).tolist()))
    gaps = np.broadcast_to(np.asarray(gap), len(rows)).tolist()
    numbers = (np.arange(len(rows)) // batch if isinstance(batch, int)
               else np.asarray(batch)).tolist()
    edges = [at for at in range(len(rows)) if at == 0 or numbers[at] != numbers[at - 1]]
    for at, stop in zip(edges, edges[1:] + [len(rows)]):
        part = [(*row, g) for row, g in zip(rows[at:stop], gaps[at:stop])]
        wm = part[0][3]
        after = rows[stop][3] if stop < len(rows) else rs.MAX_WATERMARK
        received = []
        for key, t, v, _, g in part:
            if t + g - 1 + lateness > wm:
                received.append((key, merge(key, t, t + g, [v])))
        judged = [(key, t, v, g, any(s[1] - 1 + lateness > wm and s[0] <= t + g and s[1] >= t
                                     for s in sessions[key]))
                  for key, t, v, _, g in part if t + g - 1 + lateness <= wm]
        for key, t, v, g, kept in judged:
            if kept:
                received.append((key, merge(key, t, t + g, [v])))
            else:
                late.append((key, t, v))
        refired = []
        for key, session in received:  # the sessions as they are after the batch
            if (any(s is session for s in sessions[key]) and session[1] - 1 <= wm
                    and not any(s is session for _, s in refired)):
                refired.append((key, session))
        emissions += [(key, s[0], s[1], list(s[2])) for key, s in refired]
        if after > wm:
            for key, mine in sessions.items():
                for s in sorted(mine):
                    if wm < s[1] - 1 <= after:
                        emissions.append((key, s[0], s[1], list(s[2])))
                mine[:] = [s for s in mine if s[1] - 1 + lateness > after]
    return SessionRun(emissions, late)
