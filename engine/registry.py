"""The cluster's directory of raystream jobs, kept in Ray's key-value store (the GCS).

A job master publishes a summary of its job — status, attempt, failures,
checkpoint history and, at the end, its metrics — when the status changes
and every second while anything changed. The summary outlives the job (and
its driver), for as long as the Ray cluster lives, so ``raystream list``,
``status`` and ``checkpoints`` work from any process connected to the
cluster, for running and for finished jobs. Commands that act on a job
(cancel, savepoint, stop) reach its master, a named actor, instead.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment()
    >>> sink = env.from_sequence(10).collect()
    >>> client = env.execute_async("tiny")  # doctest: +SKIP
    >>> find_job("tiny")["status"] in {"DEPLOYING", "RUNNING", "FINISHED"}  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ray.experimental import internal_kv

from raystream.core.cluster_mark import KV_NAMESPACE
from raystream.engine.errors import JobNotFoundError
from raystream.engine.job_status import JobStatus

log = logging.getLogger(__name__)

KEY_PREFIX = "job:"
TERMINAL_STATUSES = frozenset(s for s in JobStatus if s.is_terminal)


def publish(summary: dict[str, Any]) -> None:
    """Store (replace) the summary of job ``summary["job_id"]``."""
    internal_kv._internal_kv_put(KEY_PREFIX + summary["job_id"], json.dumps(summary, default=str),
                                 overwrite=True, namespace=KV_NAMESPACE)


class SummaryPublisher:
    """A job master's publishing of its job's summary: stored only when it changed (the
    end time aside), due again every ``every_s``; a failure to store it is logged, never
    raised (the directory is for people watching, not for the job).

        >>> publisher = SummaryPublisher(every_s=1.0)
        >>> publisher.due()
        True
    """

    def __init__(self, *, every_s: float) -> None:
        self.every_s = every_s
        self._at, self._text = float("-inf"), ""  # when, what was last stored

    def due(self) -> bool:
        return time.monotonic() - self._at >= self.every_s

    def publish(self, summary: dict[str, Any]) -> None:
        text = json.dumps({k: v for k, v in summary.items() if k != "ended_at"}, default=str)
        if text != self._text:
            try:
                publish(summary)
            except Exception as exc:
                log.warning("could not publish the summary of %s: %s", summary["job_id"], exc)
                return
        self._at, self._text = time.monotonic(), text


def all_jobs() -> list[dict[str, Any]]:
    """Every job this cluster has run, oldest first."""
    keys = internal_kv._internal_kv_list(KEY_PREFIX, namespace=KV_NAMESPACE)
    jobs = []
    for key in keys:
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw is not None:
            jobs.append(json.loads(raw))
    return sorted(jobs, key=lambda job: (job.get("started_at") or 0, job["job_id"]))


def find_job(job: str) -> dict[str, Any]:
    """The summary of a job given by its id, a unique id prefix, or its name.

    A name used by several jobs means the newest of them, unless more than
    one of those is still running (then the id must be given).
    """
    jobs = all_jobs()
    exact = [j for j in jobs if j["job_id"] == job]
    if exact:
        return exact[0]
    named = [j for j in jobs if j["name"] == job]
    running = [j for j in named if j["status"] not in TERMINAL_STATUSES]
    if len(running) > 1:
        raise JobNotFoundError(f"{len(running)} running jobs are named '{job}': "
                               f"{', '.join(j['job_id'] for j in running)}; give the job id")
    if named:
        return (running or named)[-1]
    prefixed = [j for j in jobs if j["job_id"].startswith(job)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise JobNotFoundError(f"'{job}' is the start of several job ids: "
                               f"{', '.join(j['job_id'] for j in prefixed)}")
    raise JobNotFoundError(f"no job '{job}' on this Ray cluster (`raystream list` shows the jobs)")
