"""The SQL parser (engine/sql): Nexmark's published Flink SQL files, each statement and
column type, the window table functions, intervals, and the errors' line and column."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql import (ArrayType, ComputedColumn, CreateFunction, CreateTable,
                                  CreateView, Explain, Flink, FunctionLanguage, Insert, MapType,
                                  PhysicalColumn, Query, RowField, RowType, ScalarType,
                                  StatementSet, TypeName, WindowKind, WindowTableFunction,
                                  WindowTvf, interval_ms, parse)

NEXMARK = Path(__file__).parent / "sql" / "nexmark"
# what Nexmark's QueryRunner.initializeVarsMap puts in (the datagen run, no Kafka)
NEXMARK_VARS = {"NEXMARK_DIR": "/tmp/nexmark", "SUBMIT_TIME": "2026-01-01T00:00",
                "FLINK_HOME": "/opt/flink", "TPS": "10000000", "EVENTS_NUM": "100000000",
                "PERSON_PROPORTION": "1", "AUCTION_PROPORTION": "3", "BID_PROPORTION": "46",
                "NEXMARK_TABLE": "datagen", "BOOTSTRAP_SERVERS": ""}
TABLE_AND_INSERT = [CreateTable, Insert]
NEXMARK_KINDS = {
    "ddl_gen": [CreateTable], "ddl_kafka": [CreateTable], "ddl_views": [CreateView] * 3,
    **{f"q{n}": TABLE_AND_INSERT for n in range(24)},
    "q12": [CreateTable, CreateView, Insert],
    "q13": [CreateTable, CreateTable, Insert],
    "q14": [CreateFunction, CreateTable, Insert],
}


def nexmark(name: str) -> str:
    text = (NEXMARK / f"{name}.sql").read_text()
    for key, value in NEXMARK_VARS.items():
        text = text.replace("${" + key + "}", value)
    assert "${" not in text
    return text


def test_the_corpus_is_complete():
    assert sorted(p.stem for p in NEXMARK.glob("*.sql")) == sorted(NEXMARK_KINDS)


@pytest.mark.parametrize("name", sorted(NEXMARK_KINDS))
def test_nexmark_files_parse(name):
    statements = parse(nexmark(name))
    assert [type(s) for s in statements] == NEXMARK_KINDS[name]
    for statement in statements:  # nothing sqlglot could not read is kept as text
        query = getattr(statement, "query", None)
        assert query is None or not list(query.find_all(exp.Command))


def test_nexmark_as_the_sql_client_gets_it():
    """Nexmark hands Flink's SQL client ddl_gen, ddl_kafka, ddl_views and the query in one
    script."""
    for n in range(24):
        text = "\n".join(nexmark(name) for name in ("ddl_gen", "ddl_kafka", "ddl_views", f"q{n}"))
        assert len(parse(text)) == 5 + len(NEXMARK_KINDS[f"q{n}"])


def test_nexmark_source_table():
    (table,) = parse(nexmark("ddl_gen"))
    assert table.name == "datagen"
    assert [c.name for c in table.columns] == ["event_type", "person", "auction", "bid",
                                               "dateTime"]
    bid = table.columns[3]
    assert isinstance(bid, PhysicalColumn) and isinstance(bid.type, RowType)
    assert bid.type.fields[0] == RowField("auction", ScalarType(TypeName.BIGINT))
    assert bid.type.fields[5] == RowField("dateTime", ScalarType(TypeName.TIMESTAMP, 3))
    assert isinstance(table.columns[4], ComputedColumn)
    assert isinstance(table.columns[4].expression, exp.Case)
    assert table.watermark is not None and table.watermark.column == "dateTime"
    assert table.option("connector") == "nexmark"
    assert table.option("events.num") == "100000000"


def windows(name: str) -> list[WindowTvf]:
    return [node.window for statement in parse(nexmark(name))
            if isinstance(statement, Insert | CreateView)
            for node in statement.query.find_all(WindowTableFunction)]


def test_nexmark_windows():
    hop = WindowTvf(WindowKind.HOP, "bid", "dateTime", size_ms=10_000, slide_ms=2_000)
    assert windows("q5") == [hop, hop]
    assert windows("q7") == [WindowTvf(WindowKind.TUMBLE, "bid", "dateTime", size_ms=10_000)]
    assert [w.table for w in windows("q8")] == ["person", "auction"]
    assert windows("q12") == [WindowTvf(WindowKind.TUMBLE, "B", "p_time", size_ms=10_000)]


def test_nexmark_other_constructs():
    q10 = parse(nexmark("q10"))[0]
    assert isinstance(q10, CreateTable) and q10.partitioned_by == ("dt", "hm")
    # q11's legacy group window stays a function call of GROUP BY
    insert = parse(nexmark("q11"))[1]
    assert isinstance(insert, Insert)
    group = insert.query.args["group"]
    assert [f.name for f in group.find_all(exp.Anonymous)] == ["SESSION"]
    # q13's lookup join
    insert = parse(nexmark("q13"))[2]
    assert isinstance(insert, Insert) and insert.query.find(exp.Version) is not None
    function = parse(nexmark("q14"))[0]
    assert function == CreateFunction("count_char", "com.github.nexmark.flink.udf.CountChar")


# --- CREATE TABLE

def table(columns: str, rest: str = "") -> CreateTable:
    (statement,) = parse(f"CREATE TABLE t ({columns}) {rest}")
    assert isinstance(statement, CreateTable)
    return statement


@pytest.mark.parametrize("written, expected", [
    ("BIGINT", ScalarType(TypeName.BIGINT)),
    ("INT", ScalarType(TypeName.INT)),
    ("INTEGER", ScalarType(TypeName.INT)),
    ("SMALLINT", ScalarType(TypeName.SMALLINT)),
    ("TINYINT", ScalarType(TypeName.TINYINT)),
    ("DOUBLE", ScalarType(TypeName.DOUBLE)),
    ("FLOAT", ScalarType(TypeName.FLOAT)),
    ("DECIMAL(23, 3)", ScalarType(TypeName.DECIMAL, 23, 3)),
    ("DECIMAL(5)", ScalarType(TypeName.DECIMAL, 5, 0)),
    ("DECIMAL", ScalarType(TypeName.DECIMAL, 10, 0)),
    ("VARCHAR", ScalarType(TypeName.VARCHAR)),
    ("VARCHAR(20)", ScalarType(TypeName.VARCHAR, 20)),
    ("STRING", ScalarType(TypeName.VARCHAR)),
    ("BOOLEAN", ScalarType(TypeName.BOOLEAN)),
    ("DATE", ScalarType(TypeName.DATE)),
    ("TIMESTAMP(3)", ScalarType(TypeName.TIMESTAMP, 3)),
    ("TIMESTAMP", ScalarType(TypeName.TIMESTAMP, 6)),
    ("TIMESTAMP_LTZ(3)", ScalarType(TypeName.TIMESTAMP_LTZ, 3)),
    ("ARRAY<BIGINT>", ArrayType(ScalarType(TypeName.BIGINT))),
    ("MAP<STRING, DOUBLE>", MapType(ScalarType(TypeName.VARCHAR), ScalarType(TypeName.DOUBLE))),
    ("ROW<a INT, b ARRAY<STRING>>", RowType((
        RowField("a", ScalarType(TypeName.INT)),
        RowField("b", ArrayType(ScalarType(TypeName.VARCHAR)))))),
    ("ROW(a INT, `b c` ROW<d TIMESTAMP(3)>)", RowType((
        RowField("a", ScalarType(TypeName.INT)),
        RowField("b c", RowType((RowField("d", ScalarType(TypeName.TIMESTAMP, 3)),)))))),
])
def test_column_types(written, expected):
    assert table(f"x {written}").columns == (PhysicalColumn("x", expected),)


def test_table_elements():
    statement = table(
        "id BIGINT NOT NULL, price DECIMAL(10, 2), ts TIMESTAMP(3), "
        "cents AS price * 100, "
        "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND, "
        "PRIMARY KEY (id) NOT ENFORCED",
        "WITH ('connector' = 'kafka', 'topic' = 'bids', 'format' = 'json')")
    assert statement.columns[0] == PhysicalColumn("id", ScalarType(TypeName.BIGINT), False)
    computed = statement.columns[3]
    assert isinstance(computed, ComputedColumn) and computed.name == "cents"
    assert computed.expression.sql(dialect=Flink) == "price * 100"
    assert statement.watermark is not None and statement.watermark.column == "ts"
    assert statement.watermark.expression.sql(dialect=Flink) == "ts - INTERVAL '5' SECOND"
    assert statement.primary_key == ("id",)
    assert statement.options == (("connector", "kafka"), ("topic", "bids"), ("format", "json"))
    assert statement.option("missing", "default") == "default"


def test_table_variants():
    assert table("id BIGINT PRIMARY KEY NOT ENFORCED").primary_key == ("id",)
    (statement,) = parse("CREATE TEMPORARY TABLE IF NOT EXISTS db.t (a INT) "
                         "PARTITIONED BY (a) WITH ('connector' = 'filesystem')")
    assert isinstance(statement, CreateTable)
    assert (statement.name, statement.temporary, statement.if_not_exists,
            statement.partitioned_by) == ("db.t", True, True, ("a",))


def test_quoted_names_keep_their_case():
    statement = table("`dateTime` TIMESTAMP(3), `value` VARCHAR")
    assert [c.name for c in statement.columns] == ["dateTime", "value"]


# --- other statements

def test_create_view():
    (view,) = parse("CREATE TEMPORARY VIEW v AS SELECT a FROM t WHERE a > 1")
    assert isinstance(view, CreateView) and view.name == "v" and view.temporary
    assert view.query.sql(dialect=Flink) == "SELECT a FROM t WHERE a > 1"
    (view,) = parse("CREATE VIEW v AS SELECT 1")
    assert isinstance(view, CreateView) and not view.temporary


@pytest.mark.parametrize("text, expected", [
    ("CREATE TEMPORARY FUNCTION f AS 'my.module.f' LANGUAGE PYTHON",
     CreateFunction("f", "my.module.f", FunctionLanguage.PYTHON, temporary=True)),
    ("CREATE FUNCTION f AS 'com.x.F'", CreateFunction("f", "com.x.F")),
    ("CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS f AS 'm.f' LANGUAGE PYTHON",
     CreateFunction("f", "m.f", FunctionLanguage.PYTHON, temporary=True, system=True,
                    if_not_exists=True)),
])
def test_create_function(text, expected):
    assert parse(text) == [expected]


def test_insert():
    (insert,) = parse("INSERT INTO out (a, b) SELECT x, y FROM t")
    assert isinstance(insert, Insert)
    assert (insert.table, insert.columns, insert.overwrite) == ("out", ("a", "b"), False)
    assert isinstance(insert.query, exp.Select)
    (insert,) = parse("INSERT OVERWRITE out SELECT x FROM t")
    assert isinstance(insert, Insert) and insert.overwrite and insert.columns == ()
    (insert,) = parse("EXECUTE INSERT INTO out SELECT 1")
    assert isinstance(insert, Insert) and insert.table == "out"


def test_select():
    (query,) = parse("SELECT a, COUNT(*) FROM t GROUP BY a UNION ALL SELECT b, 1 FROM u")
    assert isinstance(query, Query) and isinstance(query.expression, exp.Union)


@pytest.mark.parametrize("text", [
    "EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT 1; INSERT INTO b SELECT 2; END",
    "EXECUTE STATEMENT SET\nBEGIN\n  INSERT INTO a SELECT 1;\n  INSERT INTO b SELECT 2;\nEND;",
    "BEGIN STATEMENT SET;\nINSERT INTO a SELECT 1;\nINSERT INTO b SELECT 2;\nEND;",
])
def test_statement_sets(text):
    (statement_set,) = parse(text)
    assert isinstance(statement_set, StatementSet)
    assert [insert.table for insert in statement_set.inserts] == ["a", "b"]


def test_statements_around_a_statement_set():
    statements = parse("CREATE VIEW v AS SELECT 1; BEGIN STATEMENT SET; INSERT INTO a "
                       "SELECT 1; END; SELECT 2")
    assert [type(s) for s in statements] == [CreateView, StatementSet, Query]


def test_explain():
    assert [type(s) for s in parse("EXPLAIN SELECT 1")] == [Explain]
    (explain,) = parse("EXPLAIN PLAN FOR INSERT INTO a SELECT 1")
    assert isinstance(explain, Explain) and isinstance(explain.statement, Insert)
    (explain,) = parse("EXPLAIN STATEMENT SET BEGIN INSERT INTO a SELECT 1; END")
    assert isinstance(explain, Explain) and isinstance(explain.statement, StatementSet)


def test_keywords_of_the_statements_are_names_elsewhere():
    (query,) = parse("SELECT `end`, explain, `statement` FROM `begin`")
    assert isinstance(query, Query)
    assert [c.name for c in query.expression.expressions] == ["end", "explain", "statement"]


# --- window table functions

def window(call: str) -> WindowTvf:
    (query,) = parse(f"SELECT * FROM TABLE({call})")
    assert isinstance(query, Query)
    node = query.expression.find(WindowTableFunction)
    assert node is not None
    return node.window


@pytest.mark.parametrize("call, expected", [
    ("TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)",
     WindowTvf(WindowKind.TUMBLE, "bid", "dateTime", size_ms=10_000)),
    ("TUMBLE(TABLE bid, DESCRIPTOR(ts), INTERVAL '1' HOUR, INTERVAL '-15' MINUTE)",
     WindowTvf(WindowKind.TUMBLE, "bid", "ts", size_ms=3_600_000, offset_ms=-900_000)),
    ("HOP(TABLE bid, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND)",
     WindowTvf(WindowKind.HOP, "bid", "ts", size_ms=10_000, slide_ms=2_000)),
    ("CUMULATE(TABLE db.bid, DESCRIPTOR(ts), INTERVAL '1' MINUTE, INTERVAL '1' DAY)",
     WindowTvf(WindowKind.CUMULATE, "db.bid", "ts", size_ms=86_400_000, step_ms=60_000)),
    ("SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(ts), INTERVAL '0.5' SECOND)",
     WindowTvf(WindowKind.SESSION, "bid", "ts", gap_ms=500, partition_by=("bidder",))),
    ("SESSION(TABLE bid PARTITION BY (bidder, auction), DESCRIPTOR(ts), INTERVAL '5' MINUTE)",
     WindowTvf(WindowKind.SESSION, "bid", "ts", gap_ms=300_000,
               partition_by=("bidder", "auction"))),
    ("SESSION(TABLE bid, DESCRIPTOR(ts), INTERVAL '5' MINUTE)",
     WindowTvf(WindowKind.SESSION, "bid", "ts", gap_ms=300_000)),
    ("hop(DATA => TABLE bid, TIMECOL => DESCRIPTOR(ts), SIZE => INTERVAL '10' SECOND, "
     "SLIDE => INTERVAL '5' SECOND)",
     WindowTvf(WindowKind.HOP, "bid", "ts", size_ms=10_000, slide_ms=5_000)),
])
def test_window_table_functions(call, expected):
    assert window(call) == expected


def test_windows_print_back_as_flink_sql():
    (query,) = parse("SELECT window_start, COUNT(*) FROM TABLE(SESSION(TABLE bid PARTITION BY "
                     "bidder, DESCRIPTOR(ts), INTERVAL '0.5' SECOND)) AS w "
                     "GROUP BY window_start, window_end")
    assert isinstance(query, Query)
    text = query.expression.sql(dialect=Flink)
    assert "TABLE(SESSION(TABLE `bid` PARTITION BY (`bidder`), DESCRIPTOR(`ts`), " \
           "INTERVAL '0.5' SECOND)) AS w" in text
    (again,) = parse(text)
    assert again == query


def test_windows_in_joins_and_subqueries():
    (query,) = parse("SELECT * FROM (SELECT * FROM TABLE(TUMBLE(TABLE a, DESCRIPTOR(ts), "
                     "INTERVAL '1' SECOND))) x JOIN TABLE(TUMBLE(TABLE b, DESCRIPTOR(ts), "
                     "INTERVAL '1' SECOND)) y ON x.k = y.k")
    assert isinstance(query, Query)
    found = query.expression.find_all(WindowTableFunction)
    assert sorted(n.window.table for n in found) == ["a", "b"]


# --- intervals

@pytest.mark.parametrize("interval, ms", [
    ("INTERVAL '10' SECOND", 10_000),
    ("INTERVAL '1' MINUTE", 60_000),
    ("INTERVAL '2' HOUR", 7_200_000),
    ("INTERVAL '1' DAY", 86_400_000),
    ("INTERVAL '0.5' SECOND", 500),
    ("INTERVAL '0.001' SECOND", 1),
    ("INTERVAL '5' SECONDS", 5_000),
    ("INTERVAL '-5' SECOND", -5_000),
    ("INTERVAL '1:30' MINUTE TO SECOND", 90_000),
    ("INTERVAL '1:30' HOUR TO MINUTE", 5_400_000),
    ("INTERVAL '1 02:03:04.5' DAY TO SECOND", 93_784_500),
])
def test_interval_ms(interval, ms):
    assert interval_ms(sqlglot.parse_one(interval, dialect=Flink)) == ms


@pytest.mark.parametrize("interval, message", [
    ("INTERVAL '1' MONTH", "MONTH is not a fixed duration"),
    ("INTERVAL '1' YEAR", "YEAR is not a fixed duration"),
    ("INTERVAL '0.0005' SECOND", "not a whole number of milliseconds"),
    ("INTERVAL 'ten' SECOND", "does not read as SECOND"),
    ("INTERVAL '1:30' SECOND", "does not read as SECOND"),
    ("INTERVAL '1.5:30' MINUTE TO SECOND", "does not read as MINUTE TO SECOND"),
])
def test_interval_errors(interval, message):
    with pytest.raises(SqlError, match=message):
        interval_ms(sqlglot.parse_one(interval, dialect=Flink))


# --- errors

@pytest.mark.parametrize("text, message", [
    ("SELECT a FROM t WHERE", "line 1, column 22: expected an expression after WHERE"),
    ("CREATE TABLE t (\n  a BIGINT,\n  b BIGINT\n  WITH ('x' = 'y')",
     "line 4, column 19: expected ')' at the end"),
    ("SELECT 1;\nSELECT a b c FROM t", "line 2, column 12: unexpected 'c'"),
    ("SELECT a FROM t JOIN", "line 1, column 21: expected table name at the end"),
    ("SELECT CASE WHEN a THEN 1 FROM t", "line 1, column 25: Expected END after CASE"),
    ("SELECT 'abc", "line 1, column 8: missing the closing '"),
    ("SELECT a FROM t WHERE a = \"b\"", "line 1, column 27: unexpected character '\"' "
     "(strings are in single quotes, names in backticks)"),
    # types
    ("CREATE TABLE t (\n  a BIGINT,\n  b FOOBAR\n)",
     "line 3, column 3: unknown column type FOOBAR (column 'b')"),
    ("CREATE TABLE t (a ROW<x TIME>)", "line 1, column 17: unknown column type TIME"),
    ("CREATE TABLE t (a CHAR(3))", "unknown column type CHAR(3)"),
    ("CREATE TABLE t (a BIGINT,\n  ts TIMESTAMP(3) METADATA FROM 'timestamp')",
     "line 2, column 19: metadata columns (METADATA [FROM ...] [VIRTUAL]) are not supported"),
    ("CREATE TABLE t (a BIGINT, PRIMARY KEY (b) NOT ENFORCED)", "'b' is not a column of t"),
    ("CREATE TABLE t (a BIGINT) WITH ('k' = '1', 'k' = '2')", "option 'k' given twice"),
    # statements
    ("SET 'a' = 'b'", "line 1, column 1: unsupported statement SET"),
    ("SELECT 1;\n  DROP TABLE t", "line 2, column 3: unsupported statement DROP"),
    ("INSERT INTO t VALUES (1)", "INSERT needs a SELECT"),
    ("BEGIN STATEMENT SET;\nINSERT INTO a SELECT 1;", "line 1, column 1: statement set not "
     "closed by END"),
    ("BEGIN STATEMENT SET;\nSELECT 1;\nEND;", "line 2, column 1: a statement set holds "
     "INSERT statements only"),
    ("END;", "END without BEGIN STATEMENT SET"),
    ("BEGIN STATEMENT SET;\nEND;", "line 2, column 1: a statement set needs an INSERT"),
    ("EXPLAIN", "line 1, column 8: expected a statement after EXPLAIN"),
    # window table functions
    ("SELECT * FROM TABLE(FOO(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
     "line 1, column 21: expected TUMBLE, HOP, CUMULATE or SESSION"),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts)))", "TUMBLE needs SIZE"),
    ("SELECT * FROM TABLE(\n  HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
     "line 2, column 3: HOP needs SIZE"),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t PARTITION BY k, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
     "column 28: TUMBLE takes no PARTITION BY"),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), 10))",
     "column 53: expected TABLE <name>, DESCRIPTOR"),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MONTH))",
     "column 53: interval unit MONTH is not a fixed duration"),
    ("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '0' SECOND))",
     "TUMBLE's SIZE must be positive"),
    ("SELECT * FROM TABLE(TUMBLE(DESCRIPTOR(ts), TABLE t, INTERVAL '1' SECOND))",
     "column 28: TUMBLE's DATA is TABLE <name>"),
    ("SELECT * FROM TABLE(SESSION(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, "
     "INTERVAL '1' SECOND))", "SESSION takes (DATA, TIMECOL, GAP): unexpected argument"),
])
def test_errors(text, message):
    with pytest.raises(SqlError) as raised:
        parse(text)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert "\n" not in str(raised.value)  # one line


def test_errors_carry_the_place():
    with pytest.raises(SqlError) as raised:
        parse("SELECT 1;\n\nSELECT a FROM t WHERE")
    assert (raised.value.line, raised.value.column) == (3, 22)


def test_expressions_keep_flinks_meaning():
    (query,) = parse("SELECT REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2), ROW(1, 2), "
                     "CAST(x AS ROW<a INT, b STRING>), DATE_FORMAT(ts, 'yyyy-MM-dd') FROM t")
    assert isinstance(query, Query)
    extract, row, cast, date_format = query.expression.expressions
    assert isinstance(extract, exp.RegexpExtract) and extract.args["group"].name == "2"
    assert isinstance(row, exp.Anonymous) and row.name == "ROW"  # a constructor, not a type
    assert cast.sql(dialect=Flink) == "CAST(x AS ROW<a INT, b STRING>)"
    # the Java date pattern as written (the planner reads it as Flink does)
    assert date_format.sql(dialect=Flink) == "DATE_FORMAT(ts, 'yyyy-MM-dd')"
