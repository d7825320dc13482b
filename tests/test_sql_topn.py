"""Window Top-N in SQL: ROW_NUMBER() over a window table function's rows and over a
window aggregation's, per window (and channel), against pandas over bids with disorder,
rows an hour late, NULL channels and ties; and what a Top-N refuses at planning."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from tests.support.nexmark_sql import ms, rows
from tests.test_sql_aggregates import bids_input, bids_view

TVF = "TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))"


def ranked(df: pd.DataFrame, by: list[str], descending: list[bool], partition: list[str],
           n: int) -> pd.DataFrame:
    """The first ``n`` rows of each partition by ``by``, ties by the other columns in
    order (ascending, NULLs last), numbered ``rn`` from 1."""
    ties = [c for c in df.columns if c not in by]
    df = df.sort_values([*by, *ties], ascending=[not d for d in descending] + [True] * len(ties),
                        na_position="last", kind="stable")
    df = df.groupby(partition, dropna=False, sort=False).head(n)
    return df.assign(rn=df.groupby(partition, dropna=False, sort=False).cumcount() + 1)


def test_window_top_n_over_a_window_tvf_and_over_a_window_aggregation_equal_pandas(ray_session):
    df = bids_input()
    env = rs.StreamEnvironment(parallelism=2)
    bids_view(env, df, 0.01)
    # by auction (25 values: many ties, broken by the other columns), per channel
    per_channel = env.sql_query(f"""
        SELECT channel, bidder, auction, price, `dateTime`, window_start, rn FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, channel
                                       ORDER BY auction DESC) AS rn
          FROM {TVF} WHERE price > 1000) WHERE rn <= 3""")
    assert "WindowRank(rankType=[ROW_NUMBER], rankRange=[rankStart=1, rankEnd=3], " \
        "partitionBy=[channel], orderBy=[auction DESC], window=[TUMBLE(" in per_channel.explain()
    # the auctions with the most bids per window (Flink's form: the rank in the SELECT of
    # the aggregation), with the row number left out
    hottest = env.sql_query(f"""
        SELECT channel, auction, n, window_start FROM (
          SELECT channel, auction, COUNT(*) AS n, window_start, window_end,
                 ROW_NUMBER() OVER (PARTITION BY window_start, window_end
                                    ORDER BY COUNT(*) DESC) AS rownum
          FROM {TVF} GROUP BY channel, auction, window_start, window_end)
        WHERE rownum < 3 AND n > 1""")
    sinks = [t.to_stream().collect() for t in (per_channel, hottest)]
    result = env.execute("sql-window-top-n")

    b = df[~df["late"]].assign(window_start=lambda d: d["ts"] // 10_000 * 10_000)
    top = ranked(b[b["price"] > 1000][["channel", "bidder", "auction", "price", "ts",
                                       "window_start"]],
                 ["auction"], [True], ["window_start", "channel"], 3)
    assert (top.duplicated(["window_start", "channel", "auction"])).any()  # (ties ranked)
    expected = pd.DataFrame({
        "channel": top["channel"].astype(object).where(top["channel"].notna(), None),
        "bidder": top["bidder"], "auction": top["auction"], "price": top["price"],
        "dateTime": ms(top["ts"]), "window_start": ms(top["window_start"]),
        "rn": top["rn"].astype(np.int64)})
    assert rows(result.table(sinks[0])) == rows(expected)

    counts = b.groupby(["channel", "auction", "window_start"], dropna=False).size().rename(
        "n").reset_index()
    counts = counts.assign(window_end=counts["window_start"] + 10_000)
    top = ranked(counts, ["n"], [True], ["window_start"], 2)
    top = top[top["n"] > 1]
    assert len(top) > 6
    expected = pd.DataFrame({
        "channel": top["channel"].astype(object).where(top["channel"].notna(), None),
        "auction": top["auction"], "n": top["n"].astype(np.int64),
        "window_start": ms(top["window_start"])})
    assert rows(result.table(sinks[1])) == rows(expected)


@pytest.mark.parametrize("statement, message", [
    (f"SELECT * FROM (SELECT *, RANK() OVER (PARTITION BY window_start, window_end "
     f"ORDER BY price) AS r FROM {TVF}) WHERE r <= 3", "ranks with ROW_NUMBER() only"),
    (f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY channel ORDER BY price) "
     f"AS r FROM {TVF}) WHERE r <= 3", "a window Top-N is PARTITION BY window_start, window_end"),
    (f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end "
     f"ORDER BY price) AS r FROM {TVF}) WHERE price > 3", "bound it in the outer WHERE (r <= N)"),
    ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY channel ORDER BY price) AS r "
     "FROM bid) WHERE r <= 3", "an updating Top-N is not there yet"),
    (f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end "
     f"ORDER BY price) AS r FROM {TVF}) WHERE r = 2", "a Top-N keeps the first rows"),
])
def test_a_top_n_that_cannot_run_is_refused_at_planning(statement, message):
    env = rs.StreamEnvironment()
    bids_view(env, bids_input(n=10), 0)
    with pytest.raises(rs.SqlError, match=re.escape(message)):
        env.sql_query(statement)
