"""Flink SQL on raystream: the Nexmark SQL files as published (tests/sql/nexmark/, from
nexmark/nexmark) and window table functions over a DataStream, each result against pandas
over the same input; real Ray jobs, one with its processes killed; and the errors a
statement gets at planning, before anything runs."""

from __future__ import annotations

import re
import time
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.nexmark import EventKind, NexmarkConfig, generate
from tests.support.nexmark_sql import SIDE_INPUT, bids, ms, nexmark_ddl, query, rows

# -- oracles over the generated bids, in pandas -----------------------------------------------

def oracle(name: str, b: pd.DataFrame) -> pd.DataFrame:
    when = ms(b["date_time"])
    if name == "q0":
        return pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
                             "dateTime": when, "extra": b["extra"]})
    if name == "q1":
        euro = [Decimal(int(p)) * Decimal("0.908") for p in b["price"]]
        return pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": euro,
                             "dateTime": when, "extra": b["extra"]})
    if name == "q2":
        kept = b[b["auction"] % 123 == 0]
        return kept[["auction", "price"]]
    if name == "q21":
        codes = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
        out = []
        for auction, bidder, price, channel, url in b[
                ["auction", "bidder", "price", "channel", "url"]].itertuples(index=False):
            found = re.search(r"(&|^)channel_id=([^&]*)", url)
            extracted = found.group(2) if found else None
            if extracted is None and channel.lower() not in codes:
                continue
            out.append((auction, bidder, price, channel, codes.get(channel.lower(), extracted)))
        return pd.DataFrame(out, columns=["auction", "bidder", "price", "channel", "channel_id"])
    if name == "q22":
        parts = b["url"].str.split("/")
        pick = [parts.map(lambda p, i=i: p[i] if len(p) > i else None) for i in (3, 4, 5)]
        return pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
                             "channel": b["channel"], "dir1": pick[0], "dir2": pick[1],
                             "dir3": pick[2]})
    if name == "q10":  # bids as CSV files in partitions of day and minute
        return pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
                             "dateTime": when, "extra": b["extra"],
                             "dt": when.dt.strftime("%Y-%m-%d"), "hm": when.dt.strftime("%H:%M")})
    if name == "q13":  # each bid with the side input's value of MOD(auction, 10000)
        m = b.assign(key=b["auction"] % 10_000).merge(SIDE_INPUT, on="key")
        return pd.DataFrame({"auction": m["auction"], "bidder": m["bidder"], "price": m["price"],
                             "dateTime": ms(m["date_time"]), "value": m["value"]})
    if name == "q14":
        euro = b["price"].map(lambda p: Decimal(int(p)) * Decimal("0.908"))
        hour = when.dt.hour
        kind = np.where((hour >= 8) & (hour <= 18), "dayTime",
                        np.where((hour <= 6) | (hour >= 20), "nightTime", "otherTime"))
        df = pd.DataFrame({"auction": b["auction"], "bidder": b["bidder"], "price": euro,
                           "bidTimeType": kind, "dateTime": when, "extra": b["extra"],
                           "c_counts": b["extra"].str.count("c")})
        return df[(df["price"] > 1_000_000) & (df["price"] < 50_000_000)]
    if name == "by_channel":  # a dictionary column as a group key
        w = b.assign(window_start=b["date_time"] // 10_000 * 10_000, channel=b["channel"].astype(str))
        df = w.groupby(["channel", "window_start"]).size().rename("n").reset_index()
        return df.assign(window_start=ms(df["window_start"]))[["channel", "n", "window_start"]]
    if name == "q11":  # sessions of 10 s gaps per bidder
        out = []
        for bidder, group in b.groupby("bidder"):
            times = np.sort(group["date_time"].to_numpy())
            breaks = np.flatnonzero(np.diff(times) >= 10_000) + 1
            for session in np.split(times, breaks):
                out.append((bidder, len(session), session[0], session[-1] + 10_000))
        df = pd.DataFrame(out, columns=["bidder", "bid_count", "starttime", "endtime"])
        return df.assign(starttime=ms(df["starttime"]), endtime=ms(df["endtime"]))
    raise KeyError(name)


NEXMARK = ("q0", "q1", "q2", "q10", "q11", "q13", "q14", "q21", "q22")


@pytest.mark.parametrize("killed", [False, True], ids=["plain", "killed"])
def test_nexmark_sql_files_as_published_equal_pandas(ray_session, tmp_path, killed):
    """Every query of NEXMARK through env.sql, unchanged but for the sink's connector (q10's
    partitioned CSV files as written, and q13's side input, under tmp_path), in one job
    at parallelism 2;
    ``killed``: with checkpoints, the process of q11's committer
    exits in its second commit (as after a SIGKILL: no clean-up), then q1's calc's as it
    restores. Both kills come after a completed checkpoint, so both always happen."""
    failpoints = [rs.Failpoint("mid_commit", operator="nexmark_q11-committer", hit=2),
                  rs.Failpoint("right_after_restore", operator="nexmark_q1.calc", subtask=1,
                               attempt=1)] if killed else []
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk"))
        if killed else None, restart=rs.RestartStrategy.fixed_delay(3, 0.1) if killed else None)
    env.sql(nexmark_ddl(batch_size=2_048 if killed else None))  # (many failure points)
    sinks = {name: env.sql(query(name, tmp_path))[f"nexmark_{name}"] for name in NEXMARK}
    sinks["by_channel"] = env.sql_query("""
        SELECT channel, COUNT(*) AS n, window_start
        FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
        GROUP BY channel, window_start, window_end""").to_stream().collect()
    result = env.execute("nexmark-sql")
    if killed:
        assert result.restarts == 2
    b = bids()
    for name, sink in sinks.items():
        got = result.table(sink)
        expected = oracle(name, b)
        assert got.column_names == list(expected.columns), name
        assert rows(got) == rows(expected), name


