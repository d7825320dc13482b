"""SQL's ``filesystem`` connector: tables of Parquet, CSV and JSON-lines files written
exactly once through a writer's death in a checkpoint (its files left on disk, never read
back), read back by SQL into event-time windows; Flink's headerless CSV read as Flink
writes it; DATE_FORMAT against pandas; and the errors a table gets before anything runs.
Every result is checked against pandas over the same input."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import sqlglot

import raystream as rs
from raystream.engine.sql.dialect import Flink
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.schema import Field, RelSchema
from raystream.spark.commit_log import committed_files, read_committed
from tests.support.nexmark_sql import ms, rows

BOUND_MS = 1_000


def orders_input(seed: int = 5, n: int = 2_000) -> pd.DataFrame:
    """Orders over 60 s, out of order within BOUND_MS, with NULL users, text that needs
    quoting in CSV (the delimiter, quotes) and a day for the partitions."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 60_000, n)) + 86_400_000 - 30_000  # across midnight
    ts = ts + rng.integers(-BOUND_MS // 2, BOUND_MS // 2, n)
    user = pd.array(rng.integers(0, 20, n), dtype="Int64")
    user[rng.random(n) < 0.05] = pd.NA
    note = rng.choice(["plain", "a,b", 'say "hi"', "x;y"], n)
    return pd.DataFrame({"user": user, "amount": rng.integers(1, 1_000, n).astype(np.int64),
                         "note": note, "ts": ts.astype(np.int64)})


def orders_view(env: rs.StreamEnvironment, df: pd.DataFrame) -> None:
    table = pa.table({"user": pa.array(df["user"], pa.int64()),
                      "amount": pa.array(df["amount"], pa.int64()),
                      "note": pa.array(df["note"], pa.string()),
                      "ts": pa.array(df["ts"], pa.timestamp("ms"))})
    stream = env.from_arrow(table, batch_size=100, num_splits=2,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND_MS))
    env.create_temporary_view("orders", stream, schema=table.schema, rowtime="ts")


