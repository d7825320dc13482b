"""Distinct counts in SQL's window aggregations: Nexmark q15's select list (its distinct
counts with FILTER clauses) per channel in TUMBLE windows of bids with disorder, rows an
hour late, NULL channels and NULL bidders, against pandas, on both state backends and
through a kill; and what a distinct aggregate refuses at planning."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from tests.support.jobs import disk_env
from tests.support.nexmark_sql import QUERIES, ms, rows
from tests.support.pacing import Throttle

BOUND_MS = 1_000
HOUR = 3_600_000


def bids_input(seed: int = 5, n: int = 4_000) -> pd.DataFrame:
    """Bids over 60 s, out of order within BOUND_MS; a few an hour late (late for every
    window whatever the batches), NULL channels and bidders among them."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 60_000, n)) + HOUR + rng.integers(-BOUND_MS // 2, BOUND_MS // 2, n)
    late = rng.random(n) < 0.02
    # (the watermark has passed an hour by then on every channel into the windows: the
    # source's second subtask, which reads no split, has ended long before)
    late[:n // 2] = False
    bidder = pd.array(rng.integers(0, 40, n), dtype="Int64")
    bidder[rng.random(n) < 0.05] = pd.NA
    return pd.DataFrame({
        "channel": rng.choice(["web", "app", None], n, p=[.5, .4, .1]),
        "bidder": bidder, "auction": rng.integers(0, 25, n).astype(np.int64),
        "price": (10 ** rng.uniform(2, 7, n)).astype(np.int64),
        "ts": np.where(late, ts - HOUR, ts).astype(np.int64), "late": late})


def bids_view(env: rs.StreamEnvironment, df: pd.DataFrame, seconds_per_batch: float) -> None:
    table = pa.table({"channel": pa.array(df["channel"], pa.string()),
                      "bidder": pa.array(df["bidder"], pa.int64()),
                      "auction": pa.array(df["auction"], pa.int64()),
                      "price": pa.array(df["price"], pa.int64()),
                      "dateTime": pa.array(df["ts"], pa.timestamp("ms"))})
    stream = env.from_arrow(table, batch_size=50, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("dateTime", bound_ms=BOUND_MS))
    if seconds_per_batch:  # (the job runs past a few checkpoints, and a kill)
        stream = stream.map_batches(Throttle(seconds_per_batch), name="throttle")
    env.create_temporary_view("bid", stream, schema=table.schema, rowtime="dateTime")


RANKS = {"rank1": "price < 10000", "rank2": "price >= 10000 and price < 1000000",
         "rank3": "price >= 1000000"}


def q15_in_windows() -> str:
    """q15's select list as published (tests/sql/nexmark/q15.sql) per channel and 10 s
    window instead of per day (q15's GROUP BY DATE_FORMAT(...) has no window: an
    updating result), with a MAX and a filtered SUM beside its distinct counts."""
    text = (QUERIES / "q15.sql").read_text()
    counts = text[text.index("count(*) AS total_bids"):text.index("FROM bid")].rstrip()
    return f"""INSERT INTO q15
SELECT channel, window_start, {counts},
     max(price) AS top, sum(price) filter (where bidder is null) AS anonymous
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY channel, window_start, window_end"""


COLUMNS = ["channel", "window_start", "total_bids", *(f"{r}_bids" for r in RANKS),
           "total_bidders", *(f"{r}_bidders" for r in RANKS), "total_auctions",
           *(f"{r}_auctions" for r in RANKS), "top", "anonymous"]


def oracle(df: pd.DataFrame) -> pd.DataFrame:
    b = df[~df["late"]].assign(window_start=lambda d: d["ts"] // 10_000 * 10_000)
    masks = {"total": pd.Series(True, index=b.index),
             **{r: b.eval(c.replace("and", "&")) for r, c in RANKS.items()}}
    g = b.groupby(["channel", "window_start"], dropna=False)
    out = pd.DataFrame({
        **{f"{r}_bids": g["price"].apply(lambda s, m=m: int(m[s.index].sum())) for r, m in masks.items()},
        **{f"{r}_{what}s": g[what].apply(lambda s, m=m: s[m[s.index]].nunique())
           for what in ("bidder", "auction") for r, m in masks.items()},
        "top": g["price"].max(),
        "anonymous": g.apply(lambda d: int(d["price"][d["bidder"].isna()].sum()),
                             include_groups=False),
    }).reset_index()
    out["channel"] = out["channel"].astype(object).where(out["channel"].notna(), None)
    out["window_start"] = ms(out["window_start"])
    return out[COLUMNS]


@pytest.mark.parametrize("backend, killed", [("heap", False), ("disk", True)])
def test_q15s_distinct_counts_with_filters_per_tumble_window_equal_pandas(
        ray_session, tmp_path, backend, killed):
    """``killed``: the process of the first of the two window aggregations exits in its
    second snapshot (as after a SIGKILL), then the second's as it restores."""
    df = bids_input()
    failpoints = [rs.Failpoint("in_snapshot", operator="q15.window", subtask=0, hit=2),
                  rs.Failpoint("right_after_restore", operator="q15.window-2", subtask=1,
                               attempt=1)] if killed else []
    env = disk_env(str(tmp_path / "chk")) if backend == "disk" else rs.StreamEnvironment(
        parallelism=2)
    env.failpoints = tuple(failpoints)
    bids_view(env, df, 0.01)
    columns = ", ".join(f"{c} BIGINT" for c in COLUMNS[2:])
    env.sql(f"CREATE TABLE q15 (channel STRING, window_start TIMESTAMP(3), {columns}) "
            f"WITH ('connector' = 'collect')")
    sink = env.sql(q15_in_windows())["q15"]
    result = env.execute("sql-q15-windows")
    assert result.restarts == (2 if killed else 0)
    expected = oracle(df)
    assert df["late"].sum() > 10
    assert (expected["rank3_bidders"] > 0).any() and len(expected) > 12
    assert rows(result.table(sink)) == rows(expected)


def test_the_plan_of_a_distinct_count_is_two_window_aggregations_over_an_expand():
    env = rs.StreamEnvironment()
    bids_view(env, bids_input(n=10), 0)
    plan = env.sql_query(q15_in_windows().split("INSERT INTO q15")[1]).explain()
    windows = re.findall(r"WindowAggregate\(groupBy=\[([^]]*)\], window=\[(\w+)", plan)
    assert windows == [("channel", "WINDOWED"), ("channel, __v0, __v1", "TUMBLE")]
    assert plan.count("Expand(") == 1


@pytest.mark.parametrize("statement, message", [
    ("SELECT SUM(DISTINCT price) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), "
     "INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
     "SUM(DISTINCT price): SUM(DISTINCT ...) is not in raystream's SQL yet"),
    ("SELECT COUNT(DISTINCT bidder), AVG(price) FROM TABLE(TUMBLE(TABLE bid, "
     "DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
     "AVG(price): AVG beside a distinct count is not in raystream's SQL yet"),
    ("SELECT COUNT(DISTINCT bidder) FROM TABLE(SESSION(TABLE bid PARTITION BY channel, "
     "DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) GROUP BY channel, window_start, window_end",
     "a distinct count in SESSION windows is not in raystream's SQL yet"),
])
def test_a_distinct_aggregate_that_cannot_run_is_refused_at_planning(statement, message):
    env = rs.StreamEnvironment()
    bids_view(env, bids_input(n=10), 0)
    with pytest.raises(rs.SqlError, match=re.escape(message)):
        env.sql_query(statement)
