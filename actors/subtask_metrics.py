"""One subtask's figures exported as Ray metrics, so Ray's Prometheus endpoint and
dashboard show them (as ``ray_raystream_...``), tagged with the job, operator and subtask.

A subtask exports its figures every ``EXPORT_EVERY_S`` seconds from its mailbox loop, and
once more when it ends; counters are incremented by what changed since the last export,
so a restarted job's new subtasks add to the same series. The job's own figures are in
:mod:`raystream.engine.metrics`.

    >>> exporter = SubtaskMetricsExporter("clicks", "clicks-1a2b3c4d", "per-user", 0)  # doctest: +SKIP
    >>> exporter.export({"records_in": 8192, "bytes_in": 65536, "backpressure": 0.1})  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

EXPORT_EVERY_S = 2.0
SUBTASK_TAGS = ("job", "job_id", "operator", "subtask")

# subtask figure -> (metric name, description); counters grow, gauges are set
SUBTASK_COUNTERS = {
    "records_in": ("raystream_records_in", "Records a subtask received"),
    "records_out": ("raystream_records_out", "Records a subtask sent downstream"),
    "bytes_in": ("raystream_bytes_in", "Bytes of record batches a subtask received"),
    "bytes_out": ("raystream_bytes_out", "Bytes of record batches a subtask sent downstream"),
    "batches_in": ("raystream_batches_in", "Record batches a subtask received"),
    "batches_out": ("raystream_batches_out", "Record batches a subtask sent downstream"),
}
SUBTASK_GAUGES = {
    "backpressure": ("raystream_backpressure_ratio",
                     "Fraction of its time a subtask waited for credit (backpressured)"),
    "watermark_lag_ms": ("raystream_watermark_lag_ms",
                         "Wall-clock time minus the subtask's input watermark, in ms"),
    "checkpoint_duration_s": ("raystream_subtask_checkpoint_duration_s",
                              "Duration of the subtask's last acknowledged checkpoint"),
    "checkpoint_size": ("raystream_subtask_checkpoint_size_bytes",
                        "State size of the subtask's last acknowledged checkpoint"),
    "checkpoint_alignment_s": ("raystream_subtask_checkpoint_alignment_s",
                               "Barrier alignment time of the subtask's last checkpoint"),
    "checkpoint_sync_pause_s": ("raystream_subtask_checkpoint_sync_pause_s",
                                "Processing pause of the subtask's last synchronous snapshot"),
}


@functools.cache
def _subtask_metrics() -> dict[str, Any]:
    from ray.util.metrics import Counter, Gauge

    metrics: dict[str, Any] = {key: Counter(name, description, tag_keys=SUBTASK_TAGS)
                               for key, (name, description) in SUBTASK_COUNTERS.items()}
    metrics.update({key: Gauge(name, description, tag_keys=SUBTASK_TAGS)
                    for key, (name, description) in SUBTASK_GAUGES.items()})
    return metrics


class SubtaskMetricsExporter:
    """Exports one subtask's figures (the dict of ``Subtask.metrics()``) to Ray's metrics."""

    def __init__(self, job: str, job_id: str, operator: str, subtask: int,
                 every_s: float = EXPORT_EVERY_S) -> None:
        self.tags = {"job": job, "job_id": job_id, "operator": operator, "subtask": str(subtask)}
        self.every_s = every_s
        self._exported: dict[str, float] = {}
        self._due = 0.0
        self._failed = False

    def due(self, now: float) -> bool:
        return now >= self._due

    def maybe_export(self, now: float, read: Callable[[], dict[str, float]]) -> None:
        if now >= self._due:
            self._due = now + self.every_s
            self.export(read())

    def export(self, figures: dict[str, float]) -> None:
        try:
            metrics = _subtask_metrics()
            for key in SUBTASK_COUNTERS:
                grown = figures.get(key, 0) - self._exported.get(key, 0)
                if grown > 0:
                    metrics[key].inc(grown, tags=self.tags)
                    self._exported[key] = figures[key]
            for key in SUBTASK_GAUGES:
                if figures.get(key) is not None:
                    metrics[key].set(figures[key], tags=self.tags)
        except Exception as exc:  # metrics are for watching: never fail the subtask
            if not self._failed:
                log.warning("subtask metrics not exported: %s: %s", type(exc).__name__, exc)
                self._failed = True
