"""The names a SQL session knows: tables (``CREATE TABLE``, with their connector), views
(``CREATE VIEW``, kept as their query and planned where they are read, as Flink inlines
them), DataStreams registered as tables (``env.create_temporary_view``) and functions.

A table's schema is worked out when it is created: its physical columns as Arrow types,
its computed columns typed by compiling them, its rowtime attribute from its
``WATERMARK``. An error in any of them is raised by the ``CREATE``, not by a later query.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.compiled import sql_text
from raystream.engine.sql.arrow_types import arrow_type, is_temporal, type_name
from raystream.engine.sql.ast import ComputedColumn, CreateTable, PhysicalColumn
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.intervals import interval_ms
from raystream.engine.sql.schema import Field, RelSchema

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream


@dataclass(frozen=True)
class TableEntry:
    """A ``CREATE TABLE``: ``schema`` holds every column (computed ones after the
    physical ones they read, in the order written), ``watermark_delay_ms`` how far the
    watermark trails the rowtime (``WATERMARK FOR ts AS ts - INTERVAL ...``)."""

    definition: CreateTable
    schema: RelSchema
    watermark_delay_ms: int | None

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def physical(self) -> RelSchema:
        names = {c.name for c in self.definition.columns if isinstance(c, PhysicalColumn)}
        return RelSchema(tuple(f for f in self.schema.fields if f.name in names))


@dataclass(frozen=True)
class ViewEntry:
    name: str
    query: exp.Query


@dataclass(frozen=True)
class StreamEntry:
    """A DataStream read as a table; ``rowtime`` is its event-time column, if any."""

    name: str
    stream: "DataStream"
    schema: RelSchema


Entry = TableEntry | ViewEntry | StreamEntry


def table_entry(definition: CreateTable) -> TableEntry:
    """The entry of a ``CREATE TABLE`` (its columns typed, its watermark checked)."""
    fields: list[Field] = []
    computed: list[ComputedColumn] = []
    for column in definition.columns:
        if isinstance(column, PhysicalColumn):
            fields.append(Field(column.name, arrow_type(column.type), nullable=column.nullable))
        else:
            computed.append(column)
    seen: set[str] = set()
    for f in fields:
        if f.name in seen:
            raise SqlError(f"CREATE TABLE {definition.name}: column {f.name!r} twice")
        seen.add(f.name)
    for column in computed:  # typed over the physical columns (Flink: they read only those)
        scope = Scope(RelSchema(tuple(fields)))
        compiled = compile_expression(column.expression, scope)
        fields.append(Field(column.name, compiled.type, nullable=compiled.nullable))
    schema = RelSchema(tuple(fields))
    delay = None
    if definition.watermark is not None:
        watermark = definition.watermark
        if not schema.has(watermark.column):
            raise SqlError(f"CREATE TABLE {definition.name}: WATERMARK FOR {watermark.column}: "
                           f"no such column")
        column_type = schema.field(watermark.column).type
        if not is_temporal(column_type):
            raise SqlError(f"CREATE TABLE {definition.name}: the rowtime column "
                           f"{watermark.column!r} is {type_name(column_type)}, not a TIMESTAMP")
        delay = watermark_delay_ms(watermark.column, watermark.expression, definition.name)
        schema = schema.with_rowtime(watermark.column)
    for key in definition.primary_key:
        if not schema.has(key):
            raise SqlError(f"CREATE TABLE {definition.name}: PRIMARY KEY ({key}): no such column")
    return TableEntry(definition, schema, delay)


def watermark_delay_ms(column: str, expression: exp.Expr, table: str) -> int:
    """How far behind ``column`` a ``WATERMARK ... AS`` expression is: ``ts`` (0) or
    ``ts - INTERVAL '...' unit``; any other is an error naming it."""
    if isinstance(expression, exp.Column) and expression.name == column:
        return 0
    if (isinstance(expression, exp.Sub) and isinstance(expression.this, exp.Column)
            and expression.this.name == column and isinstance(expression.expression, exp.Interval)):
        return interval_ms(expression.expression)
    raise SqlError(f"CREATE TABLE {table}: WATERMARK FOR {column} AS {sql_text(expression)}: "
                   f"raystream takes `{column}` or `{column} - INTERVAL '...' SECOND` (a bounded "
                   f"delay)")


class Catalog:
    """Entries and functions by name (Flink's identifiers are case-sensitive)."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.functions: dict[str, Any] = {}

    def add(self, entry: Entry, *, if_not_exists: bool = False) -> None:
        if entry.name in self.entries:
            if if_not_exists:
                return
            raise SqlError(f"a table or view named {entry.name!r} exists already")
        self.entries[entry.name] = entry

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, list(self.entries), n=1)
            known = ", ".join(sorted(self.entries)) or "none yet"
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SqlError(f"no table or view named {name!r} (the known ones: {known}){hint}")
        return entry
