"""What the web UI's JSON endpoints answer: pure functions of a job's published summary
(the cluster's job directory, :mod:`raystream.engine.registry`) and its live subtask
metrics (``JobClient.metrics()``), so they are tested without a server or a browser.

Rates are records per second between two samples of the subtasks' counters; a counter
that went down (the job restarted: new subtasks count from zero) gives no rate until
the next sample.

    >>> graph = [{"id": 0, "name": "numbers", "parallelism": 2, "operators": ["numbers"],
    ...           "inputs": []}]
    >>> rates = RateTracker()
    >>> _ = rates.update({"numbers/0": {"records_out": 100}, "numbers/1": {"records_out": 50}}, 10.0)
    >>> now = {"numbers/0": {"records_out": 300, "backpressure": 0.25},
    ...        "numbers/1": {"records_out": 150, "watermark_lag_ms": 900.0}}
    >>> vertex = vertex_figures(graph, now, rates.update(now, 12.0))[0]
    >>> vertex["records_out_per_s"], vertex["backpressure"], vertex["watermark_lag_ms"]
    (150.0, 0.25, 900.0)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

# counters whose growth per second the UI shows
RATE_COUNTERS = ("records_in", "records_out", "bytes_in", "bytes_out")
MIN_SAMPLE_GAP_S = 0.5  # two browser tabs polling at once must not make a rate of noise


@dataclass
class RateTracker:
    """Per-subtask rates of the counters in :data:`RATE_COUNTERS` between two samples."""

    _last: tuple[float, dict[str, dict[str, float]]] | None = None
    _rates: dict[str, dict[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, metrics: dict[str, dict[str, float]], now: float
               ) -> dict[str, dict[str, float]]:
        """Take a sample at ``now`` (seconds); the rates, by ``"chain/index"``."""
        with self._lock:
            if self._last is not None and now - self._last[0] < MIN_SAMPLE_GAP_S:
                return self._rates
            if self._last is not None:
                then, before = self._last
                rates = {}
                for subtask, figures in metrics.items():
                    old = before.get(subtask)
                    if old is None:
                        continue
                    grown = {k: figures.get(k, 0) - old.get(k, 0) for k in RATE_COUNTERS}
                    if all(v >= 0 for v in grown.values()):  # else: restarted, counts anew
                        rates[subtask] = {k: v / (now - then) for k, v in grown.items()}
                self._rates = rates
            self._last = (now, metrics)
            return self._rates


def vertex_figures(graph: list[dict[str, Any]], metrics: dict[str, dict[str, float]],
                   rates: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each chain of the graph with its subtasks' figures added up: records and bytes per
    second (summed), backpressure and watermark lag (the worst subtask), and the
    records read so far by its sources."""
    out = []
    for vertex in graph:
        mine = [f"{vertex['name']}/{i}" for i in range(vertex["parallelism"])]
        live = [metrics[s] for s in mine if s in metrics]
        rated = [rates[s] for s in mine if s in rates]
        figures: dict[str, Any] = dict(vertex)
        for key in RATE_COUNTERS:
            figures[f"{key}_per_s"] = sum(r[key] for r in rated) if rated else None
        figures["records_in"] = sum(m.get("records_in", 0) for m in live) if live else None
        figures["records_out"] = sum(m.get("records_out", 0) for m in live) if live else None
        figures["backpressure"] = _worst(live, "backpressure")
        figures["watermark_lag_ms"] = _worst(live, "watermark_lag_ms")
        figures["subtasks_running"] = len(live)
        figures["pools"] = pool_figures(vertex["operators"], live)
        out.append(figures)
    return out


def pool_figures(operators: list[str], live: list[dict[str, float]]) -> list[dict[str, Any]]:
    """The model pools (``map_batches`` with a class) among a chain's ``operators``, each
    over the chain's subtasks: actors and batches queued (summed), the actors' busy time
    (summed) and the mean latency of a batch (the worst subtask's).

        >>> live = [{"score.pool_size": 2, "score.pool_queue": 1, "score.pool_busy_s": 3.0,
        ...          "score.pool_batch_latency_ms": 40.0},
        ...         {"score.pool_size": 3, "score.pool_queue": 0, "score.pool_busy_s": 1.0,
        ...          "score.pool_batch_latency_ms": 55.0}]
        >>> pool_figures(["source", "score"], live)
        [{'operator': 'score', 'actors': 5, 'queue': 1, 'busy_s': 4.0, 'latency_ms': 55.0}]
    """
    pools = []
    for name in operators:
        mine = [m for m in live if f"{name}.pool_size" in m]
        if mine:
            total = lambda key: sum(m.get(f"{name}.{key}", 0) for m in mine)  # noqa: E731
            pools.append({"operator": name, "actors": total("pool_size"),
                          "queue": total("pool_queue"), "busy_s": total("pool_busy_s"),
                          "latency_ms": max(m.get(f"{name}.pool_batch_latency_ms", 0.0)
                                            for m in mine)})
    return pools


def _worst(live: list[dict[str, float]], key: str) -> float | None:
    values = [m[key] for m in live if m.get(key) is not None]
    return max(values) if values else None


def checkpoint_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The checkpoint history as table rows (oldest first), with the figures the chart
    draws: duration, state size, alignment time and in-flight (unaligned) bytes."""
    return [{"id": c["checkpoint_id"], "status": str(c["status"]),
             "triggered_ms": c["trigger_ts_ms"], "duration_s": c.get("duration_s", 0.0),
             "size": c.get("size", 0), "alignment_s": c.get("alignment_s") or 0.0,
             "unaligned_bytes": c.get("channel_state_bytes", 0),
             "unaligned": bool(c.get("unaligned")), "savepoint": c.get("savepoint"),
             "reason": c.get("reason") or ""}
            for c in summary.get("checkpoints", [])]


def failure_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each failure of the job, with the restart that followed it (if any) and the
    traceback where the failing subtask sent one."""
    details = summary.get("failure_details")
    if details is None:  # published by a job master without them: the messages only
        details = [{"attempt": None, "at": None, "error": e, "operator": None,
                    "subtask": None, "traceback": None} for e in summary.get("failures", [])]
    restores = list(summary.get("restores", []))
    rows = []
    for i, failure in enumerate(details):
        restore = restores[i] if i < len(restores) else None
        rows.append({**failure, "restarted": restore is not None,
                     "restored_checkpoint": restore.get("checkpoint_id") if restore else None,
                     "restore_s": restore.get("restore_s") if restore else None,
                     "stages": restore.get("stages") if restore else None,
                     "restored_from": restore.get("restored_from") if restore else None})
    return rows


def job_row(summary: dict[str, Any], status: str) -> dict[str, Any]:
    """One line of the jobs table."""
    return {"job_id": summary["job_id"], "name": summary["name"], "status": status,
            "restarts": summary.get("attempt", 0), "started_at": summary.get("started_at"),
            "ended_at": summary.get("ended_at"),
            "checkpoints": sum(c["status"] == "COMPLETED" for c in summary.get("checkpoints", []))}
