"""The ``datagen`` SQL connector: rows generated from their row number, with Flink's
options: ``rows-per-second`` (default 10000), ``number-of-rows``, and per field
``fields.<f>.kind`` (``random``, the default, or ``sequence``), ``fields.<f>.min`` and
``.max`` (random numbers, inclusive), ``.length`` (random strings, default 100),
``.start`` and ``.end`` (sequences, both required) and ``.max-past`` (random
timestamps, a duration: at most that long before the time the statement was planned).

The table is bounded where ``number-of-rows`` is given or a field is a sequence: it
ends with the first of them to end (a sequence has no values past its end). Each value is a pure function of the
row number, the field and the table (a sequence's ``start + i``; a random value a
64-bit hash of them, made for a whole batch with numpy), so a source's position in a
checkpoint is all its state: a restore goes on from it, and the rows read again are
the ones read before. Flink's random values differ from run to run; these do not.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=1)
    >>> env.sql('''CREATE TABLE g (id BIGINT, score INT) WITH ('connector' = 'datagen',
    ...     'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '5',
    ...     'fields.score.min' = '0', 'fields.score.max' = '9', 'number-of-rows' = '3')''')
    SqlResult(sinks=[])
    >>> env.sql_query("SELECT id FROM g").explain()
    'Calc(select=[id])\\n  TableSourceScan(table=[g], datagen (3 rows), fields=[id, score])'
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sources.sequence import Sequence
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.connector_base import Connector, ScanSpec, duration_ms
from raystream.engine.sql.scan_source import ShapedSource, SqlWatermark, TableShape

_TABLE_OPTIONS = frozenset({"rows-per-second", "number-of-rows"})
_FIELD_OPTIONS = frozenset({"kind", "min", "max", "length", "start", "end", "max-past"})
UNBOUNDED = 1 << 62  # rows of an unbounded table (its source never gets there)
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
                          dtype=np.uint8)


@dataclass(frozen=True)
class FieldGenerator:
    """How one column's values are made: a ``sequence`` from ``start`` to ``end``, or
    ``random`` (numbers within ``low``..``high``, strings of ``length``, timestamps up to
    ``max_past_ms`` before ``now_ms``), hashed with ``salt``."""

    name: str
    type: pa.DataType
    sequence: bool
    low: float | int | None = None
    high: float | int | None = None
    length: int = 100
    max_past_ms: int = 0
    now_ms: int = 0
    salt: int = 0

    def values(self, i: np.ndarray) -> pa.Array:
        t = self.type
        if self.sequence:
            assert self.low is not None
            column = pa.array(i + int(self.low))
            return column.cast(pa.string()) if pa.types.is_string(t) else column.cast(t)
        h = _hash(i, self.salt)
        if pa.types.is_boolean(t):
            return pa.array((h & np.uint64(1)).astype(bool))
        if pa.types.is_integer(t):
            assert self.low is not None and self.high is not None
            span = int(self.high) - int(self.low) + 1
            values = (h % np.uint64(span)).astype(np.int64) + int(self.low) if span < 1 << 63 \
                else h.view(np.int64)
            return pa.array(values).cast(t)
        if pa.types.is_floating(t) or pa.types.is_decimal(t):
            assert self.low is not None and self.high is not None
            unit = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
            return pa.array(float(self.low) + unit * (float(self.high) - float(self.low))).cast(
                t, safe=False)
        if pa.types.is_timestamp(t):
            past = (h % np.uint64(self.max_past_ms + 1)).astype(np.int64)
            return pa.array(self.now_ms - past).cast(pa.timestamp("ms")).cast(t)
        # a string of ``length`` characters: one hash per character of each row
        chars = _hash(np.repeat(h.view(np.int64), self.length)
                      + np.tile(np.arange(self.length, dtype=np.int64), len(i)), self.salt)
        data = _ALPHABET[(chars % np.uint64(len(_ALPHABET))).astype(np.int64)]
        offsets = np.arange(len(i) + 1, dtype=np.int32) * self.length
        return pa.StringArray.from_buffers(len(i), pa.py_buffer(offsets), pa.py_buffer(data))


def _hash(i: np.ndarray, salt: int) -> np.ndarray:
    """SplitMix64 of ``i + salt``: a well-mixed 64-bit value per row number."""
    with np.errstate(over="ignore"):
        z = i.astype(np.uint64) + np.uint64(salt) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Rows:
    """The columns of rows ``i`` (a Sequence source's function), at most
    ``rows_per_second`` per split: a batch waits for its share of the rate."""

    fields: tuple[FieldGenerator, ...]
    rows_per_second: float

    def __call__(self, i: np.ndarray) -> dict[str, pa.Array]:
        if self.rows_per_second and len(i):
            time.sleep(len(i) / self.rows_per_second)
        return {f.name: f.values(i) for f in self.fields}


class Datagen(Connector):
    name = "datagen"
    options = _TABLE_OPTIONS

    def check(self, table: TableEntry) -> None:
        where = f"CREATE TABLE {table.name}"
        names = set(table.physical.names)
        known = sorted([*_TABLE_OPTIONS, *(f"fields.<column>.{o}" for o in _FIELD_OPTIONS)])
        for key, _ in table.definition.options:
            if key in ("connector", *_TABLE_OPTIONS):
                continue
            parts = key.split(".")
            if not (len(parts) == 3 and parts[0] == "fields" and parts[2] in _FIELD_OPTIONS):
                raise SqlError(f"{where}: connector 'datagen' has no option {key!r} (its "
                               f"options: {', '.join(known)})")
            if parts[1] not in names:
                raise SqlError(f"{where}: option {key!r} names no physical column (the "
                               f"table's: {', '.join(table.physical.names)})")
        self._generators(table, now_ms=0)

    def _generators(self, table: TableEntry, now_ms: int) -> tuple[FieldGenerator, ...]:
        out = []
        for f in table.physical.fields:
            def option(name: str, f=f) -> str | None:
                return table.definition.option(f"fields.{f.name}.{name}")
            where = f"CREATE TABLE {table.name}: column {f.name}"
            kind = option("kind") or "random"
            if kind not in ("random", "sequence"):
                raise SqlError(f"{where}: 'fields.{f.name}.kind' is random or sequence, "
                               f"not {kind!r}")
            t = f.type
            salt = zlib.crc32(f"{table.name}.{f.name}".encode()) << 20
            if kind == "sequence":
                start, end = option("start"), option("end")
                if start is None or end is None:
                    raise SqlError(f"{where}: a sequence needs 'fields.{f.name}.start' and "
                                   f"'fields.{f.name}.end'")
                if not (pa.types.is_integer(t) or pa.types.is_string(t)):
                    raise SqlError(f"{where}: a sequence is of an integer or a string column, "
                                   f"not {t}")
                low, high = _int(start, where), _int(end, where)
                if high < low:
                    raise SqlError(f"{where}: the sequence's end {high} is before its start {low}")
                out.append(FieldGenerator(f.name, t, True, low, high, salt=salt))
                continue
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
                cast = int if pa.types.is_integer(t) else float
                lo, hi = option("min"), option("max")
                default = (np.iinfo(t.to_pandas_dtype()) if pa.types.is_integer(t) else None)
                low = _number(lo, where, cast) if lo is not None else (
                    int(default.min) if default is not None else 0.0)
                high = _number(hi, where, cast) if hi is not None else (
                    int(default.max) if default is not None else 1.0)
                if high < low:
                    raise SqlError(f"{where}: 'fields.{f.name}.max' {high} is below its min {low}")
                out.append(FieldGenerator(f.name, t, False, low, high, salt=salt))
            elif pa.types.is_string(t):
                length = _int(option("length") or "100", where)
                out.append(FieldGenerator(f.name, t, False, length=length, salt=salt))
            elif pa.types.is_timestamp(t):
                past = option("max-past")
                out.append(FieldGenerator(
                    f.name, t, False, now_ms=now_ms, salt=salt,
                    max_past_ms=duration_ms(past, f"{where}: 'fields.{f.name}.max-past'")
                    if past else 0))
            elif pa.types.is_boolean(t):
                out.append(FieldGenerator(f.name, t, False, salt=salt))
            else:
                raise SqlError(f"{where}: datagen makes no values of type {t}")
        return tuple(out)

    def scan(self, table: TableEntry, conditions: tuple[exp.Expr, ...]) -> ScanSpec:
        # (random timestamps are before the time the statement is planned: one instant,
        # so that a restored source makes the same rows again)
        fields = self._generators(table, now_ms=int(time.time() * 1000))
        definition = table.definition
        where = f"CREATE TABLE {table.name}"
        rate = _number(definition.option("rows-per-second") or "10000", where, float)
        limit = definition.option("number-of-rows")
        lengths = [int(f.high or 0) - int(f.low or 0) + 1 for f in fields if f.sequence]
        if limit is not None:
            lengths.append(_int(limit, where))
        n = min(lengths) if lengths else UNBOUNDED  # (a sequence ends where it ends)
        splits = 4 if n >= 4 * 1024 else 1
        source = ShapedSource(
            Sequence(n, columns=Rows(fields, rate / splits), batch_size=1024, num_splits=splits),
            TableShape.of(table), table.schema.names)
        rowtime, delay = table.schema.rowtime, table.watermark_delay_ms

        def build(env):
            watermarks = None if rowtime is None else SqlWatermark(rowtime, delay_ms=delay or 0)
            return env.from_source(source, name=table.name, watermarks=watermarks)
        rows = "unbounded" if n == UNBOUNDED else f"{n} rows"
        return ScanSpec(table.schema, build, f"datagen ({rows})")


def _number(text: str, where: str, cast: type) -> float | int:
    try:
        return cast(text)
    except ValueError:
        raise SqlError(f"{where}: {text!r} is not a number") from None


def _int(text: str, where: str) -> int:
    value = _number(text, where, int)
    assert isinstance(value, int)
    return value
