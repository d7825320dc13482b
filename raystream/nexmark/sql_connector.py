"""The ``nexmark`` SQL connector: the Nexmark generator as a table, as the Nexmark
project's ``ddl_gen.sql`` declares it (``event_type``, ``person``, ``auction`` and
``bid`` ROW columns, ``dateTime`` computed, a watermark) with its options:
``events.num``, ``first-event.rate``/``next-event.rate`` (one rate: the generator has
no rate change), ``person.proportion``, ``auction.proportion``, ``bid.proportion``, and
raystream's ``seed``, ``splits`` and ``batch-size`` (event numbers a source batch spans).

A ROW field reads the generator column of the same name in snake case (``dateTime`` is
``date_time``); a TIMESTAMP field holds the generator's milliseconds. A scan whose
query keeps one ``event_type`` (``WHERE event_type = 2``, as the ``bid`` view of
``ddl_views.sql`` does) generates that kind of event only, and its ``event_type`` and
other ROW columns are constants the planner folds; a scan of every kind is the union of
the three.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=1)
    >>> env.sql('''CREATE TABLE gen (event_type INT, bid ROW<auction BIGINT, `dateTime` TIMESTAMP(3)>)
    ...            WITH ('connector' = 'nexmark', 'events.num' = '1000')''')
    SqlResult(sinks=[])
    >>> env.sql_query("SELECT bid.auction FROM gen WHERE event_type = 2").schema.names
    ['auction']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.datastream import DataStream
from raystream.engine.environment import StreamEnvironment
from raystream.engine.errors import SqlError
from raystream.engine.sql.ast import ComputedColumn
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.compiled import as_array
from raystream.engine.sql.connector_base import Connector, ScanSpec
from raystream.engine.sql.connectors import register
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.scan_source import ShapedSource, SqlWatermark
from raystream.engine.sql.schema import Field, RelSchema
from raystream.nexmark.generator import SCHEMAS, EventKind, NexmarkConfig
from raystream.nexmark.source import NexmarkSource

KINDS = {0: EventKind.PERSON, 1: EventKind.AUCTION, 2: EventKind.BID}  # Nexmark's event_type
_ROWS = {kind.value: kind for kind in EventKind}  # the ROW column of each kind


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


@dataclass(frozen=True)
class _Shape:
    """A generator batch of ``kind`` as the scan's non-constant columns (``produced``): its
    ROW (the generator's columns, cast to the declared types), and where every kind is
    read, the ``event_type`` and the other ROWs (null); then the computed columns."""

    kind: EventKind
    code: int
    physical: RelSchema
    produced: RelSchema
    computed: tuple  # (name, Compiled) over the physical columns
    schema: RelSchema  # the scan's: every column, the constants too

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        columns: dict[str, pa.Array] = {}
        for f in self.physical.fields:
            if self.schema.field(f.name).is_constant:
                continue  # (the planner folds it; no batch holds it)
            if f.name == self.kind.value:
                columns[f.name] = pa.StructArray.from_arrays(
                    [_cast(batch.column(_snake(child.name)), child.type) for child in f.type],
                    fields=list(f.type))
            elif f.name == "event_type":
                columns[f.name] = pa.array(np.full(n, self.code, dtype=np.int32)).cast(f.type)
            else:
                columns[f.name] = pa.nulls(n, f.type)
        physical = pa.RecordBatch.from_pydict(columns)
        for name, compiled in self.computed:
            columns[name] = as_array(compiled.evaluate(physical), n)
        return pa.RecordBatch.from_pydict({f.name: columns[f.name] for f in self.produced.fields})


def _cast(column: pa.Array, target: pa.DataType) -> pa.Array:
    return column if column.type == target else pc.cast(column, target)  # pyright: ignore[reportAttributeAccessIssue]


def _physical(table: TableEntry) -> RelSchema:
    """The table's physical columns as the generator makes them: a VARCHAR field the
    generator makes a dictionary of strings (``channel``, ``url``) stays one."""
    fields = []
    for f in table.physical.fields:
        kind = _ROWS.get(f.name)
        if kind is not None:
            generated = SCHEMAS[kind]
            children = []
            for child in f.type:
                made = generated.field(_snake(child.name)).type
                keep = pa.types.is_dictionary(made) and pa.types.is_string(child.type)
                # (the generator makes no NULL)
                children.append(pa.field(child.name, made if keep else child.type,
                                         nullable=False))
            f = Field(f.name, pa.struct(children))
        fields.append(f)
    return RelSchema(tuple(fields))


class Nexmark(Connector):
    name = "nexmark"
    options = frozenset({"events.num", "first-event.rate", "next-event.rate", "person.proportion",
                         "auction.proportion", "bid.proportion", "seed", "splits", "batch-size"})
    required = frozenset({"events.num"})

    def check(self, table: TableEntry) -> None:
        super().check(table)
        self._config(table)
        for f in table.physical.fields:
            if f.name == "event_type":
                if not pa.types.is_integer(f.type):
                    raise SqlError(f"CREATE TABLE {table.name}: nexmark's event_type is an INT")
                continue
            kind = _ROWS.get(f.name)
            if kind is None or not pa.types.is_struct(f.type):
                raise SqlError(f"CREATE TABLE {table.name}: the nexmark connector has no column "
                               f"{f.name!r} (its columns: event_type INT, person ROW<...>, "
                               f"auction ROW<...>, bid ROW<...>)")
            generated = SCHEMAS[kind]
            for child in f.type:
                column = _snake(child.name)
                if column not in generated.names:
                    raise SqlError(f"CREATE TABLE {table.name}: nexmark's {f.name} has no field "
                                   f"{child.name!r} (its fields: {', '.join(generated.names)})")

    def _config(self, table: TableEntry) -> tuple[NexmarkConfig, int, int, int]:
        definition = table.definition

        def integer(key: str, default: int) -> int:
            value = definition.option(key)
            if value is None:
                return default
            try:
                return int(value)
            except ValueError:
                raise SqlError(f"CREATE TABLE {table.name}: option {key!r} must be an integer, "
                               f"not {value!r}") from None
        defaults = NexmarkConfig()
        rate = integer("first-event.rate", defaults.first_event_rate)
        if integer("next-event.rate", rate) != rate:
            raise SqlError(f"CREATE TABLE {table.name}: raystream's generator has one rate: "
                           f"give 'next-event.rate' the value of 'first-event.rate'")
        events = integer("events.num", 0)
        if events <= 0:
            raise SqlError(f"CREATE TABLE {table.name}: 'events.num' must be > 0 (the nexmark "
                           f"connector is bounded)")
        config = NexmarkConfig(
            seed=integer("seed", defaults.seed), first_event_rate=rate,
            person_proportion=integer("person.proportion", defaults.person_proportion),
            auction_proportion=integer("auction.proportion", defaults.auction_proportion),
            bid_proportion=integer("bid.proportion", defaults.bid_proportion))
        return config, events, integer("splits", 4), integer("batch-size", 65_536)

    def scan(self, table: TableEntry, conditions: tuple[exp.Expr, ...]) -> ScanSpec:
        code = next((c for c in map(_event_type, conditions) if c is not None), None)
        config, events, splits, batch_size = self._config(table)
        codes = [code] if code is not None else sorted(KINDS)
        shapes = [_shape(table, c, constant=code is not None) for c in codes]
        rowtime, delay = table.schema.rowtime, table.watermark_delay_ms

        def build(env: StreamEnvironment) -> DataStream:
            streams = []
            for shape in shapes:
                source = ShapedSource(NexmarkSource(shape.kind, events, config, num_splits=splits,
                                                    batch_size=batch_size),
                                      shape, shape.produced.names)
                watermarks = None if rowtime is None else SqlWatermark(rowtime, delay_ms=delay or 0)
                streams.append(env.from_source(source, name=f"{table.name}-{shape.kind.value}",
                                               watermarks=watermarks))
            return streams[0] if len(streams) == 1 else streams[0].union(*streams[1:])
        kinds = ", ".join(KINDS[c].value for c in codes)
        return ScanSpec(shapes[0].schema, build, f"nexmark {table.name} ({kinds}; {events} events)")


def _shape(table: TableEntry, code: int, *, constant: bool) -> _Shape:
    """How a scan of ``event_type = code`` shapes its batches; ``constant``: the scan reads
    that kind only (its ``event_type`` and other ROWs are constants, not columns)."""
    physical = _physical(table)
    fields = []
    for f in physical.fields:
        if constant and f.name == "event_type":
            f = Field(f.name, f.type, code, True)
        elif constant and f.name != KINDS[code].value:
            f = Field(f.name, f.type, None, True)
        elif constant:  # the kind read: never NULL
            f = Field(f.name, f.type, nullable=False)
        fields.append(f)
    computed = []
    for column in table.definition.columns:
        if isinstance(column, ComputedColumn):
            compiled = compile_expression(column.expression, Scope(RelSchema(tuple(fields))))
            computed.append((column.name, compiled))
            fields.append(Field(column.name, compiled.type, nullable=compiled.nullable))
    schema = RelSchema(tuple(fields), rowtime=table.schema.rowtime)
    produced = RelSchema(tuple(f for f in fields if not f.is_constant), rowtime=schema.rowtime)
    return _Shape(KINDS[code], code, physical, produced, tuple(computed), schema)


def _event_type(condition: exp.Expr) -> int | None:
    """N of a condition ``event_type = N`` (either way round), else None."""
    if not isinstance(condition, exp.EQ):
        return None
    for column, value in ((condition.this, condition.expression),
                          (condition.expression, condition.this)):
        if (isinstance(column, exp.Column) and column.name == "event_type"
                and isinstance(value, exp.Literal) and value.is_int and int(value.name) in KINDS):
            return int(value.name)
    return None


register(Nexmark())