def test_nexmark_q12_counts_each_bid_once_in_windows_of_the_wall_clock(ray_session):
    """q12 as published: bids per bidder in 10 s windows of processing time (PROCTIME()).
    Which window a bid falls in depends on when it was processed; that every bid is in
    exactly one, of its bidder, in a 10 s window of the clock while the job ran, does not."""
    env = rs.StreamEnvironment(parallelism=2)
    env.sql(nexmark_ddl())
    sink = env.sql(query("q12"))["nexmark_q12"]
    assert "TUMBLE(p_time (processing time), size=10000 ms)" in env.sql_query(
        "SELECT bidder, COUNT(*) FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), "
        "INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end").explain()
    began = pd.Timestamp(time.time(), unit="s").floor("10s")
    got = env.execute("nexmark-q12").table(sink).to_pandas()
    ended = pd.Timestamp(time.time(), unit="s")
    b = bids()
    per_bidder = got.groupby("bidder")["bid_count"].sum()
    assert per_bidder.to_dict() == b.groupby("bidder").size().to_dict()
    assert len(got) == len(got.drop_duplicates(["bidder", "starttime"]))  # a row per window
    assert ((got["endtime"] - got["starttime"]) == pd.Timedelta("10s")).all()
    assert (got["starttime"] == got["starttime"].dt.floor("10s")).all()
    assert got["starttime"].between(began, ended).all()


def test_windows_over_processing_time_are_tumbling_ones():
    env = rs.StreamEnvironment(parallelism=2)
    env.sql(nexmark_ddl() + "; CREATE VIEW P AS SELECT bidder, PROCTIME() AS p FROM bid")
    with pytest.raises(rs.SqlError, match=re.escape(
            "HOP(... DESCRIPTOR(p)): windows over processing time are TUMBLE windows")):
        env.sql_query("SELECT COUNT(*) FROM TABLE(HOP(TABLE P, DESCRIPTOR(p), INTERVAL '1' "
                      "SECOND, INTERVAL '2' SECOND)) GROUP BY window_start, window_end")
    plan = env.sql_query("SELECT p FROM P").explain()  # PROCTIME() is never folded
    assert "PROCTIME() AS p" in plan
    assert env.transformations == []


