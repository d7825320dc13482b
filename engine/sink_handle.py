"""A sink's handle: what ``stream.collect()``, ``stream.sink_to(...)`` and the other sinks
return, to find that sink's output in the job's result.

    >>> handle = SinkHandle(7, "collect")
    >>> handle
    SinkHandle('collect')
"""

from __future__ import annotations


class SinkHandle:
    """Names a sink of a job, to fetch its result from the job's result."""

    def __init__(self, transformation_id: int, name: str) -> None:
        self.transformation_id = transformation_id
        self.name = name

    def __repr__(self) -> str:
        return f"SinkHandle({self.name!r})"
