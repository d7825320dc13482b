"""Errors a user of raystream sees."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

# the base of every error here, raised by lower layers too (re-exported)
from raystream.core.errors import RaystreamError as RaystreamError

if TYPE_CHECKING:  # (it raises this module's SavepointFailedError)
    from raystream.engine.savepoint_failure import SavepointFailureCause


class JobFailedError(RaystreamError):
    """The job failed; the message names the operator, the subtask and the cause."""

    def __init__(self, message: str, *, operator: str | None = None, subtask: int | None = None,
                 traceback: str | None = None) -> None:
        # not super(): in a JobFailedOn... class the next base is the data error's, whose
        # arguments stayed in the subtask
        RaystreamError.__init__(self, message)
        self.operator = operator
        self.subtask = subtask
        self.traceback = traceback


class JobNotFoundError(RaystreamError, LookupError):
    """No job of that id or name is known on this Ray cluster."""


class JobNotRunningError(RaystreamError):
    """The job has ended (or its driver has gone): it cannot be acted on any more."""


class JobStillRunningError(RaystreamError):
    """A job cannot resume while a run of the same name is still running."""


class SavepointFailedError(RaystreamError):
    """A savepoint (or a stop with one) did not complete, or completed without stopping the
    job. The message says why, whether the job is still running and whether a retry makes
    sense; ``path``, ``cause`` (a ``SavepointFailureCause``), ``job_still_running`` and
    ``retryable`` say it to code."""

    def __init__(self, message: str, *, path: str, cause: SavepointFailureCause,
                 job_still_running: bool,
                 retryable: bool) -> None:
        super().__init__(message)
        self.path = path
        self.cause = cause
        self.job_still_running = job_still_running
        self.retryable = retryable


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


class JobSetupError(RaystreamError, ValueError):
    """A job cannot start as configured: a path it reads does not exist, its checkpoint
    storage is not writable, what it restores from is no savepoint or checkpoint, a Kafka
    broker of its source or sink does not answer or lacks its topic. Raised by
    ``execute()`` before Ray starts when the job runs on this machine
    (:mod:`raystream.engine.preflight`, the Kafka check in
    :mod:`raystream.engine.kafka_client`)."""


class AsyncTimeoutError(RaystreamError, TimeoutError):
    """A call of ``map_async`` gave no result within its ``timeout_s`` (retries included)
    and the operator has no ``on_timeout``. ``record``: the input, described."""

    def __init__(self, message: str, *, record: str) -> None:
        super().__init__(message)
        self.record = record


class SchemaError(RaystreamError, ValueError):
    """A job's definition names a column its stream does not have (found when the job is
    built, before anything runs). ``column``: the missing name; ``columns``: the stream's."""

    def __init__(self, message: str, *, column: str, columns: tuple[str, ...]) -> None:
        super().__init__(message)
        self.column = column
        self.columns = columns


class SqlError(RaystreamError, ValueError):
    """A SQL statement does not parse, or uses something raystream's SQL does not have (an
    unknown column type, a metadata column). The message is one line and names where:
    ``line`` and ``column`` (1-based, of the text given to ``parse``; None when the error
    is not at one place)."""

    def __init__(self, message: str, *, line: int | None = None,
                 column: int | None = None) -> None:
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(f"{where}{message}")
        self.line = line
        self.column = column


@dataclass(frozen=True)
class FilePosition:
    """Where in a file a read failed, as far as the format lets us know it."""

    row_group: int | None = None  # Parquet
    # CSV, 1-based, counting the header row (a record, not a line); Avro: the 1-based record
    row: int | None = None
    line: int | None = None  # JSON lines, 1-based
    offset: int | None = None  # byte offset of that line

    def __str__(self) -> str:
        parts = [f"row group {self.row_group}" if self.row_group is not None else "",
                 f"row {self.row}" if self.row is not None else "",
                 f"line {self.line}" if self.line is not None else "",
                 f"byte offset {self.offset}" if self.offset is not None else ""]
        return ", ".join(part for part in parts if part)


class FileReadError(RaystreamError):
    """A file source could not read or parse a file.

    The message names the file, where in it (``position``) when known, and the
    cause, which is also the ``__cause__``.
    """

    def __init__(self, path: str, cause: BaseException, position: FilePosition = FilePosition(),
                 *, context: str = "", detail: str | None = None) -> None:
        where = f" ({position})" if str(position) else ""
        detail = str(cause) if detail is None else detail  # the cause's text, or a clearer one
        super().__init__(f"cannot read {path}{where}: {context}{type(cause).__name__}: {detail}")
        self.path = path
        self.position = position
        self.__cause__ = cause


class JobFailedOnBadRecord(JobFailedError, BadRecordError):
    """The job failed on a record that does not fit an operator: ``except
    rs.BadRecordError`` and ``except rs.JobFailedError`` both catch it (``column`` and
    ``record`` stay in the subtask: the message names them)."""

    def __init__(self, message: str, **where: Any) -> None:
        JobFailedError.__init__(self, message, **where)
        self.column = self.record = None


class JobFailedOnFileRead(JobFailedError, FileReadError):
    """The job failed on a file it could not read: ``except rs.FileReadError`` and ``except
    rs.JobFailedError`` both catch it (the message names the file and where in it)."""

    def __init__(self, message: str, **where: Any) -> None:
        JobFailedError.__init__(self, message, **where)
        self.path, self.position = None, FilePosition()


# a user's data errors, by the qualified name a subtask reports them under
_DATA_ERRORS: dict[str, type[JobFailedError]] = {
    f"{__name__}.BadRecordError": JobFailedOnBadRecord,
    f"{__name__}.FileReadError": JobFailedOnFileRead,
}


def job_failed_error(message: str, *, error_types: tuple[str, ...] = (),
                     operator: str | None = None, subtask: int | None = None,
                     traceback: str | None = None) -> JobFailedError:
    """The error ``execute()`` raises for a failed job: of the type of the user's data
    error that failed it too, where ``error_types`` (the classes of the exception, most
    derived first) hold one.

        >>> e = job_failed_error("job 'j' failed: ...", error_types=(
        ...     "raystream.engine.errors.BadRecordError", "builtins.ValueError"))
        >>> isinstance(e, BadRecordError), isinstance(e, JobFailedError)
        (True, True)
        >>> type(job_failed_error("job 'j' failed: ...")).__name__
        'JobFailedError'
    """
    kind = next((_DATA_ERRORS[t] for t in error_types if t in _DATA_ERRORS), JobFailedError)
    return kind(message, operator=operator, subtask=subtask, traceback=traceback)


def describe_record(record: Any, limit: int = 300) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[:limit] + "...}"


E = TypeVar("E", bound=Enum)


def choice(kind: type[E], value: E | str, option: str) -> E:
    """``value`` as a member of the enum ``kind``; a ValueError naming ``option`` and its
    choices otherwise.

        >>> import enum
        >>> class Mode(enum.Enum):
        ...     FAST = "fast"
        >>> choice(Mode, "fast", "mode")
        <Mode.FAST: 'fast'>
        >>> choice(Mode, "slow", "mode")
        Traceback (most recent call last):
        ...
        ValueError: mode must be one of ['fast'], not 'slow'
    """
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{option} must be one of {sorted(e.value for e in kind)}, "
                         f"not {value!r}") from None
