"""The sink-only connectors: ``collect`` (rows to Python), ``blackhole`` and ``print``."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.connector_base import Connector

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.sink_handle import SinkHandle


class _Sink(Connector):
    @abstractmethod
    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle": ...


class Collect(_Sink):
    """Rows to Python: ``result.table(handle)`` of the job's result, exactly once with
    checkpoints (``stream.collect()``)."""

    name = "collect"

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        return stream.collect(name=table.name)


class Blackhole(_Sink):
    """Rows dropped (``stream.discard()``; Flink's ``blackhole``), for benchmarks."""

    name = "blackhole"

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        return stream.discard(name=table.name)


class Print(_Sink):
    """Rows printed to the subtasks' stdout (``stream.print()``)."""

    name = "print"
    options = frozenset({"print-identifier"})

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        return stream.print(table.definition.option("print-identifier"))
