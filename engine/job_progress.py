"""A job's progress as its master sees it: rows read and written, their rates, the
job's watermark and its lag, the share of a bounded input read, and what the job is
doing in words (no Ray here: the master samples its subtasks' metrics into a
:class:`ProgressTracker`).

Counts never go back. Each checkpoint holds the rows the sources had read and the
data sinks had taken when it was taken; a restored attempt counts on from those. Until
it passes the highest count seen (rows read or written again after a failure), a count
stays there and its rate is 0: they are no progress.

    >>> tracker = ProgressTracker(Extent(bounded=True, rows=1_000))
    >>> tracker.sample(10.0, {"src/0": {"src.records_read": 100.0},
    ...                       "sum -> out/0": {"out.records_written": 40.0,
    ...                                        "watermark": 5_000.0}})
    >>> tracker.sample(12.0, {"src/0": {"src.records_read": 300.0},
    ...                       "sum -> out/0": {"out.records_written": 140.0,
    ...                                        "watermark": 7_000.0}})
    >>> p = tracker.progress(phase="running", now_ms=9_500)
    >>> p.rows_read, p.read_per_s, p.rows_written, p.written_per_s, p.fraction_read
    (300, 100.0, 140, 50.0, 0.3)
    >>> p.watermark_ms, p.watermark_lag_s
    (7000, 2.5)
    >>> tracker.attempt_started(1, rows=RowCounts(read=200, written=90))  # a restore
    >>> tracker.sample(13.0, {"src/0": {"src.records_read": 50.0, "attempt": 1.0},
    ...                       "sum -> out/0": {"out.records_written": 10.0, "attempt": 1.0}})
    >>> p = tracker.progress(phase="running", now_ms=9_500)
    >>> p.rows_read, p.rows_written  # 250 and 100 so far: no progress yet
    (300, 140)
    >>> tracker.sample(14.0, {"src/0": {"src.records_read": 150.0, "attempt": 1.0},
    ...                       "sum -> out/0": {"out.records_written": 70.0, "attempt": 1.0}})
    >>> p = tracker.progress(phase="running", now_ms=9_500)
    >>> p.rows_read, p.rows_written
    (350, 160)
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK
from raystream.checkpoint.metadata import RowCounts

READ_SUFFIX = ".records_read"  # a source operator's figure (engine.operators.source)
WRITTEN_SUFFIX = ".records_written"  # a data sink's (actors.operator.CountsWrittenRows)
SMOOTHING = 0.5  # weight of the newest rate in the smoothed one


@dataclass(frozen=True)
class Extent:
    """What the driver knows of a job's input before it runs."""

    bounded: bool  # every source ends by itself
    rows: int | None  # rows of all sources, when every source knows its count


@dataclass(frozen=True)
class JobProgress:
    """A job's progress at one moment (``JobClient.progress()`` has these keys too)."""

    phase: str  # what the job does now, in words: "running", "final checkpoint 12, ..."
    rows_read: int  # by its sources, never less than before
    rows_written: int  # taken by its data sinks (committed at the next checkpoint)
    read_per_s: float | None  # smoothed; None before two samples
    written_per_s: float | None
    rows_total: int | None  # of a bounded input whose sources know their counts
    fraction_read: float | None  # rows_read / rows_total
    watermark_ms: int | None  # the lowest watermark at the sinks (None: no event time yet)
    watermark_lag_s: float | None  # wall-clock time minus watermark_ms

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Counter:
    """One count that never goes back, with its smoothed rate."""

    value: int = 0
    rate: float | None = None
    _last: tuple[float, int] | None = None

    def sample(self, now: float, seen: int) -> None:
        self.value = max(self.value, seen)
        if self._last is not None and now > self._last[0]:
            rate = (self.value - self._last[1]) / (now - self._last[0])
            self.rate = rate if self.rate is None else (
                SMOOTHING * rate + (1 - SMOOTHING) * self.rate)
        self._last = (now, self.value)


def phase_of(status: str, *, ended: int, subtasks: int, checkpoints: bool,
             final: int | None, final_complete: bool, failures: int) -> str:
    """What a job does, in words: ``status`` (a ``JobStatus`` value), how many of its
    ``subtasks`` have ``ended`` their input, whether it takes ``checkpoints``, its
    ``final`` checkpoint (once every subtask ended) and whether that completed.

        >>> phase_of("RUNNING", ended=4, subtasks=4, checkpoints=True, final=12,
        ...          final_complete=False, failures=0)
        'input read; final checkpoint 12 in progress'
        >>> phase_of("RESTARTING", ended=0, subtasks=4, checkpoints=True, final=None,
        ...          final_complete=False, failures=2)
        'restarting after failure 2'
    """
    if status in ("CREATED", "DEPLOYING"):
        return "deploying"
    if status == "RESTARTING":
        return f"restarting after failure {failures}"
    if status != "RUNNING":
        return status.lower()
    if not ended or not subtasks:
        return "running"
    if ended < subtasks:
        return f"running; {ended} of {subtasks} subtasks have ended their input"
    if not checkpoints:
        return "input read; stopping the subtasks"
    if final is None:
        return "input read; the final checkpoint is due"
    if final_complete:
        return f"final checkpoint {final} complete; committing and stopping the subtasks"
    return f"input read; final checkpoint {final} in progress"


