"""What the job directory says of a job, checked against the masters alive now: the
CLI's ``list`` and ``status`` and the web UI ask the same questions.

A job's directory entry (:mod:`raystream.engine.registry`) is written by its master; a
job whose status is not terminal but whose master actor is gone was lost with its
driver, and says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from raystream.engine.job_master import NAMESPACE
from raystream.engine.job_options import master_actor_name
from raystream.engine.job_progress import JobProgress
from raystream.engine.registry import TERMINAL_STATUSES

PROGRESS_FIELDS = tuple(f.name for f in dataclasses.fields(JobProgress))


def live_masters() -> set[str]:
    """The names of the job masters alive in the cluster."""
    import ray

    # with all_namespaces, ray returns a dict per actor (its annotation says list[str])
    actors = cast(list[dict[str, str]], ray.util.list_named_actors(all_namespaces=True))
    return {a["name"] for a in actors if a["namespace"] == NAMESPACE}


def status_of(job: dict, live: set[str]) -> str:
    """The job's status, or LOST when it should be running and its master is gone."""
    if job["status"] in TERMINAL_STATUSES or master_actor_name(job["job_id"]) in live:
        return job["status"]
    return f"LOST (was {job['status']}; its driver exited)"


def progress_of(job: dict, live: set[str]) -> dict[str, Any]:
    """A running job's progress (``JobClient.progress()``'s figures of
    :class:`~raystream.engine.job_progress.JobProgress`), the final one of an ended job."""
    from raystream.engine.client import JobClient

    if job["status"] not in TERMINAL_STATUSES and master_actor_name(job["job_id"]) in live:
        try:
            progress = JobClient.attach(job["job_id"]).progress()
            return {key: progress.get(key) for key in PROGRESS_FIELDS}
        except Exception:
            pass  # it just ended: its summary has the final figures
    return job.get("progress") or {}


def metrics_of(job: dict, live: set[str]) -> dict[str, dict[str, float]]:
    """Live metrics of a running job, the final ones of an ended job."""
    from raystream.engine.client import JobClient

    if job["status"] not in TERMINAL_STATUSES and master_actor_name(job["job_id"]) in live:
        try:
            return JobClient.attach(job["job_id"]).metrics()
        except Exception:
            pass  # it just ended: its summary has the final figures
    return job.get("metrics") or {}
