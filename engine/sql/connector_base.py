"""What every connector is: its name, its options, a scan (:class:`ScanSpec`) if it
reads, a sink if it writes. Each connector checks a table when it is created (an unknown
option, a missing one: one line naming it, before any actor starts)."""

from __future__ import annotations

import difflib
import re
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
    from raystream.engine.sources.base import Source
    from raystream.engine.sql.schema import RelSchema


@dataclass(frozen=True)
class ScanSpec:
    """One scan of a table: the relation it yields (with the constants the connector
    knows), how to add its source to a job, and its line in EXPLAIN."""

    schema: "RelSchema"
    build: Callable[["StreamEnvironment"], "DataStream"]
    description: str
    # the rows as a bounded source whose every split a lookup join reads (None: the table
    # cannot be looked up)
    lookup: "Source | None" = None


class Connector(ABC):
    """A connector: its name, its options (``required`` ones must be given), whether it
    reads and writes."""

    name: str = ""
    options: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()

    def check(self, table: TableEntry) -> None:
        """Raise a ``SqlError`` for an option or a column this connector cannot take."""
        given = {key for key, _ in table.definition.options} - {"connector", "connector.type"}
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

    def check_sink(self, table: TableEntry) -> None:
        """Raise a ``SqlError`` if ``table`` cannot be written (asked when an INSERT is
        planned, before anything is added to the job)."""
        if type(self).sink is Connector.sink:
            raise SqlError(f"table {table.name!r} (connector {self.name!r}) cannot be "
                           f"written: it is a source")

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        raise SqlError(f"table {table.name!r} (connector {self.name!r}) cannot be written: "
                       f"it is a source")


# -- option values as Flink writes them --------------------------------------------------------

_DURATION_UNITS = {**dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1),
                   **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1_000),
                   **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
                   **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
                   **dict.fromkeys(("d", "day", "days"), 86_400_000)}
_MEMORY_UNITS = {**dict.fromkeys(("", "b", "bytes"), 1), **dict.fromkeys(("k", "kb", "kibibytes"), 1 << 10),
                 **dict.fromkeys(("m", "mb", "mebibytes"), 1 << 20),
                 **dict.fromkeys(("g", "gb", "gibibytes"), 1 << 30),
                 **dict.fromkeys(("t", "tb", "tebibytes"), 1 << 40)}
_AMOUNT = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def duration_ms(text: str, where: str) -> int:
    """A duration option (Flink's ``TimeUtils``: ``'10 s'``, ``'1min'``, ``'500ms'``; a bare
    number is milliseconds) in milliseconds; ``where`` names the option in the error.

        >>> duration_ms("1 min", "x"), duration_ms("10s", "x"), duration_ms("250", "x")
        (60000, 10000, 250)
    """
    match = _AMOUNT.match(text)
    unit = match and (match.group(2).lower() or "ms")
    if match is None or unit not in _DURATION_UNITS:
        raise SqlError(f"{where}: {text!r} is not a duration (such as '10 s', '1 min', "
                       f"'500 ms')")
    return int(match.group(1)) * _DURATION_UNITS[unit]


def memory_bytes(text: str, where: str) -> int:
    """A memory size option (Flink's ``MemorySize``: ``'128mb'``, ``'1 gb'``; units of 1024)
    in bytes.

        >>> memory_bytes("128MB", "x"), memory_bytes("4096", "x")
        (134217728, 4096)
    """
    match = _AMOUNT.match(text)
    if match is None or match.group(2).lower() not in _MEMORY_UNITS or int(match.group(1)) < 1:
        raise SqlError(f"{where}: {text!r} is not a memory size (such as '128mb', '1 gb')")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]
