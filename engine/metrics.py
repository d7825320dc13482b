"""A job's figures exported as Ray metrics, so Ray's Prometheus endpoint and dashboard
show them (as ``ray_raystream_...``), tagged with the job: the job master exports each
completed or failed checkpoint, and the job's restarts. Each subtask's own figures are
exported by :mod:`raystream.actors.subtask_metrics`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

JOB_TAGS = ("job", "job_id")


@functools.cache
def _job_metrics() -> dict[str, Any]:
    from ray.util.metrics import Counter, Gauge

    return {
        "completed": Counter("raystream_checkpoints_completed",
                             "Checkpoints of a job that completed", tag_keys=JOB_TAGS),
        "failed": Counter("raystream_checkpoints_failed",
                          "Checkpoints of a job that were aborted", tag_keys=JOB_TAGS),
        "duration_s": Gauge("raystream_checkpoint_duration_s",
                            "Duration of a job's last completed checkpoint", tag_keys=JOB_TAGS),
        "size": Gauge("raystream_checkpoint_size_bytes",
                      "State size of a job's last completed checkpoint", tag_keys=JOB_TAGS),
        "alignment_s": Gauge("raystream_checkpoint_alignment_s",
                             "Longest barrier alignment in a job's last completed checkpoint",
                             tag_keys=JOB_TAGS),
        "restarts": Gauge("raystream_job_restarts", "Restarts (failovers) of a job so far",
                          tag_keys=JOB_TAGS),
    }


class JobMetricsExporter:
    """Exports a job's checkpoints (as they complete or fail) and restarts to Ray's metrics."""

    def __init__(self, job: str, job_id: str) -> None:
        self.tags = {"job": job, "job_id": job_id}
        self._seen: set[int] = set()

    def export(self, checkpoints: list[Any], restarts: int) -> None:
        """``checkpoints``: the job's CheckpointStats; each finished one is counted once."""
        try:
            metrics = _job_metrics()
            for stats in checkpoints:
                if stats.status == "PENDING" or stats.checkpoint_id in self._seen:
                    continue
                self._seen.add(stats.checkpoint_id)
                if stats.status == "COMPLETED":
                    metrics["completed"].inc(1, tags=self.tags)
                    metrics["duration_s"].set(stats.duration_s, tags=self.tags)
                    metrics["size"].set(stats.size, tags=self.tags)
                    metrics["alignment_s"].set(stats.alignment_s or 0.0, tags=self.tags)
                else:
                    metrics["failed"].inc(1, tags=self.tags)
            metrics["restarts"].set(restarts, tags=self.tags)
        except Exception as exc:
            log.warning("job metrics not exported: %s: %s", type(exc).__name__, exc)
