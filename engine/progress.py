"""A job's progress on stderr: one line updated in place on a terminal, a line every few
seconds elsewhere.

A bounded job (every source knows its end) shows a bar of rows read of rows
known, when its sources know how many rows they have (a sequence, a collection,
an Arrow table), and otherwise the rows read; an unbounded one shows its rate
and latest checkpoint. On a terminal ``env.execute`` (and ``raystream run``) redraws
the line in place and clears it when the job ends; output that is not a terminal (a
notebook, a file, a pipe, CI logs) gets the same line, prefixed with the seconds since
the start, every ``RAYSTREAM_PROGRESS_EVERY`` seconds (5; ``raystream run
--progress-every``). ``execute(progress=False)`` or ``RAYSTREAM_PROGRESS=0`` turns it off,
``progress=True`` on.

    >>> extent = Extent(bounded=True, rows=1_000_000)
    >>> render(Snapshot("clicks", "RUNNING", rows_read=250_000, rate=50_000.0,
    ...                 checkpoints=2, last_checkpoint=(2, 0.1234), restarts=0), extent, width=100)
    'clicks [#######-----------------------]  25% 250,000/1,000,000 rows | 50,000 rows/s | checkpoints 2'
    >>> render(Snapshot("clicks", "RUNNING", rows_read=250_000, rate=50_000.0,
    ...                 checkpoints=7, last_checkpoint=(7, 0.05), restarts=1),
    ...        Extent(bounded=False, rows=None), width=100)
    'clicks RUNNING | 50,000 rows/s | 250,000 rows | latest checkpoint #7 (0.05 s) | restarts 1'
    >>> render(Snapshot("clicks", "RUNNING", rows_read=1_000_000, rate=0.0, checkpoints=3,
    ...                 last_checkpoint=(3, 0.1), restarts=0,
    ...                 phase="input read; final checkpoint 4 in progress"), extent, width=160)
    'clicks [##############################] 100% 1,000,000/1,000,000 rows | input read; final checkpoint 4 in progress | 0 rows/s | checkpoints 3'

The renderer is our own (this module): the line mixes a bar with job facts that
change while it runs, and must stay a pure function to test; ``tqdm`` and ``rich``
would own the line (and ``rich`` is a large dependency) for little gain.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, TextIO

from raystream.engine.job_progress import Extent

REFRESH_S = 0.5
LOG_EVERY_S = 5.0  # between the lines of output that is not a terminal
LOG_WIDTH = 200
STOP_WAIT_S = 2.0  # for the last poll, once the job has ended
BAR_WIDTH = 30
CLEAR_LINE = "\r\x1b[K"


@dataclass(frozen=True)
class Snapshot:
    """What the progress line shows at one moment."""

    job: str
    status: str
    rows_read: int
    rate: float | None  # rows read per second, smoothed
    checkpoints: int  # completed so far
    last_checkpoint: tuple[int, float] | None  # (id, duration in seconds)
    restarts: int
    phase: str = "running"  # what the job does, in words (JobProgress.phase)


def input_extent(transformations: list[Any]) -> Extent:
    """The extent of a job's sources (``env.transformations``): split-based sources say
    whether they end and, for in-memory ones, how many rows they have; a source
    operator of your own (``add_source``) counts as unbounded and of unknown size."""
    bounded, rows = True, 0
    sources = [t for t in transformations if t.kind == "source"]
    for t in sources:
        source = getattr(t.coordinator, "keywords", {}).get("source")
        extent = _source_extent(source)
        bounded = bounded and extent.bounded
        rows = None if rows is None or extent.rows is None else rows + extent.rows
    return Extent(bounded and bool(sources), rows if bounded and sources else None)


def _source_extent(source: Any) -> Extent:
    from raystream.engine.sources.arrow import ArrowTable
    from raystream.engine.sources.collection import Collection
    from raystream.engine.sources.files import Files
    from raystream.engine.sources.sequence import Sequence

    if isinstance(source, Sequence):
        return Extent(True, source.n)
    if isinstance(source, Collection):
        return Extent(True, len(source.rows))
    if isinstance(source, ArrowTable):
        return Extent(True, source.num_rows)
    if isinstance(source, Files):
        return Extent(source.monitor_interval_s is None, None)
    config = getattr(source, "config", None)  # a Kafka source: bounded_until
    if config is not None and hasattr(config, "bounded_until"):
        return Extent(config.bounded_until is not None, None)
    return Extent(False, None)


def render(snapshot: Snapshot, extent: Extent, width: int) -> str:
    """The progress line, at most ``width - 1`` characters (a full line would wrap)."""
    rate = "-" if snapshot.rate is None else f"{snapshot.rate:,.0f}"
    if extent.bounded:
        if extent.rows:
            done = min(snapshot.rows_read / extent.rows, 1.0)
            filled = int(done * BAR_WIDTH)
            parts = [f"{snapshot.job} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] "
                     f"{done:4.0%} {snapshot.rows_read:,}/{extent.rows:,} rows"]
        else:
            parts = [f"{snapshot.job} {snapshot.status}", f"{snapshot.rows_read:,} rows"]
        if snapshot.status != "RUNNING" and extent.rows:
            parts.append(snapshot.status)
        elif snapshot.phase != "running":  # the final phase: what it waits for
            parts.append(snapshot.phase)
        parts += [f"{rate} rows/s", f"checkpoints {snapshot.checkpoints}"]
    else:
        parts = [f"{snapshot.job} {snapshot.status}", f"{rate} rows/s",
                 f"{snapshot.rows_read:,} rows"]
        if snapshot.last_checkpoint is not None:
            n, duration_s = snapshot.last_checkpoint
            parts.append(f"latest checkpoint #{n} ({duration_s:.2f} s)")
    if snapshot.restarts:
        parts.append(f"restarts {snapshot.restarts}")
    return " | ".join(parts)[:max(width - 1, 20)]


class ProgressLine:
    """Polls a running job's client and redraws its progress line on ``stream`` (``in_place``:
    a terminal's; else a new line each time, after the seconds since it started)."""

    def __init__(self, client: Any, extent: Extent, stream: TextIO,
                 every_s: float = REFRESH_S, *, in_place: bool = True) -> None:
        self.client, self.extent, self.stream, self.every_s = client, extent, stream, every_s
        self.in_place = in_place
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="raystream progress line",
                                        daemon=True)
        self._read = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # a poll may wait on a job master that is restarting: the job's end does not
        self._thread.join(timeout=STOP_WAIT_S)
        if self.in_place:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                snapshot = self.snapshot()
            except Exception:  # the job ended (its master with it): the caller stops us
                continue
            if self._stop.is_set():  # it ended while we asked
                return
            try:
                if self.in_place:
                    width = shutil.get_terminal_size((100, 24)).columns
                    self.stream.write(CLEAR_LINE + render(snapshot, self.extent, width))
                else:
                    elapsed = time.monotonic() - self._started
                    self.stream.write(f"raystream: [{elapsed:5.0f} s] "
                                      f"{render(snapshot, self.extent, LOG_WIDTH)}\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):  # nobody reads it any more, or closed
                return

    def snapshot(self) -> Snapshot:
        progress = self.client.progress()  # its figures: engine.job_progress.JobProgress
        # the master's count never goes back, nor this one when a new master takes over
        self._read = max(self._read, int(progress.get("rows_read", 0)))
        completed = [c for c in progress["checkpoints"] if str(_field(c, "status")) == "COMPLETED"]
        last = completed[-1] if completed else None
        return Snapshot(self.client.job_name, str(progress["status"]), self._read,
                        progress.get("read_per_s"), len(completed),
                        (_field(last, "checkpoint_id"), _field(last, "duration_s"))
                        if last is not None else None, progress["attempt"],
                        progress.get("phase", "running"))


def _field(record: Any, name: str) -> Any:
    return record[name] if isinstance(record, dict) else getattr(record, name)


def is_terminal(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    if stream is None:  # no stderr (pythonw)
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file behind it
        return False


def log_every_s(environ: Any = os.environ) -> float:
    """Seconds between the progress lines of output that is not a terminal:
    ``RAYSTREAM_PROGRESS_EVERY``, else 5.

        >>> log_every_s({}), log_every_s({"RAYSTREAM_PROGRESS_EVERY": "0.5"})
        (5.0, 0.5)
        >>> log_every_s({"RAYSTREAM_PROGRESS_EVERY": "often"})
        Traceback (most recent call last):
        ValueError: RAYSTREAM_PROGRESS_EVERY='often': seconds between progress lines, such as 5 or 0.5 (0: none)
    """
    text = environ.get("RAYSTREAM_PROGRESS_EVERY")
    if text is None:
        return LOG_EVERY_S
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"RAYSTREAM_PROGRESS_EVERY={text!r}: seconds between progress lines, "
                         f"such as 5 or 0.5 (0: none)") from None


@contextlib.contextmanager
def shown(client: Any, transformations: list[Any], stream: TextIO | None = None, *,
          show: bool | None = None, every_s: float | None = None) -> Iterator[None]:
    """Within the block, show ``client``'s progress on ``stream`` (stderr): in place on a
    terminal (cleared at the end), else a line every ``every_s`` seconds (None:
    ``RAYSTREAM_PROGRESS_EVERY``, else 5; 0: none). ``show``: None shows it unless
    ``RAYSTREAM_PROGRESS=0``; True or False decide.

        >>> with shown(client, env.transformations):  # doctest: +SKIP
        ...     result = client.wait()
    """
    stream = sys.stderr if stream is None else stream
    if show is None:
        show = os.environ.get("RAYSTREAM_PROGRESS", "1") != "0"
    in_place = is_terminal(stream)
    if every_s is None:
        every_s = log_every_s()
    if stream is None or not show or (not in_place and every_s <= 0):
        yield
        return
    line = ProgressLine(client, input_extent(transformations), stream,
                        REFRESH_S if in_place else every_s, in_place=in_place)
    line.start()
    try:
        yield
    finally:
        line.stop()
