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

import pyarrow as pa

from raystream.checkpoint.coordinator import CheckpointCoordinator, CheckpointStats
from raystream.checkpoint.storage import CheckpointStorage, StateHandle
from raystream.engine.failover import Failover
from raystream.engine.job_events import SubtaskKey
from raystream.engine.job_status import JobStatus
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
                 coordinator: CheckpointCoordinator | None) -> dict[int, list[Any]]:
    """Each sink's results (by transformation id): what its subtasks returned when they
    finished, or with checkpoints the output committed up to the last one (one table)."""
    results: dict[int, list[Any]] = {}
    for key in sorted(finished):
        for sink_id, value in finished[key].items():
            if value is not None:
                results.setdefault(sink_id, []).append(value)
    if coordinator is not None:
        ids = {node.name: node.transformation_id for v in plan.vertices for node in v.nodes}
        for name, handles in coordinator.committed_outputs().items():
            results[ids[name]] = [read_committed(coordinator.storage, handles)]
    return results


def read_committed(storage: CheckpointStorage, handles: list[dict]) -> pa.Table:
    """One table of a sink's committed output files (Arrow IPC streams)."""
    tables = []
    for handle in handles:
        data = storage.read_state(StateHandle.from_json(handle))
        with pa.ipc.open_stream(data) as reader:
            tables.append(reader.read_all())
    tables = [t for t in tables if t.num_columns]
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})


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
                checkpoints: Sequence[CheckpointStats],
                outcome: JobOutcome | None) -> dict[str, Any]:
    """What the cluster's job directory shows of a job (``raystream list``, the web UI)."""
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
                       deploy_s=outcome.deploy_s, run_s=outcome.run_s)
    return summary
