"""A StreamEnvironment's SQL: its catalog, and the statements run against it
(``env.sql``, ``env.sql_query``, ``env.create_temporary_view``).

DDL changes the catalog at once. An ``INSERT INTO`` (or each of a statement set's) is
planned whole and then added to the environment's job, as the DataStream API's sinks
are: ``env.execute(...)`` runs it, with the DataStream operators built beside it. So a
statement that does not plan adds nothing.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> result = env.sql('''
    ...     CREATE TABLE gen (event_type INT, bid ROW<auction BIGINT, price BIGINT>)
    ...         WITH ('connector' = 'nexmark', 'events.num' = '10000');
    ...     CREATE TABLE out (auction BIGINT, price BIGINT) WITH ('connector' = 'collect');
    ...     INSERT INTO out SELECT bid.auction, bid.price FROM gen
    ...         WHERE event_type = 2 AND MOD(bid.auction, 10) = 0;''')
    >>> result
    SqlResult(sinks=['out'])
    >>> rows = env.execute("q2").table(result["out"])  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import pyarrow as pa

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import assignable, sql_type_of, type_name
from raystream.engine.sql.ast import (CreateFunction, CreateTable, CreateView, Explain,
                                      FunctionLanguage, Insert, Query, Statement, StatementSet)
from raystream.engine.sql.catalog import Catalog, StreamEntry, TableEntry, ViewEntry, table_entry
from raystream.engine.sql.compiled import cast_to, column_ref, literal
from raystream.engine.sql.connectors import connector_of
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.parser import parse
from raystream.engine.sql.plan import Calc, Node, Sink, explain
from raystream.engine.sql.planner import Planner
from raystream.engine.sql.schema import Field, RelSchema
from raystream.engine.sql.translate import Translator
from raystream.engine.sql.udf import ScalarFunction, imported

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle


@dataclass(frozen=True)
class SqlResult:
    """What one ``env.sql`` call did: the sinks its INSERTs added, by table name (a
    ``collect`` table's rows are ``job_result.table(result["name"])``), and the plan an
    ``EXPLAIN`` printed."""

    sinks: Mapping[str, "SinkHandle"] = field(default_factory=dict)
    explained: str | None = None
    collected: tuple[str, ...] = ()  # the sinks' tables whose rows go to Python (collect)

    def __getitem__(self, table: str) -> "SinkHandle":
        try:
            return self.sinks[table]
        except KeyError:
            raise KeyError(f"no INSERT INTO {table!r} in this statement (its sinks: "
                           f"{', '.join(self.sinks) or 'none'})") from None

    def __repr__(self) -> str:
        explained = "" if self.explained is None else ", explained=..."
        return f"SqlResult(sinks={list(self.sinks)}{explained})"


class Table:
    """A SELECT planned on an environment (``env.sql_query``): its columns, its plan, and
    its rows as a DataStream to go on with."""

    def __init__(self, session: "SqlSession", node: Node, name: str) -> None:
        self._session, self._node, self._name = session, node, name

    @property
    def schema(self) -> pa.Schema:
        return self._node.schema.arrow()

    def explain(self) -> str:
        """The plan, one node per line."""
        return explain(self._node)

    def to_stream(self) -> "DataStream":
        """The rows as a DataStream (of Arrow batches with the table's columns)."""
        return Translator(self._session.env, self._name, self._session.scans).stream(self._node)


class SqlSession:
    def __init__(self, env: "StreamEnvironment") -> None:
        self.env = env
        self.catalog = Catalog()
        self.planner = Planner(self.catalog)
        self._queries = 0
        self.scans: dict[tuple, DataStream] = {}  # (the job's sources, see Translator)

    def execute(self, text: str) -> SqlResult:
        sinks: dict[str, SinkHandle] = {}
        collected: list[str] = []
        explained = None
        for statement in parse(text):
            if isinstance(statement, Explain):
                explained = self.explain(statement.statement)
                print(explained)
            elif isinstance(statement, (Insert, StatementSet)):
                inserts = statement.inserts if isinstance(statement, StatementSet) else (statement,)
                plans = [self.plan_insert(i) for i in inserts]  # all planned before any is added
                for plan in plans:
                    sinks[plan.table.name] = Translator(self.env, plan.table.name,
                                                        self.scans).sink(plan)
                    if plan.connector.name == "collect":
                        collected.append(plan.table.name)
            else:
                self.define(statement)
        return SqlResult(sinks, explained, tuple(collected))

    def define(self, statement: Statement) -> None:
        if isinstance(statement, CreateTable):
            entry = table_entry(statement)
            connector_of(entry)  # (checks the options and columns)
            self.catalog.add(entry, if_not_exists=statement.if_not_exists)
        elif isinstance(statement, CreateView):
            self.planner.query(statement.query)  # (a view that does not plan is refused now)
            self.catalog.add(ViewEntry(statement.name, statement.query),
                             if_not_exists=statement.if_not_exists)
        elif isinstance(statement, CreateFunction):
            if statement.language is not FunctionLanguage.PYTHON:
                raise SqlError(f"CREATE FUNCTION {statement.name}: raystream runs Python "
                               f"functions (LANGUAGE PYTHON), not {statement.language.value}")
            self.add_function(statement.name, imported(statement.target, statement.name),
                              if_not_exists=statement.if_not_exists)
        elif isinstance(statement, Query):
            raise SqlError("a SELECT on its own: use env.sql_query(...) for its rows, or "
                           "INSERT INTO a table")
        else:
            raise SqlError(f"raystream's SQL cannot run a {type(statement).__name__} here")

    def query(self, text: str) -> Table:
        statements = parse(text)
        if len(statements) != 1 or not isinstance(statements[0], Query):
            raise SqlError("sql_query takes one SELECT (DDL and INSERTs go to env.sql)")
        self._queries += 1
        return Table(self, self.planner.query(statements[0].expression), f"query-{self._queries}")

    def explain(self, statement: Statement) -> str:
        if isinstance(statement, Insert):
            return explain(self.plan_insert(statement))
        if isinstance(statement, StatementSet):
            return "\n".join(explain(self.plan_insert(i)) for i in statement.inserts)
        if isinstance(statement, Query):
            return explain(self.planner.query(statement.expression))
        raise SqlError(f"EXPLAIN takes a query or an INSERT, not a {type(statement).__name__}")

    def plan_insert(self, insert: Insert) -> Sink:
        entry = self.catalog.get(insert.table)
        if not isinstance(entry, TableEntry):
            raise SqlError(f"INSERT INTO {insert.table}: it is a view, not a table")
        connector = connector_of(entry)
        connector.check_sink(entry)
        node = self.planner.query(insert.query)
        return Sink(entry, connector, _cast_to_table(node, entry, insert.columns))

    def add_function(self, name: str, function: ScalarFunction, *,
                     if_not_exists: bool = False) -> None:
        if not isinstance(function, ScalarFunction):
            raise SqlError(f"function {name!r}: make it a SQL function with "
                           f"@raystream.udf(result_type=...)")
        key = name.lower()  # (function names are not case-sensitive)
        if key in self.catalog.functions and not if_not_exists:
            raise SqlError(f"a function named {name!r} exists already")
        self.catalog.functions.setdefault(key, function)

    def register_stream(self, name: str, stream: "DataStream", schema: pa.Schema,
                        rowtime: str | None) -> None:
        fields = []
        for f in schema:
            sql_type_of(f.type, column=f.name)  # (a type SQL has no name for is refused)
            fields.append(Field(f.name, f.type, nullable=f.nullable))
        if rowtime is not None and rowtime not in schema.names:
            raise SqlError(f"create_temporary_view({name!r}, rowtime={rowtime!r}): the schema "
                           f"has no column {rowtime!r} (its columns: {', '.join(schema.names)})")
        missing = [c for c in schema.names if stream.columns is not None and c not in stream.columns]
        if missing:
            raise SqlError(f"create_temporary_view({name!r}): the stream has no column "
                           f"{missing[0]!r} (its columns: {', '.join(stream.columns or ())})")
        self.catalog.add(StreamEntry(name, stream, RelSchema(tuple(fields), rowtime=rowtime)))


def _cast_to_table(node: Node, table: TableEntry, columns: tuple[str, ...]) -> Node:
    """``node``'s rows as ``table``'s physical columns, in order, each cast to its type
    (an INSERT's implicit cast; one that is not allowed names the column)."""
    targets = table.physical.fields
    names = list(columns) or [f.name for f in targets]
    source = node.schema.fields
    if len(source) != len(names):
        raise SqlError(f"INSERT INTO {table.name}: the query has {len(source)} columns, the "
                       f"table takes {len(names)} ({', '.join(names)})")
    by_name = {f.name: f for f in targets}
    scope = Scope(node.schema)
    given = {}
    for name, column in zip(names, source):
        target = by_name.get(name)
        if target is None:
            raise SqlError(f"INSERT INTO {table.name} ({name}): the table has no column {name!r}")
        if not assignable(column.type, target.type):
            raise SqlError(f"INSERT INTO {table.name}: column {name} is {type_name(target.type)}; "
                           f"the query's {column.name} is {type_name(column.type)} (CAST it)")
        compiled = compile_expression(column_ref(column.name), scope)
        # (exactly the declared type: a dictionary of strings is decoded for a VARCHAR)
        given[name] = cast_to(compiled, target.type, explicit=compiled.type != target.type)
    projections = []
    for target in targets:
        if target.name in given:
            projections.append((target.name, given[target.name]))
        else:  # a column the INSERT does not name is NULL
            projections.append((target.name, cast_to(literal(None, pa.null(), "NULL"),
                                                     target.type)))
    return Calc(node, None, tuple(projections),
                RelSchema(tuple(Field(n, c.type, nullable=c.nullable) for n, c in projections)))
