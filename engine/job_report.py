"""What a job master reports: the outcome of a job, its sinks' results, its summary.

No Ray here: the outcome goes back to the client, the summary to the
cluster's job directory (:mod:`raystream.engine.registry`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raystream.checkpoint.config import CheckpointConfig
from raystream.checkpoint.coordinator import CheckpointStats
from raystream.engine.failover import Failover
from raystream.engine.job_events import SubtaskKey
from raystream.engine.job_status import JobStatus
from raystream.engine.operators.collect_sink import read_collected
from raystream.engine.plan import JobPlan

PUBLISHED_CHECKPOINTS = 100  # the newest checkpoints a summary lists


@dataclass
class JobOutcome:
    status: JobStatus  # FINISHED, FAILED or CANCELED
    results: dict[int, list[Any]] = field(default_factory=dict)  # sink id -> per-subtask results
    error: str | None = None
    operator: str | None = None
    subtask: int | None = None
    traceback: str | None = None
    deploy_s: float = 0.0
    run_s: float = 0.0
    restarts: int = 0
    failures: list[str] = field(default_factory=list)
    restores: list[dict] = field(default_factory=list)  # per failover: attempt, checkpoint, seconds
    checkpoints: list[Any] = field(default_factory=list)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    error_types: tuple[str, ...] = ()  # of a FAILED job's exception (engine/errors.job_failed_error)


def outcome_of_summary(summary: Mapping[str, Any]) -> JobOutcome:
    """The outcome of an ended job, as its master published it to the job directory
    (without the sinks' results, which only its master held)."""
    return JobOutcome(JobStatus(summary["status"]), error=summary.get("error"),
                      deploy_s=summary.get("deploy_s", 0.0), run_s=summary.get("run_s", 0.0),
                      restarts=summary["attempt"], failures=summary["failures"],
                      restores=summary["restores"],
                      checkpoints=[CheckpointStats(**c) for c in summary["checkpoints"]],
                      metrics=summary.get("metrics") or {})


def sink_results(plan: JobPlan, finished: Mapping[SubtaskKey, dict],
                 checkpoints: CheckpointConfig | None, job_key: str) -> dict[int, list[Any]]:
    """Each sink's results (by transformation id): what its subtasks returned when they
    finished; for a collect sink with checkpoints, the output its committer committed in
    this run (one table), read once every subtask has stopped, so every commit is in."""
    results: dict[int, list[Any]] = {}
    for key in sorted(finished):
        for sink_id, value in finished[key].items():
            if value is not None:
                results.setdefault(sink_id, []).append(value)
    if checkpoints is not None:
        for node in (node for v in plan.vertices for node in v.nodes if node.is_sink):
            table = read_collected(checkpoints.storage, job_key, node.name)
            if table is not None:
                results[node.transformation_id] = [table]
    return results


def graph(plan: JobPlan) -> list[dict[str, Any]]:
    """The plan as data (for the web UI): each chain with its operators, parallelism
    and inputs (the upstream chain and the partitioning)."""
    return [{"id": v.id, "name": v.name, "parallelism": v.parallelism,
             "operators": [node.name for node in v.nodes],
             "inputs": [{"from": e.source_vertex, "partitioning": str(e.partitioning)}
                        for e in v.inputs]}
            for v in plan.vertices]


def job_summary(*, job_id: str, job_name: str, status: JobStatus, attempt: int,
                submission_id: str | None, started_at: float, plan: JobPlan,
                failover: Failover, restores: Sequence[dict], placement: Mapping[str, str],
                checkpoints: Sequence[CheckpointStats], outcome: JobOutcome | None,
                progress: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the cluster's job directory shows of a job (``raystream list``, the web UI);
    ``progress``: an ended job's final figures (a running one's are its master's)."""
    summary = {
        "job_id": job_id, "name": job_name, "status": status,
        "attempt": attempt, "submission_id": submission_id,
        "started_at": started_at, "ended_at": None, "failures": list(failover.failures),
        "restores": list(restores), "plan": plan.describe(),
        "graph": graph(plan), "failure_details": list(failover.failure_details),
        "placement": dict(placement),
        "checkpoints": [dataclasses.asdict(stats)
                        for stats in checkpoints[-PUBLISHED_CHECKPOINTS:]],
    }
    if outcome is not None:
        summary.update(ended_at=time.time(), error=outcome.error, metrics=outcome.metrics,
                       deploy_s=outcome.deploy_s, run_s=outcome.run_s,
                       progress=dict(progress or {}))
    return summary
