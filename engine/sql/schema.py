"""What a relation of a plan holds: its fields in order, which one is its rowtime (event
time) attribute, and which are constants the planner knows (a connector's pushed-down
filter, ``event_type = 2``, makes ``event_type`` one), so that expressions over them fold.

Every row of a relation is an insert for now: :class:`ChangelogMode` gives the row kind
its place in the plan, for the updating queries to come.

    >>> import pyarrow as pa
    >>> s = RelSchema((Field("a", pa.int64()), Field("ts", pa.timestamp("ms"))), rowtime="ts")
    >>> s.field("ts").type, s.names
    (TimestampType(timestamp[ms]), ('a', 'ts'))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import pyarrow as pa


class ChangelogMode(Enum):
    """The row kinds a relation's rows may have (Flink's changelog modes)."""

    INSERT_ONLY = "insert-only"


@dataclass(frozen=True)
class Field:
    """A column; ``constant``: the value every row has, where the planner knows it (as a
    Python value; None is SQL NULL only with ``is_constant``); ``nullable``: False where
    no row can be NULL (a NOT NULL column, a connector's promise)."""

    name: str
    type: pa.DataType
    constant: Any = None
    is_constant: bool = False
    nullable: bool = True


@dataclass(frozen=True)
class WindowAttributes:
    """The columns that hold each row's window (Flink's window properties): the rows of
    a window aggregation, and what keeps both columns of them. A GROUP BY or a JOIN on
    them is per window: it fires when the window ends."""

    start: str
    end: str


@dataclass(frozen=True)
class RelSchema:
    fields: tuple[Field, ...]
    rowtime: str | None = None
    changelog: ChangelogMode = ChangelogMode.INSERT_ONLY
    window: WindowAttributes | None = None
    proctime: str | None = None  # a PROCTIME() column: windows over it are on the clock

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(f.name == name for f in self.fields)

    def arrow(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, f.type) for f in self.fields])

    def with_rowtime(self, rowtime: str | None) -> "RelSchema":
        return replace(self, rowtime=rowtime)

    def with_window(self, window: WindowAttributes | None) -> "RelSchema":
        return replace(self, window=window)
