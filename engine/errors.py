"""Errors a user of raystream sees."""

from __future__ import annotations

from typing import Any


class RaystreamError(Exception):
    """Base of raystream's own errors."""


class JobFailedError(RaystreamError):
    """The job failed; the message names the operator, the subtask and the cause."""

    def __init__(self, message: str, *, operator: str | None = None, subtask: int | None = None,
                 traceback: str | None = None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.traceback = traceback


class JobNotFoundError(RaystreamError, LookupError):
    """No job of that id or name is known on this Ray cluster."""


class JobNotRunningError(RaystreamError):
    """The job has ended (or its driver has gone): it cannot be acted on any more."""


class InsufficientResourcesError(RaystreamError):
    """The cluster cannot host the job; raised before any actor is created."""


class BadRecordError(RaystreamError, ValueError):
    """A record does not fit what an operator needs (missing column, wrong type).

    The message names the column, the cause and the record.
    """

    def __init__(self, message: str, *, column: str | None = None, record: Any = None) -> None:
        super().__init__(message)
        self.column = column
        self.record = record


def describe_record(record: Any, limit: int = 300) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[:limit] + "...}"