def test_the_sql_plan_of_q2_pushes_the_event_type_into_the_generator():
    env = rs.StreamEnvironment(parallelism=2)
    env.sql(nexmark_ddl())
    plan = env.sql_query("SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0").explain()
    assert "nexmark datagen (bid; 40000 events)" in plan  # bids only: the view's filter folded
    assert "event_type" not in plan.split("TableSourceScan")[0]
    assert env.transformations == []  # planning adds no operator


# -- window table functions over a DataStream ---------------------------------------------------

BOUND_MS = 2_000


def clicks_input(seed: int = 3, n: int = 3_000) -> pd.DataFrame:
    """Clicks out of order within BOUND_MS, and a few far beyond it (an hour late: late for
    every window whatever the batches, so no window may count them)."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 120_000, n)) + 3_600_000
    ts = ts + rng.integers(-BOUND_MS // 2, BOUND_MS // 2, n)  # disorder within the bound
    late = rng.random(n) < 0.02
    late[:200] = False  # (the watermark has passed an hour by then)
    ts = np.where(late, ts - 3_600_000, ts)
    return pd.DataFrame({"user": rng.choice(["ann", "bob", "cyd", None], n, p=[.4, .3, .2, .1]),
                         "amount": rng.integers(1, 100, n).astype(np.int64),
                         "ts": ts.astype(np.int64), "late": late})


def clicks_view(env: rs.StreamEnvironment, df: pd.DataFrame) -> None:
    table = pa.table({"user": pa.array(df["user"], pa.string()),
                      "amount": pa.array(df["amount"], pa.int64()),
                      "ts": pa.array(df["ts"], pa.timestamp("ms"))})
    stream = env.from_arrow(table, batch_size=100, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND_MS))
    env.create_temporary_view("clicks", stream, schema=table.schema, rowtime="ts")


def test_tumble_hop_and_session_aggregates_equal_pandas(ray_session):
    df = clicks_input()
    env = rs.StreamEnvironment(parallelism=2)
    clicks_view(env, df)
    env.sql("CREATE TABLE out_tumble (user STRING, n BIGINT, total BIGINT, top BIGINT, "
            "mean BIGINT, big BIGINT, named BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3)) "
            "WITH ('connector' = 'collect')")
    tumble = env.sql("""INSERT INTO out_tumble
        SELECT user, COUNT(*), SUM(amount), MAX(amount), AVG(amount),
               COUNT(*) FILTER (WHERE amount > 50), COUNT(user), window_start, window_end
        FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY user, window_start, window_end HAVING SUM(amount) > 100""")["out_tumble"]
    hop = env.sql_query("""
        SELECT window_start, window_end, COUNT(*) AS n, MIN(amount) AS low
        FROM TABLE(HOP(TABLE clicks, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '15' SECOND))
        GROUP BY window_start, window_end""").to_stream().collect()
    session = env.sql_query("""
        SELECT user, window_start, window_end, COUNT(*) AS n
        FROM TABLE(SESSION(TABLE clicks PARTITION BY user, DESCRIPTOR(ts), INTERVAL '0.3' SECOND))
        GROUP BY user, window_start, window_end""").to_stream().collect()
    result = env.execute("windows-sql")

    on_time = df[~df["late"]]
    t = on_time.assign(ws=on_time["ts"] // 10_000 * 10_000)
    g = t.groupby(["user", "ws"], dropna=False)
    expected = pd.DataFrame({
        "n": g.size(), "total": g["amount"].sum(), "top": g["amount"].max(),
        "mean": g["amount"].sum() // g.size(),  # Flink's AVG of a BIGINT is a BIGINT
        "big": g["amount"].apply(lambda a: int((a > 50).sum())),
        "named": g["user"].count()}).reset_index()
    expected = expected[expected["total"] > 100]
    expected["user"] = expected["user"].astype(object).where(expected["user"].notna(), None)
    expected = expected.assign(we=ms(expected["ws"] + 10_000), ws=ms(expected["ws"]))[
        ["user", "n", "total", "top", "mean", "big", "named", "ws", "we"]]
    assert rows(result.table(tumble)) == rows(expected)

    hop_rows = []
    for start in range((on_time["ts"].min() // 5_000 - 2) * 5_000, on_time["ts"].max() + 1, 5_000):
        inside = on_time[(on_time["ts"] >= start) & (on_time["ts"] < start + 15_000)]
        if len(inside):
            hop_rows.append((start, start + 15_000, len(inside), inside["amount"].min()))
    hop_expected = pd.DataFrame(hop_rows, columns=["window_start", "window_end", "n", "low"])
    hop_expected = hop_expected.assign(window_start=ms(hop_expected["window_start"]),
                                       window_end=ms(hop_expected["window_end"]))
    assert rows(result.table(hop)) == rows(hop_expected)

    sessions = []
    for user, group in on_time.groupby("user", dropna=False):
        times = np.sort(group["ts"].to_numpy())
        for part in np.split(times, np.flatnonzero(np.diff(times) >= 300) + 1):
            sessions.append((None if pd.isna(user) else user, part[0], part[-1] + 300, len(part)))
    session_expected = pd.DataFrame(sessions, columns=["user", "window_start", "window_end", "n"])
    session_expected = session_expected.assign(
        window_start=ms(session_expected["window_start"]),
        window_end=ms(session_expected["window_end"]))
    assert rows(result.table(session)) == rows(session_expected)


# -- errors at planning --------------------------------------------------------------------------

GEN = ("CREATE TABLE gen (event_type INT, bid ROW<auction BIGINT, price BIGINT, "
       "`dateTime` TIMESTAMP(3)>, ts AS bid.`dateTime`, WATERMARK FOR ts AS ts - INTERVAL '1' "
       "SECOND) WITH ('connector' = 'nexmark', 'events.num' = '1000')")


@pytest.mark.parametrize("statement, message", [
    ("CREATE TABLE t (a INT) WITH ('connector' = 'kafak')",
     "unknown connector 'kafak'"),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'nexmark', 'events.num' = '9', 'rate' = '1')",
     "connector 'nexmark' has no option 'rate'"),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'nexmark')",
     "connector 'nexmark' needs option 'events.num'"),
    ("CREATE TABLE t (event_type INT) WITH ('connector' = 'nexmark', 'events.num' = '${EVENTS}')",
     "option 'events.num' must be an integer, not '${EVENTS}'"),
    ("CREATE TABLE t (bid ROW<auctoin BIGINT>) WITH ('connector' = 'nexmark', 'events.num' = '9')",
     "nexmark's bid has no field 'auctoin'"),
    ("SELECT bid.auctoin FROM gen", "bid has no field 'auctoin'"),
    ("SELECT pric FROM (SELECT bid.price AS price FROM gen)", "no column 'pric'"),
    ("SELECT LOWER(bid.price) FROM gen", "LOWER takes a string, not BIGINT"),
    ("SELECT bid.auction, COUNT(*) FROM gen GROUP BY bid.auction",
     "a GROUP BY without a window makes an updating result"),
    ("SELECT COUNT(*) FROM TABLE(TUMBLE(TABLE gen, DESCRIPTOR(bid), INTERVAL '1' SECOND)) "
     "GROUP BY window_start, window_end", "'bid' is not the table's rowtime attribute"),
    ("SELECT bid.price, COUNT(*) FROM TABLE(TUMBLE(TABLE gen, DESCRIPTOR(ts), INTERVAL '1' "
     "SECOND)) GROUP BY window_start, window_end", "is neither grouped by nor aggregated"),
    ("INSERT INTO sink SELECT bid.price FROM gen", "the query has 1 columns, the table takes 2"),
    ("INSERT INTO sink SELECT CAST(bid.price AS STRING), bid.price FROM gen",
     "column a is BIGINT; the query's EXPR$0 is STRING"),
    ("CREATE FUNCTION f AS 'com.example.F'", "raystream runs Python functions (LANGUAGE "
     "PYTHON), not JAVA"),
    ("CREATE FUNCTION f AS 'no_such_module.f' LANGUAGE PYTHON", "cannot import it"),
    ("CREATE FUNCTION f AS 'raystream.nexmark.udfs._count_char' LANGUAGE PYTHON",
     "is not a SQL function; make it one with @raystream.udf(result_type=...)"),
])
def test_a_statement_that_cannot_run_is_refused_at_planning(statement, message):
    env = rs.StreamEnvironment()
    env.sql(GEN + "; CREATE TABLE sink (a BIGINT, b BIGINT) WITH ('connector' = 'collect')")
    with pytest.raises(rs.SqlError, match=re.escape(message)):
        if statement.startswith("SELECT"):
            env.sql_query(statement)
        else:
            env.sql(statement)
    assert env.transformations == []  # nothing was added to the job


def test_a_user_function_that_returns_too_few_values_fails_the_job_naming_it(ray_session):
    @rs.udf(result_type="BIGINT")
    def first_only(values: pa.Array) -> pa.Array:
        return values.slice(0, 1)

    env = rs.StreamEnvironment()
    table = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
    env.create_temporary_view("t", env.from_arrow(table, num_splits=1), schema=table.schema)
    env.create_temporary_function("first_only", first_only)
    sink = env.sql_query("SELECT first_only(a) AS b FROM t").to_stream().collect()
    with pytest.raises(rs.JobFailedError, match=re.escape(
            "FIRST_ONLY(a): first_only returned 1 values for a batch of 3 rows")) as failure:
        env.execute("udf")
    assert "query-1.calc" in str(failure.value)  # the operator
    del sink


# -- savepoints: a SQL job stopped at one parallelism and restored at another ------------------

WINDOW_SQL = """
    CREATE TABLE totals (k BIGINT, n BIGINT, total BIGINT, window_start TIMESTAMP(3))
        WITH ('connector' = 'collect');
    INSERT INTO totals
    SELECT k, COUNT(*), SUM(v), window_start
    FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND))
    GROUP BY k, window_start, window_end;"""
ROWS = 80_000  # in 4 splits of 20,000: each split runs through 5 s of event time


def paced_events(env: rs.StreamEnvironment, brake) -> None:
    """``events``: k, v and a rowtime ts (4 rows per ms, in order in each of the 4 splits,
    which run through the same times), read slowly while ``brake`` is engaged."""
    stream = env.from_sequence(ROWS, lambda i: {
        "k": i % 7, "v": i % 100, "ts": pa.array(i % (ROWS // 4) // 4, pa.timestamp("ms"))},
        batch_size=500, watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0)).map_batches(
        brake, name="throttle")
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64()),
                        ("ts", pa.timestamp("ms"))])
    env.create_temporary_view("events", stream, schema=schema, rowtime="ts")


def test_a_sql_job_stopped_at_parallelism_2_restores_at_3_exactly_once(ray_session, tmp_path):
    from tests.support.pacing import Brake

    def environment(parallelism: int, brake: Brake) -> rs.StreamEnvironment:
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.2, storage=str(tmp_path / f"chk-{parallelism}")))
        paced_events(env, brake)
        return env

    brake = Brake(str(tmp_path), seconds_per_batch=0.1)  # 8 s per subtask while engaged
    first_env = environment(2, brake)
    sink = first_env.sql(WINDOW_SQL)["totals"]
    client = first_env.execute_async("sql-before")
    deadline = time.monotonic() + 120
    while max(client.progress()["completed_checkpoints"], default=0) < 5:  # (open windows)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = client.stop_with_savepoint(str(tmp_path / "stopped")).table(sink)
    brake.release()
    second_env = environment(3, brake)
    sink = second_env.sql(WINDOW_SQL)["totals"]  # the same statement: the same operator names
    after = second_env.execute("sql-after", restore_from=str(tmp_path / "stopped")).table(sink)
    assert after.num_rows > 0  # the rest after the restore

    i = np.arange(ROWS)
    df = pd.DataFrame({"k": i % 7, "v": i % 100,
                       "window_start": i % (ROWS // 4) // 4 // 1000 * 1000})
    g = df.groupby(["k", "window_start"])
    expected = pd.DataFrame({"n": g.size(), "total": g["v"].sum()}).reset_index()
    expected = expected.assign(window_start=ms(expected["window_start"]))[
        ["k", "n", "total", "window_start"]]
    committed = [t for t in (before, after) if t.num_columns]  # (none may have fired before)
    assert rows(pa.concat_tables(committed)) == rows(expected)  # each window once


def test_raystream_sql_runs_a_script_as_a_job_and_prints_its_collected_rows(
        ray_session, tmp_path, capsys):
    from raystream.engine.cli import build_parser

    script = tmp_path / "counts.sql"
    script.write_text(nexmark_ddl() + """;
        CREATE TABLE counts (auction BIGINT, bids BIGINT) WITH ('connector' = 'collect');
        INSERT INTO counts SELECT auction, COUNT(*) FROM TABLE(
            TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '60' SECOND))
        WHERE auction < 1003 GROUP BY auction, window_start, window_end;""")
    args = build_parser().parse_args(["sql", "-f", str(script), "--parallelism", "2",
                                      "--checkpoint-storage", str(tmp_path / "chk")])
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    b = bids()
    counts = b[b["auction"] < 1003].groupby("auction").size()  # (40 s: one window)
    assert f"counts: {len(counts)} rows" in printed
    for auction, n in counts.items():
        assert re.search(rf"^\s*{auction}\s+{n}\s*$", printed, re.M), printed


# -- the documentation's SQL examples, run as written --------------------------------------------

def test_the_readme_sql_quickstart_and_the_sql_guide_example_run_and_match_pandas(
        ray_session, capsys):
    from tests.support.docs import ROOT, example

    namespace: dict = {}
    exec(compile(example(ROOT / "README.md", "### The same job in SQL"), "README.md", "exec"),
         namespace)
    i = np.arange(200_000)
    clicks = pd.DataFrame({"user": i % 100, "ts": 1_700_000_000_000 + i * 10,
                           "dwell_ms": i * 7 % 30_000})
    engaged = clicks[clicks.dwell_ms > 1000].assign(window_start=lambda d: d.ts // 60_000 * 60_000)
    expected = (engaged.groupby(["user", "window_start"])
                .agg(clicks=("ts", "size"), dwell_ms=("dwell_ms", "sum")).reset_index())
    expected = expected.assign(window_start=ms(expected["window_start"]))
    got = namespace["job"].table(namespace["result"]["per_minute"])
    assert rows(got) == rows(expected[["user", "window_start", "clicks", "dwell_ms"]])

    guide: dict = {}
    exec(compile(example(ROOT / "docs" / "sql.md", "## Running statements"), "sql.md", "exec"),
         guide)
    b = generate(EventKind.BID, 0, 100_000, NexmarkConfig()).to_pandas()
    windows = b.assign(end=b["date_time"] // 10_000 * 10_000 + 10_000).groupby(
        ["auction", "end"]).size()
    assert guide["job"].table(guide["result"]["counts"]).num_rows == len(windows)
    assert f"{len(windows)}\n" in capsys.readouterr().out


def test_a_statement_set_plans_all_its_inserts_or_adds_none_and_explain_prints_the_plan(capsys):
    env = rs.StreamEnvironment()
    env.sql(GEN + "; CREATE TABLE a (x BIGINT) WITH ('connector' = 'collect');"
                  "CREATE TABLE b (y BIGINT) WITH ('connector' = 'blackhole')")
    with pytest.raises(rs.SqlError, match="no column 'nope'"):
        env.sql("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT bid.price FROM gen; "
                "INSERT INTO b SELECT nope FROM gen; END")
    assert env.transformations == []  # the first INSERT was not added either
    result = env.sql("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT bid.price FROM gen "
                     "WHERE event_type = 2; INSERT INTO b SELECT bid.auction FROM gen; END")
    assert list(result.sinks) == ["a", "b"] and result.collected == ("a",)
    names = [t.name for t in env.transformations]
    assert "a" in names and "b" in names  # one job with both sinks

    explained = env.sql("EXPLAIN INSERT INTO a SELECT bid.price FROM gen WHERE event_type = 2")
    assert capsys.readouterr().out.strip() == explained.explained
    assert explained.explained.splitlines() == [  # (event_type = 2: pushed down, folded)
        "Sink(table=[a], connector=[collect])",
        "  Calc(select=[price AS x])",
        "    Calc(select=[bid.price AS price])",
        "      TableSourceScan(table=[gen], nexmark gen (bid; 1000 events), "
        "fields=[event_type, bid, ts])"]