class ProgressTracker:
    """Takes samples of a job's subtask metrics (by ``"chain/index"``) and answers its
    :class:`JobProgress`. Thread-safe: the master samples on one thread and clients
    ask on others."""

    def __init__(self, extent: Extent) -> None:
        self.extent = extent
        self._read, self._written = _Counter(), _Counter()
        self._before = RowCounts()  # at the checkpoint the attempt restored
        self._attempt = 0  # the attempt of the job's last deployment
        # subtasks ("chain/index") a region failover restarted since, with their attempt
        self._regions: dict[str, int] = {}
        self._watermark: int | None = None
        self._lock = threading.Lock()

    def attempt_started(self, attempt: int, *, rows: RowCounts) -> None:
        """``attempt`` restored a checkpoint taken at ``rows`` (none: from the start)."""
        with self._lock:
            self._before, self._attempt, self._regions = rows, attempt, {}

    def region_started(self, attempt: int, subtasks: Iterable[str], *, rows: RowCounts) -> None:
        """A region failover restarted ``subtasks`` as ``attempt``, which counts on from
        the ``rows`` they had at the checkpoint they restored (the others count on)."""
        with self._lock:
            self._before += rows
            self._regions.update(dict.fromkeys(subtasks, attempt))

    def sample(self, now: float, metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Metrics of every subtask at ``now`` (monotonic seconds); none is no sample
        (the subtasks did not answer, or the job is between attempts)."""
        if not metrics:
            return
        read = written = 0.0
        watermarks = []
        with self._lock:
            counted, regions = self._attempt, dict(self._regions)
        for name, figures in metrics.items():
            # (a sample across a failover: another attempt's subtasks are not counted)
            if int(figures.get("attempt", 0)) != regions.get(name, counted):
                continue
            read += sum(v for k, v in figures.items() if k.endswith(READ_SUFFIX))
            wrote = [v for k, v in figures.items() if k.endswith(WRITTEN_SUFFIX)]
            written += sum(wrote)
            if wrote and "watermark" in figures:  # a subtask hosting a data sink
                watermarks.append(figures["watermark"])
        with self._lock:
            before = self._before
            self._read.sample(now, before.read + int(read))
            self._written.sample(now, before.written + int(written))
            if watermarks:
                low = min(watermarks)
                # none yet, or past the end of input: no watermark to show
                self._watermark = int(low) if MIN_WATERMARK < low < MAX_WATERMARK else None

    def progress(self, *, phase: str, now_ms: float) -> JobProgress:
        with self._lock:
            read, written, watermark = self._read, self._written, self._watermark
            total = self.extent.rows if self.extent.bounded else None
            return JobProgress(
                phase=phase, rows_read=read.value, rows_written=written.value,
                read_per_s=read.rate, written_per_s=written.rate, rows_total=total,
                fraction_read=min(read.value / total, 1.0) if total else None,
                watermark_ms=watermark,
                watermark_lag_s=None if watermark is None else (now_ms - watermark) / 1000)


_DURATION_UNITS = ((365.25 * 86400, "years"), (86400, "days"), (3600, "h"), (60, "min"),
                   (1, "s"))


def duration_text(seconds: float) -> str:
    """A duration in the unit that reads best (the web UI writes them the same way).

        >>> duration_text(0.85), duration_text(72), duration_text(3 * 365.25 * 86400)
        ('850 ms', '1.2 min', '3.0 years')
    """
    for size, unit in _DURATION_UNITS:
        if abs(seconds) >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds * 1000:.0f} ms"


def progress_lines(progress: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``raystream status``'s lines for a job's progress (``JobProgress.as_dict()``).

        >>> progress_lines({"phase": "running", "rows_read": 500, "rows_total": 2000,
        ...                 "fraction_read": 0.25, "read_per_s": 100.0, "rows_written": 480,
        ...                 "written_per_s": 90.0, "watermark_ms": 0, "watermark_lag_s": 1.5})
        [('phase', 'running'), ('read', '500 of 2,000 rows (25%), 100 rows/s'), ('written', '480 rows, 90 rows/s'), ('watermark', '1970-01-01T00:00:00.000Z (lag 1.5 s)')]
    """
    if not progress:
        return []
    lines = [("phase", str(progress.get("phase")))]

    def rate(key: str) -> str:
        value = progress.get(key)
        return "" if value is None else f", {value:,.0f} rows/s"

    total, read = progress.get("rows_total"), progress.get("rows_read", 0)
    lines.append(("read", (f"{read:,} of {total:,} rows ({progress.get('fraction_read', 0):.0%})"
                           if total else f"{read:,} rows") + rate("read_per_s")))
    lines.append(("written", f"{progress.get('rows_written', 0):,} rows" + rate("written_per_s")))
    watermark = progress.get("watermark_ms")
    if watermark is not None:
        when = datetime.datetime.fromtimestamp(watermark / 1000, datetime.timezone.utc)
        lag = progress.get("watermark_lag_s")
        lines.append(("watermark", when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
                      + ("" if lag is None else f" (lag {duration_text(lag)})")))
    return lines
