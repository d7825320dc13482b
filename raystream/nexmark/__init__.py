"""Nexmark: the event generator, its sources and the benchmark's queries.

    >>> import raystream as rs
    >>> from raystream import nexmark
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> hot = nexmark.queries.q5(env, 100_000)
    >>> sink = hot.collect()
    >>> env.execute("q5").table(sink).num_rows  # doctest: +SKIP
    ...

See docs/nexmark.md.
"""

from raystream.nexmark import queries
from raystream.nexmark.generator import SCHEMAS, EventKind, NexmarkConfig, generate
from raystream.nexmark.source import TIMESTAMP, NexmarkSource, auctions, bids, persons

__all__ = ["EventKind", "NexmarkConfig", "NexmarkSource", "SCHEMAS", "TIMESTAMP", "auctions",
           "bids", "generate", "persons", "queries"]
