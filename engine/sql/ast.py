"""The typed statements of raystream's SQL: what :func:`raystream.engine.sql.parse` returns
and the planner reads.

DDL is typed all the way down (column types, options, the watermark). A query stays a
sqlglot expression tree (the planner walks it), except for the window table functions,
which are :class:`WindowTvf` values inside it, so that no later code reads SQL text.
Names are as written (Flink's identifiers are case-sensitive); a qualified name is dotted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sqlglot import exp


class TypeName(Enum):
    """A column type that is not ROW, ARRAY or MAP (Flink's names)."""

    BOOLEAN = "BOOLEAN"
    TINYINT = "TINYINT"
    SMALLINT = "SMALLINT"
    INT = "INT"
    BIGINT = "BIGINT"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    DECIMAL = "DECIMAL"
    VARCHAR = "VARCHAR"  # STRING is VARCHAR without a length
    BYTES = "BYTES"  # VARBINARY and BINARY of any length too
    DATE = "DATE"
    TIMESTAMP = "TIMESTAMP"
    TIMESTAMP_LTZ = "TIMESTAMP_LTZ"


@dataclass(frozen=True)
class ScalarType:
    """``precision``: DECIMAL's precision, TIMESTAMP's fractional digits or VARCHAR's
    length; ``scale``: DECIMAL's. Flink's defaults are filled in (DECIMAL(10, 0),
    TIMESTAMP(6)); a VARCHAR without a length (STRING) has none."""

    name: TypeName
    precision: int | None = None
    scale: int | None = None


@dataclass(frozen=True)
class RowField:
    name: str
    type: SqlType


@dataclass(frozen=True)
class RowType:
    fields: tuple[RowField, ...]


@dataclass(frozen=True)
class ArrayType:
    element: SqlType


@dataclass(frozen=True)
class MapType:
    key: SqlType
    value: SqlType


SqlType = ScalarType | RowType | ArrayType | MapType


@dataclass(frozen=True)
class PhysicalColumn:
    name: str
    type: SqlType
    nullable: bool = True


@dataclass(frozen=True)
class ComputedColumn:
    """``name AS expression``: computed from the physical columns, never stored."""

    name: str
    expression: exp.Expr


Column = PhysicalColumn | ComputedColumn


@dataclass(frozen=True)
class Watermark:
    """``WATERMARK FOR column AS expression``: ``column`` becomes the rowtime attribute."""

    column: str
    expression: exp.Expr


class FunctionLanguage(Enum):
    JAVA = "JAVA"
    SCALA = "SCALA"
    PYTHON = "PYTHON"


@dataclass(frozen=True)
class CreateTable:
    """``options``: the ``WITH`` pairs in the order written (keys unique)."""

    name: str
    columns: tuple[Column, ...]
    watermark: Watermark | None = None
    primary_key: tuple[str, ...] = ()
    partitioned_by: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    temporary: bool = False
    if_not_exists: bool = False

    def option(self, key: str, default: str | None = None) -> str | None:
        return next((value for k, value in self.options if k == key), default)


@dataclass(frozen=True)
class CreateView:
    name: str
    query: exp.Query
    temporary: bool = False
    if_not_exists: bool = False


@dataclass(frozen=True)
class CreateFunction:
    """``CREATE [TEMPORARY [SYSTEM]] FUNCTION name AS 'module.func' [LANGUAGE ...]``;
    ``target`` is the quoted name (a Python function's module path, or a Java class)."""

    name: str
    target: str
    language: FunctionLanguage = FunctionLanguage.JAVA  # Flink's default
    temporary: bool = False
    system: bool = False
    if_not_exists: bool = False


@dataclass(frozen=True)
class Insert:
    table: str
    query: exp.Query
    columns: tuple[str, ...] = ()  # INSERT INTO t (a, b) ...; empty: all, in order
    overwrite: bool = False


@dataclass(frozen=True)
class StatementSet:
    """``EXECUTE STATEMENT SET BEGIN ... END`` (or ``BEGIN STATEMENT SET; ... END;``):
    the inserts run as one job."""

    inserts: tuple[Insert, ...]


@dataclass(frozen=True)
class Query:
    """A SELECT (or UNION, ...) on its own."""

    expression: exp.Query


@dataclass(frozen=True)
class Explain:
    statement: Statement


Statement = (CreateTable | CreateView | CreateFunction | Insert | StatementSet | Query
             | Explain)


class WindowKind(Enum):
    TUMBLE = "TUMBLE"
    HOP = "HOP"
    CUMULATE = "CUMULATE"
    SESSION = "SESSION"


@dataclass(frozen=True)
class WindowTvf:
    """A window table function, ``TABLE(TUMBLE(TABLE bid, DESCRIPTOR(ts), INTERVAL ...))``.

    The durations are milliseconds; those the kind has are set, the others are None:
    TUMBLE ``size_ms``; HOP ``slide_ms`` and ``size_ms``; CUMULATE ``step_ms`` and
    ``size_ms``; SESSION ``gap_ms`` (and ``partition_by``). ``offset_ms`` shifts the
    windows' starts (Flink's optional last argument; not for SESSION).
    """

    kind: WindowKind
    table: str
    time_column: str
    size_ms: int | None = None
    slide_ms: int | None = None
    step_ms: int | None = None
    gap_ms: int | None = None
    offset_ms: int = 0
    partition_by: tuple[str, ...] = ()