def values(rows: pa.Table | pd.DataFrame) -> list[str]:
    """Rows as Python values (NULL as None, timestamps in milliseconds), in an order."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pandas(rows, preserve_index=False)
    table = table.cast(pa.schema([pa.field(f.name, pa.timestamp("ms"))
                                  if pa.types.is_timestamp(f.type) else f for f in table.schema]))
    return sorted(map(repr, table.to_pylist()))


def files_on_disk(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, names in os.walk(path) for f in names
            if not f.startswith((".", "_")) and "/_" not in d[len(path):]}


@pytest.mark.parametrize("format", ["csv", "json", "parquet"])
def test_a_filesystem_table_is_written_exactly_once_and_read_back_into_windows(
        ray_session, tmp_path, format):
    """Writer 0 dies in the final checkpoint's snapshot, after it closed that checkpoint's
    files: they stay on disk, uncommitted; the restored job writes their rows again. A
    second job reads the table back (committed files only) into 10 s tumbling windows."""
    df = orders_input()
    out = tmp_path / "orders"
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=[rs.Failpoint("in_snapshot", operator="sunk", subtask=0,
                                                attempt=0, final=True)],
        # (no periodic checkpoint: every row is in the final one's files, so writer 0 has
        # some to leave behind, and the job restarts from its start)
        checkpoints=rs.CheckpointConfig(interval_s=600, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(2, 0.1))
    orders_view(env, df)
    env.sql(f"""
        CREATE TABLE sunk (user_id BIGINT, amount BIGINT, note STRING, ts TIMESTAMP(3), dt STRING)
        PARTITIONED BY (dt) WITH (
          'connector' = 'filesystem', 'path' = 'file://{out}', 'format' = '{format}',
          'sink.rolling-policy.file-size' = '4kb', 'sink.partition-commit.policy.kind' = 'success-file');
        INSERT INTO sunk SELECT user, amount, note, ts, DATE_FORMAT(ts, 'yyyy-MM-dd') FROM orders""")
    first = env.execute("write-files")
    assert first.restarts == 1, first.failures

    day = ms(df["ts"]).dt.strftime("%Y-%m-%d")
    written = pd.DataFrame({"user_id": df["user"], "amount": df["amount"], "note": df["note"],
                            "ts": ms(df["ts"]), "dt": day})
    assert set(day) == {"1970-01-01", "1970-01-02"}
    assert values(read_committed(str(out))) == values(written)
    leftovers = files_on_disk(str(out)) - set(committed_files(str(out)))
    assert leftovers, "the dead writer's closed files should be on disk"

    env = rs.StreamEnvironment(parallelism=2)
    env.sql(f"""
        CREATE TABLE back (user_id BIGINT, amount BIGINT, note STRING, ts TIMESTAMP(3), dt STRING,
          WATERMARK FOR ts AS ts - INTERVAL '2' MINUTE)
        PARTITIONED BY (dt) WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = '{format}')""")
    totals = env.sql_query("""
        SELECT user_id, dt, SUM(amount) AS total, COUNT(*) AS n, window_start
        FROM TABLE(TUMBLE(TABLE back, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY user_id, dt, window_start, window_end""").to_stream().collect()
    whole = env.sql_query("SELECT * FROM back").to_stream().collect()
    second = env.execute("read-files")
    assert values(second.table(whole)) == values(written)
    # every row is on time: the watermark trails by more than the input spans (files
    # are read one after another, each reader its own, so the rows come out of order)
    w = written.assign(window_start=written["ts"].dt.floor("10s"))
    expected = w.groupby(["user_id", "dt", "window_start"], dropna=False).agg(
        total=("amount", "sum"), n=("amount", "size")).reset_index()
    expected = expected[["user_id", "dt", "total", "n", "window_start"]]
    assert values(second.table(totals)) == values(expected)


def test_headerless_csv_as_flink_writes_it(ray_session, tmp_path):
    """A file of `key;value;ts` lines without a header (Flink's csv format, ';' as the
    delimiter), a computed column over it, its rowtime declared in the DDL."""
    rng = np.random.default_rng(2)
    n = 500
    df = pd.DataFrame({"key": rng.integers(0, 50, n), "value": rng.choice(["a", "b c", "d"], n),
                       "ts": pd.to_datetime(np.sort(rng.integers(0, 30_000, n)), unit="ms")})
    path = tmp_path / "side_input.txt"  # (any name: a file path is read whatever it is called)
    written = df.assign(ts=df["ts"].dt.strftime("%Y-%m-%d %H:%M:%S.%f").str[:-3])  # as Flink
    written.to_csv(path, sep=";", header=False, index=False)
    env = rs.StreamEnvironment(parallelism=1)
    env.sql(f"""CREATE TABLE side (key BIGINT, `value` VARCHAR, ts TIMESTAMP(3),
                  doubled AS key * 2, WATERMARK FOR ts AS ts)
                WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'csv',
                      'csv.field-delimiter' = ';')""")
    sink = env.sql_query("""
        SELECT doubled, COUNT(*) AS n, window_end FROM TABLE(
          TUMBLE(TABLE side, DESCRIPTOR(ts), INTERVAL '5' SECOND))
        GROUP BY doubled, window_start, window_end""").to_stream().collect()
    result = env.execute("headerless-csv")
    w = df.assign(doubled=df["key"] * 2, window_end=df["ts"].dt.floor("5s") + pd.Timedelta("5s"))
    expected = w.groupby(["doubled", "window_end"]).size().rename("n").reset_index()
    assert rows(result.table(sink)) == rows(expected[["doubled", "n", "window_end"]])


@pytest.mark.parametrize("pattern, strftime", [
    ("yyyy-MM-dd", "%Y-%m-%d"), ("HH:mm", "%H:%M"), ("yy/MM/dd HH:mm:ss", "%y/%m/%d %H:%M:%S"),
    ("yyyy-MM-dd HH:mm:ss.SSS", None), ("'day' dd '%' HH", "day %d %% %H")])
def test_date_format_equals_pandas(pattern, strftime):
    rng = np.random.default_rng(9)
    # before and after the epoch, with milliseconds (a floor, not a truncation, of seconds)
    values = np.concatenate([rng.integers(-10**12, 2 * 10**12, 300), [-1, 0, 999, -1000]])
    quoted = pattern.replace("'", "''")
    compiled = compile_expression(sqlglot.parse_one(f"DATE_FORMAT(ts, '{quoted}')", read=Flink),
                                  Scope(RelSchema((Field("ts", pa.timestamp("ms")),))))
    assert compiled.type == pa.string()
    got = compiled.evaluate(pa.record_batch({"ts": pa.array(values, pa.timestamp("ms"))}))
    when = pd.to_datetime(values, unit="ms")
    if strftime is None:
        expected = [t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}" for t in when]
    else:
        expected = [t.strftime(strftime) for t in when]
    assert got.to_pylist() == expected


@pytest.mark.parametrize("ddl, message", [
    ("'format' = 'orc'", "reads formats parquet, csv, json, avro, not 'orc'"),
    ("'format' = 'csv', 'csv.field-delimiter' = ';;'", "'csv.field-delimiter' is one character"),
    ("'format' = 'csv', 'source.monitor-interval' = 'soon'", "'soon' is not a duration"),
    ("'format' = 'csv', 'sink.rolling-policy.file-size' = 'big'", "'big' is not a memory size"),
    ("'format' = 'csv', 'sink.rolling-polcy.file-size' = '1mb'",
     "has no option 'sink.rolling-polcy.file-size'"),
    ("'path' = '/x'", "needs option 'format'"),
])
def test_filesystem_table_errors(ddl, message):
    env = rs.StreamEnvironment(parallelism=1)
    options = ddl if "'path'" in ddl else f"'path' = '/tmp/x', {ddl}"
    with pytest.raises(rs.SqlError, match=message.replace("(", r"\(").replace(")", r"\)")):
        env.sql(f"CREATE TABLE t (a BIGINT) WITH ('connector' = 'filesystem', {options})")


def test_filesystem_partition_and_sink_errors():
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(rs.SqlError, match=r"PARTITIONED BY \(b\): no such physical column"):
        env.sql("CREATE TABLE t (a BIGINT, b AS a + 1) PARTITIONED BY (b) WITH ("
                "'connector' = 'filesystem', 'path' = '/x', 'format' = 'csv')")
    env.sql("CREATE TABLE av (a BIGINT) WITH ('connector' = 'filesystem', 'path' = '/x', "
            "'format' = 'avro')")
    env.sql("CREATE TABLE src (a BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', "
            "'path' = '/x', 'format' = 'csv')")
    with pytest.raises(rs.SqlError, match="writes formats parquet, csv, json, not 'avro'"):
        env.sql("INSERT INTO av SELECT a FROM src")
    with pytest.raises(rs.SqlError, match="DATE_FORMAT's pattern letter 'E'"):
        env.sql_query("SELECT DATE_FORMAT(ts, 'EEE') FROM src")
    assert env.transformations == []  # planning adds no operator


def test_a_file_outside_its_partition_directories_fails_naming_it(ray_session, tmp_path):
    pd.DataFrame({"a": [1]}).to_csv(tmp_path / "stray.csv", header=False, index=False)
    env = rs.StreamEnvironment(parallelism=1)
    env.sql(f"""CREATE TABLE p (a BIGINT, dt STRING) PARTITIONED BY (dt) WITH (
                'connector' = 'filesystem', 'path' = '{tmp_path}', 'format' = 'csv')""")
    env.sql_query("SELECT * FROM p").to_stream().collect()
    with pytest.raises(rs.JobFailedError, match=r"stray.csv: no directory names partition "
                                                r"column\(s\) dt"):
        env.execute("stray")
