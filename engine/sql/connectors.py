"""The connectors a ``CREATE TABLE ... WITH ('connector' = ...)`` may name, their options,
and what they build: a source for a scan, a sink for an ``INSERT INTO``.

Each connector checks a table when it is created (an unknown option, a missing one, a
column it cannot produce: one line naming it, before any actor starts). A scan may take
conditions from the query (Flink's filter push-down): the Nexmark connector, given
``event_type = 2``, generates bids only and tells the planner ``event_type`` is the
constant 2.

    >>> from raystream.engine.sql import parse
    >>> from raystream.engine.sql.catalog import table_entry
    >>> connector_of(table_entry(parse("CREATE TABLE t (a INT) WITH ('connector' = 'collect')")[0])).name
    'collect'
    >>> connector_of(table_entry(parse("CREATE TABLE t (a INT) WITH ('connector' = 'collet')")[0]))
    Traceback (most recent call last):
    ...
    raystream.engine.errors.SqlError: CREATE TABLE t: unknown connector 'collet' (raystream's: blackhole, collect, datagen, filesystem, kafka, nexmark, print); did you mean 'collect'?
"""

from __future__ import annotations

import difflib

from raystream.engine.errors import SqlError
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.connector_base import Connector
from raystream.engine.sql.datagen_connector import Datagen
from raystream.engine.sql.file_connector import Filesystem
from raystream.engine.sql.kafka_connector import Kafka
from raystream.engine.sql.sink_connectors import Blackhole, Collect, Print

_REGISTRY: dict[str, Connector] = {c.name: c for c in (Blackhole(), Collect(), Datagen(),
                                                       Filesystem(), Kafka(), Print())}


def register(connector: Connector) -> None:
    """Make ``connector`` one that ``'connector' = '<its name>'`` names (the ``nexmark``
    connector registers itself so, from the package above the engine)."""
    _REGISTRY[connector.name] = connector


def connector_of(table: TableEntry) -> Connector:
    """The connector a table names, having checked the table against it."""
    # (or Flink's legacy 'connector.type', which Nexmark's q13 uses)
    name = table.definition.option("connector") or table.definition.option("connector.type")
    if name is None:
        raise SqlError(f"CREATE TABLE {table.name}: WITH ('connector' = ...) is missing")
    registry = _REGISTRY
    connector = registry.get(name)
    if connector is None:
        close = difflib.get_close_matches(name, list(registry), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SqlError(f"CREATE TABLE {table.name}: unknown connector {name!r} (raystream's: "
                       f"{', '.join(sorted(registry))}){hint}")
    connector.check(table)
    return connector
