"""Triggers: when a window emits its contents (Flink's ``Trigger`` and ``TriggerResult``).

A trigger is a frozen description, decided for many windows at once: the window store of
triggered windows (:mod:`raystream.engine.windows.triggered`) asks it three things, each
over arrays of windows, and applies the answers as Flink's ``WindowOperator`` does (a
``FIRE`` emits the window's contents, a ``PURGE`` drops them and keeps the window, the
cleanup time drops the window):

* :meth:`Trigger.first_timers`: the timers a window registers when it is created (by its
  first records);
* :meth:`Trigger.on_records`: the windows that took in records: which fire now;
* :meth:`Trigger.on_timers`: due timers of windows: which fire, and the next timers.

Built in, as in Flink: :class:`EventTimeTrigger` (the default of event-time windows),
:class:`ProcessingTimeTrigger` (of processing-time windows), :class:`NeverTrigger` (of
:class:`~raystream.engine.windows.assigners.GlobalWindows`), :class:`CountTrigger`,
:class:`ContinuousEventTimeTrigger`, :class:`ContinuousProcessingTimeTrigger` and
:class:`PurgingTrigger`.

    >>> import numpy as np
    >>> CountTrigger(count=2).on_records(Filled(ends=np.array([10, 10]),
    ...     counts=np.array([1, 2]), watermarks=np.array([0, 0]))).tolist()
    [0, 1]
    >>> TriggerResult(PurgingTrigger(CountTrigger(count=2)).on_records(Filled(
    ...     ends=np.array([10]), counts=np.array([2]), watermarks=np.array([0])))[0]).name
    'FIRE_AND_PURGE'

Two choices differ from Flink, both to keep a firing per watermark rather than per
interval: a continuous trigger whose next time the watermark (or clock) has passed
already skips to the first interval after it (Flink fires once per interval passed, each
time with the same contents; a watermark jumping to the end of the input would fire a
global window without end), and a window with several firing timers due in one pop fires
once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from raystream.engine.watermarks import MAX_SPAN_MS
from raystream.engine.windows.assigners import GlobalWindows, WindowAssigner
from raystream.timers.protocol import TimeDomain


class TriggerResult(IntEnum):
    """What a trigger decides for a window (Flink's ``TriggerResult``): bit 1 fires, bit 2
    purges, so results combine with ``|``."""

    CONTINUE = 0
    FIRE = 1
    PURGE = 2
    FIRE_AND_PURGE = 3

    @property
    def fires(self) -> bool:
        return bool(self & TriggerResult.FIRE)

    @property
    def purges(self) -> bool:
        return bool(self & TriggerResult.PURGE)


def fires(results: np.ndarray) -> np.ndarray:
    """The windows a result array fires."""
    return (results & TriggerResult.FIRE) != 0


def purges(results: np.ndarray) -> np.ndarray:
    """The windows a result array purges."""
    return (results & TriggerResult.PURGE) != 0


@dataclass(frozen=True)
class Timers:
    """Timers to register: window ``index[i]`` of the arrays asked about, at
    ``timestamps[i]`` in ``domain``."""

    domain: TimeDomain
    index: np.ndarray
    timestamps: np.ndarray


@dataclass(frozen=True)
class Created:
    """Windows created by their first records: their ends, the time of each one's first
    record (event time, or the clock for processing time) and the current time."""

    ends: np.ndarray
    first_times: np.ndarray
    watermarks: np.ndarray
    now_ms: int


@dataclass(frozen=True)
class Filled:
    """Windows that took in records: their ends, how many records each holds since it
    last fired, and the watermark of each one's key."""

    ends: np.ndarray
    counts: np.ndarray
    watermarks: np.ndarray


@dataclass(frozen=True)
class Due:
    """Due timers of windows (one entry per timer, its window's end beside it)."""

    domain: TimeDomain
    timestamps: np.ndarray
    ends: np.ndarray
    watermarks: np.ndarray
    now_ms: int


_NONE: tuple[Timers, ...] = ()


def _continue(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int8)


def _results(fire: np.ndarray) -> np.ndarray:
    return np.where(fire, TriggerResult.FIRE, TriggerResult.CONTINUE).astype(np.int8)


class Trigger:
    """A trigger's three decisions, over arrays of windows (see the module docs). The
    built-in triggers are frozen dataclasses of this base; a trigger of your own
    overrides what it needs, returning one :class:`TriggerResult` per window (an int8
    array) and the :class:`Timers` to register. ``domains``: the clocks its timers
    follow (a processing-time one makes the end of the input fire them);
    ``record_times``: it reads ``Created.first_times`` as event times (the window then
    needs ``timestamp=``).

        >>> import numpy as np
        >>> class EveryRecord(Trigger):  # fire on each batch a window takes in
        ...     def on_records(self, filled):
        ...         return np.full(len(filled.ends), TriggerResult.FIRE, dtype=np.int8)
        >>> EveryRecord().on_records(Filled(np.array([10]), np.array([1]), np.array([0])))
        array([1], dtype=int8)
    """

    counts = False  # it needs each window's count of records since it last fired
    record_times = False  # it needs the event time of each window's first record
    domains: frozenset[TimeDomain] = frozenset()  # the timer domains it registers in

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        return _NONE

    def on_records(self, filled: Filled) -> np.ndarray:
        return _continue(len(filled.ends))

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        return _continue(len(due.ends)), _NONE


@dataclass(frozen=True)
class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (``end - 1``), and again for each
    batch of records a late window (within the allowed lateness) takes in."""

    domains = frozenset({TimeDomain.EVENT_TIME})

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        pending = np.flatnonzero(created.ends - 1 > created.watermarks)
        return (Timers(TimeDomain.EVENT_TIME, pending, created.ends[pending] - 1),)

    def on_records(self, filled: Filled) -> np.ndarray:
        return _results(filled.ends - 1 <= filled.watermarks)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        return _results((due.domain == TimeDomain.EVENT_TIME) & (due.timestamps == due.ends - 1)
                        ), _NONE


@dataclass(frozen=True)
class ProcessingTimeTrigger(Trigger):
    """Fires once the clock passes the window's end (``end - 1``)."""

    domains = frozenset({TimeDomain.PROCESSING_TIME})

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        return (Timers(TimeDomain.PROCESSING_TIME, np.arange(len(created.ends)),
                       created.ends - 1),)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        return _results((due.domain == TimeDomain.PROCESSING_TIME)
                        & (due.timestamps == due.ends - 1)), _NONE


@dataclass(frozen=True)
class NeverTrigger(Trigger):
    """Never fires: the default of global windows, which need a trigger of their own."""


@dataclass(frozen=True)
class CountTrigger(Trigger):
    """Fires each time a window has taken in ``count`` more records, as the record that
    makes the count arrives (a batch is split where a window's count is reached).

        >>> CountTrigger(count=0)
        Traceback (most recent call last):
        ValueError: CountTrigger: count must be a positive number of records, got 0
    """

    count: int
    counts = True

    def __post_init__(self) -> None:
        if int(self.count) <= 0:
            raise ValueError(f"CountTrigger: count must be a positive number of records, "
                             f"got {self.count!r}")

    def on_records(self, filled: Filled) -> np.ndarray:
        return _results(filled.counts >= self.count)


def _next_multiple(times: np.ndarray, interval: int, ends: np.ndarray) -> np.ndarray:
    """The first multiple of ``interval`` after each of ``times``, at most the window's
    last time ``end - 1`` (times are clipped first, so a watermark at the end of input
    does not overflow)."""
    clipped = np.minimum(times, ends - 1)
    return np.minimum(clipped - np.mod(clipped, interval) + interval, ends - 1)


def _check_interval(name: str, interval_ms: int) -> None:
    if not 0 < int(interval_ms) <= MAX_SPAN_MS:
        raise ValueError(f"{name}: interval_ms must be a positive number of milliseconds up "
                         f"to 2^60, got {interval_ms!r}")


@dataclass(frozen=True)
class ContinuousEventTimeTrigger(Trigger):
    """Fires every ``interval_ms`` of event time (at multiples of it, from the first one
    after the window's first record) and once the watermark passes the window's end; a
    late window fires for each batch of records it takes in."""

    interval_ms: int
    domains = frozenset({TimeDomain.EVENT_TIME})
    record_times = True

    def __post_init__(self) -> None:
        _check_interval("ContinuousEventTimeTrigger", self.interval_ms)

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        pending = np.flatnonzero(created.ends - 1 > created.watermarks)
        ends = created.ends[pending]
        return (Timers(TimeDomain.EVENT_TIME, pending, ends - 1),
                Timers(TimeDomain.EVENT_TIME, pending,
                       _next_multiple(created.first_times[pending], self.interval_ms, ends)))

    def on_records(self, filled: Filled) -> np.ndarray:
        return _results(filled.ends - 1 <= filled.watermarks)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        if due.domain != TimeDomain.EVENT_TIME:
            return _continue(len(due.ends)), _NONE
        fire = due.timestamps <= due.ends - 1  # later ones are the cleanup's
        again = np.flatnonzero(due.timestamps < due.ends - 1)
        after = np.maximum(due.timestamps[again], due.watermarks[again])
        return _results(fire), (Timers(TimeDomain.EVENT_TIME, again, _next_multiple(
            after, self.interval_ms, due.ends[again])),)


@dataclass(frozen=True)
class ContinuousProcessingTimeTrigger(Trigger):
    """Fires every ``interval_ms`` of the clock (at multiples of it, from the first one
    after the window's first record) until the window's end."""

    interval_ms: int
    domains = frozenset({TimeDomain.PROCESSING_TIME})

    def __post_init__(self) -> None:
        _check_interval("ContinuousProcessingTimeTrigger", self.interval_ms)

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        index = np.arange(len(created.ends))
        now = np.full(len(index), created.now_ms, dtype=np.int64)
        return (Timers(TimeDomain.PROCESSING_TIME, index,
                       _next_multiple(now, self.interval_ms, created.ends)),)

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        if due.domain != TimeDomain.PROCESSING_TIME:
            return _continue(len(due.ends)), _NONE
        fire = due.timestamps <= due.ends - 1
        again = np.flatnonzero(due.timestamps < due.ends - 1)
        after = np.maximum(due.timestamps[again], due.now_ms)
        return _results(fire), (Timers(TimeDomain.PROCESSING_TIME, again, _next_multiple(
            after, self.interval_ms, due.ends[again])),)


@dataclass(frozen=True)
class PurgingTrigger(Trigger):
    """``trigger``, with each of its firings purging the window's contents too (Flink's
    ``PurgingTrigger.of``): a count trigger becomes a tumbling count per window.

        >>> PurgingTrigger(CountTrigger(count=3)).counts
        True
    """

    trigger: Trigger

    def __post_init__(self) -> None:
        if not isinstance(self.trigger, Trigger):
            raise TypeError(f"PurgingTrigger wraps a trigger, got {self.trigger!r}")

    @property
    def counts(self) -> bool:  # type: ignore[override]
        return self.trigger.counts

    @property
    def domains(self) -> frozenset[TimeDomain]:  # type: ignore[override]
        return self.trigger.domains

    @property
    def record_times(self) -> bool:  # type: ignore[override]
        return self.trigger.record_times

    def first_timers(self, created: Created) -> tuple[Timers, ...]:
        return self.trigger.first_timers(created)

    def on_records(self, filled: Filled) -> np.ndarray:
        return _purging(self.trigger.on_records(filled))

    def on_timers(self, due: Due) -> tuple[np.ndarray, tuple[Timers, ...]]:
        results, timers = self.trigger.on_timers(due)
        return _purging(results), timers


def _purging(results: np.ndarray) -> np.ndarray:
    return np.where(fires(results), results | TriggerResult.PURGE, results).astype(np.int8)


def default_trigger(assigner: WindowAssigner) -> Trigger:
    """The trigger a window has when given none: event time's, processing time's, or
    for global windows one that never fires.

        >>> from raystream.engine.windows.assigners import TumblingEventTimeWindows
        >>> default_trigger(TumblingEventTimeWindows(size_ms=10))
        EventTimeTrigger()
    """
    if isinstance(assigner, GlobalWindows):
        return NeverTrigger()
    return EventTimeTrigger() if assigner.event_time else ProcessingTimeTrigger()
