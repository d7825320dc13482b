"""The datagen connector: sequences exact, random values within their bounds, the row
count of number-of-rows, a watermarked datagen table through a TUMBLE count (with rows
beyond the watermark bound) against pandas through a kill and a restore, and its
option errors."""

from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from tests.support.nexmark_sql import ms, rows


def test_sequences_are_exact_and_random_values_within_their_bounds(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    before = int(time.time() * 1000)
    env.sql("""CREATE TABLE g (id BIGINT, code STRING, score INT, price DOUBLE, name STRING,
                               flag BOOLEAN, ts TIMESTAMP(3))
        WITH ('connector' = 'datagen', 'rows-per-second' = '100000', 'number-of-rows' = '9000',
              'fields.id.kind' = 'sequence', 'fields.id.start' = '-5', 'fields.id.end' = '4994',
              'fields.code.kind' = 'sequence', 'fields.code.start' = '100',
              'fields.code.end' = '90000',
              'fields.score.min' = '10', 'fields.score.max' = '20',
              'fields.price.min' = '1.5', 'fields.price.max' = '2.5',
              'fields.name.length' = '7', 'fields.ts.max-past' = '5 s')""")
    env.sql("""CREATE TABLE r (n BIGINT, k INT) WITH ('connector' = 'datagen',
              'number-of-rows' = '1234', 'fields.k.min' = '-3', 'fields.k.max' = '3')""")
    every = env.sql_query("SELECT * FROM g").to_stream().collect()
    counted = env.sql_query("SELECT k FROM r").to_stream().collect()
    result = env.execute("sql-datagen")
    after = int(time.time() * 1000)
    got = result.table(every).to_pandas()
    # (bounded by the first of number-of-rows and the sequences to end)
    assert sorted(got["id"]) == list(range(-5, 4995))
    assert sorted(got["code"].astype(int)) == list(range(100, 5100))
    assert got["score"].between(10, 20).all() and got["score"].nunique() == 11
    assert got["price"].between(1.5, 2.5).all() and got["price"].nunique() > 4_000
    assert got["name"].str.fullmatch(r"[A-Za-z0-9]{7}").all() and got["name"].nunique() > 4_900
    assert 0.4 < got["flag"].mean() < 0.6
    stamps = got["ts"].astype("datetime64[ms]").astype("int64")
    assert ((stamps >= before - 5_000) & (stamps <= after)).all() and stamps.nunique() > 1_000
    k = result.table(counted).column("k").to_numpy()
    assert len(k) == 1234 and set(k) == set(range(-3, 4))


N = 10_000
# ts: id * 10 ms plus up to 300 ms of disorder (within the 1 s watermark delay). No row
# beyond it: at p=2 the window's watermark at a row is the least of two channels' and,
# after the restore, the restored floor while a channel lags, so which late rows count
# would depend on timing (tests/test_sql_cumulate.py has late rows, at p=1)
DDL = """CREATE TABLE ev (id BIGINT, k INT,
    ts AS CAST(id * 10 + k * 100 AS TIMESTAMP(3)),
    WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('connector' = 'datagen', 'rows-per-second' = '20000',
        'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'fields.id.end' = '9999',
        'fields.k.min' = '0', 'fields.k.max' = '3')"""


def test_a_watermarked_datagen_table_through_a_tumble_count_equals_pandas_through_a_kill(
        ray_session, tmp_path):
    """The window's process exits in its second snapshot, as after a SIGKILL: the
    sources restore their sequence positions, and every row is counted once."""
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=[rs.Failpoint("in_snapshot", operator="counts.window",
                                                subtask=0, hit=2)],
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    env.sql(DDL)
    env.sql("CREATE TABLE raw (id BIGINT, k INT) WITH ('connector' = 'collect')")
    env.sql("CREATE TABLE counts (k INT, n BIGINT, window_start TIMESTAMP(3)) "
            "WITH ('connector' = 'collect')")
    sinks = env.sql("""EXECUTE STATEMENT SET BEGIN
        INSERT INTO raw SELECT id, k FROM ev;
        INSERT INTO counts SELECT k, COUNT(*), window_start
          FROM TABLE(TUMBLE(TABLE ev, DESCRIPTOR(ts), INTERVAL '5' SECOND))
          GROUP BY k, window_start, window_end;
        END""")
    result = env.execute("sql-datagen-windows")
    assert result.restarts == 1
    raw = result.table(sinks["raw"]).to_pandas()
    assert sorted(raw["id"]) == list(range(N))  # exactly once through the restore
    ts = raw["id"] * 10 + raw["k"] * 100
    c = raw.assign(start=ts // 5_000 * 5_000).groupby(["k", "start"]).size().rename(
        "n").reset_index()
    expected = pd.DataFrame({"k": c["k"].astype(np.int32), "n": c["n"].astype(np.int64),
                             "window_start": ms(c["start"])})
    assert rows(result.table(sinks["counts"])) == rows(expected)


@pytest.mark.parametrize("options, message", [
    ("'fields.x.kind' = 'sequence'", "a sequence needs 'fields.x.start' and 'fields.x.end'"),
    ("'fields.x.knd' = 'random'", "connector 'datagen' has no option 'fields.x.knd'"),
    ("'rows-per-sec' = '1'", "connector 'datagen' has no option 'rows-per-sec'"),
    ("'fields.y.min' = '1'", "option 'fields.y.min' names no physical column"),
    ("'fields.x.kind' = 'zipf'", "'fields.x.kind' is random or sequence, not 'zipf'"),
    ("'fields.x.min' = 'ten'", "'ten' is not a number"),
    ("'fields.x.min' = '5', 'fields.x.max' = '1'", "'fields.x.max' 1 is below its min 5"),
])
def test_a_datagen_option_it_cannot_take_is_a_one_line_error(options, message):
    env = rs.StreamEnvironment()
    with pytest.raises(rs.SqlError, match=re.escape(message)):
        env.sql(f"CREATE TABLE t (x BIGINT) WITH ('connector' = 'datagen', {options})")
