"""What every connector is: its name, its options, a scan (:class:`ScanSpec`) if it
reads, a sink if it writes. Each connector checks a table when it is created (an unknown
option, a missing one: one line naming it, before any actor starts)."""

from __future__ import annotations

import difflib
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.catalog import TableEntry

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle
    from raystream.engine.sql.schema import RelSchema


@dataclass(frozen=True)
class ScanSpec:
    """One scan of a table: the relation it yields (with the constants the connector
    knows), how to add its source to a job, and its line in EXPLAIN."""

    schema: "RelSchema"
    build: Callable[["StreamEnvironment"], "DataStream"]
    description: str


class Connector(ABC):
    """A connector: its name, its options (``required`` ones must be given), whether it
    reads and writes."""

    name: str = ""
    options: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()

    def check(self, table: TableEntry) -> None:
        """Raise a ``SqlError`` for an option or a column this connector cannot take."""
        given = {key for key, _ in table.definition.options} - {"connector"}
        where = f"CREATE TABLE {table.name}"
        for key in sorted(given - self.options):
            known = ", ".join(sorted(self.options)) or "none"
            close = difflib.get_close_matches(key, sorted(self.options), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SqlError(f"{where}: connector {self.name!r} has no option {key!r} (its "
                           f"options: {known}){hint}")
        for key in sorted(self.required - given):
            raise SqlError(f"{where}: connector {self.name!r} needs option {key!r}")

    def scan(self, table: TableEntry, conditions: tuple[exp.Expr, ...]) -> ScanSpec:
        raise SqlError(f"table {table.name!r} (connector {self.name!r}) cannot be read: "
                       f"it is a sink")

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        raise SqlError(f"table {table.name!r} (connector {self.name!r}) cannot be written: "
                       f"it is a source")
