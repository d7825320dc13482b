"""The job master actor: deploys a job's subtasks, watches them, and reports the outcome.

It creates one :class:`SubtaskActor` per subtask (so it owns them: if the
master dies, they die with it), wires channels, starts the mailbox loops, and
then waits on every subtask's ``await_termination`` call. A subtask that
fails, or whose process dies (Ray raises ``RayActorError`` for that call),
fails the job; the remaining subtasks are cancelled and killed. Failover
(restoring from a checkpoint instead of failing) builds on this.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from raystream.actors.subtask import (SubtaskActor, SubtaskSpec, TerminationReport,
                                      subtask_actor_name)
from raystream.engine.plan import JobPlan

NAMESPACE = "raystream"


@dataclass(frozen=True)
class JobOptions:
    credits: int = 8
    actor_start_timeout_s: float = 120.0


@dataclass
class JobOutcome:
    status: str  # "FINISHED" | "FAILED" | "CANCELED"
    results: dict[int, list[Any]] = field(default_factory=dict)  # sink id -> per-subtask results
    error: str | None = None
    operator: str | None = None
    subtask: int | None = None
    traceback: str | None = None
    deploy_s: float = 0.0
    run_s: float = 0.0
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


@ray.remote(concurrency_groups={"client": 8}, max_restarts=0, max_task_retries=0)
class JobMaster:
    def __init__(self, job_id: str, job_name: str, plan: JobPlan, options: JobOptions) -> None:
        self.job_id = job_id
        self.job_name = job_name
        self.plan = plan
        self.options = options
        self.attempt = 0
        self.status = "CREATED"
        self.outcome: JobOutcome | None = None
        self.finished = threading.Event()
        self.actors: dict[tuple[int, int], Any] = {}
        self._thread = threading.Thread(target=self._run, name="job master", daemon=True)
        self._thread.start()

    # -- client calls --------------------------------------------------------------
    @ray.method(concurrency_group="client")
    def wait(self, timeout_s: float | None = None) -> JobOutcome | None:
        self.finished.wait(timeout_s)
        return self.outcome

    @ray.method(concurrency_group="client")
    def get_status(self) -> str:
        return self.status

    @ray.method(concurrency_group="client")
    def cancel(self) -> None:
        self.status = "CANCELING" if not self.finished.is_set() else self.status
        for actor in list(self.actors.values()):
            actor.cancel.remote()

    @ray.method(concurrency_group="client")
    def subtask_names(self) -> dict[str, list[str]]:
        return {v.name: [subtask_actor_name(self.job_id, v.name, i) for i in range(v.parallelism)]
                for v in self.plan.vertices}

    # -- deployment and monitoring ---------------------------------------------------
    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self.status = "DEPLOYING"
            self._deploy()
            deployed = time.perf_counter()
            self.status = "RUNNING"
            outcome = self._monitor()
            outcome.deploy_s = deployed - started
            outcome.run_s = time.perf_counter() - deployed
        except Exception as exc:  # deployment failed: report it, never hang the client
            outcome = JobOutcome("FAILED", error=f"job '{self.job_name}' could not start: {exc}")
        finally:
            self._kill_all()
        self.outcome = outcome
        self.status = outcome.status
        self.finished.set()

    def _deploy(self) -> None:
        plan, options = self.plan, self.options
        for vertex in plan.vertices:
            for index in range(vertex.parallelism):
                spec = SubtaskSpec(self.job_id, self.job_name, self.attempt, vertex, index,
                                   plan.max_parallelism, options.credits)
                self.actors[(vertex.id, index)] = SubtaskActor.options(
                    name=spec.actor_name, namespace=NAMESPACE,
                    **vertex.resources.ray_options()).remote(spec)
        try:
            ray.get([a.ready.remote() for a in self.actors.values()],
                    timeout=options.actor_start_timeout_s)
        except GetTimeoutError:
            raise RuntimeError(
                f"{len(self.actors)} subtask actors did not start within "
                f"{options.actor_start_timeout_s:.0f} s; the cluster has "
                f"{ray.available_resources()} available") from None
        calls = []
        for vertex in plan.vertices:
            for index in range(vertex.parallelism):
                downstream = {c: self.actors[(e.target_vertex, c.downstream)]
                              for e in vertex.outputs for c in e.output_channels(index)}
                upstream = {c: self.actors[(e.source_vertex, c.upstream)]
                            for e in vertex.inputs for c in e.input_channels(index)}
                calls.append(self.actors[(vertex.id, index)].connect.remote(downstream, upstream))
        ray.get(calls)
        self.terminations = {a.await_termination.remote(): key for key, a in self.actors.items()}
        ray.get([a.start.remote() for a in self.actors.values()])

    def _monitor(self) -> JobOutcome:
        pending = list(self.terminations)
        reports: dict[tuple[int, int], TerminationReport] = {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            key = self.terminations[ready[0]]
            try:
                report = ray.get(ready[0])
            except RayActorError as exc:
                vertex = self.plan.vertices[key[0]]
                report = TerminationReport(
                    key[0], key[1], "FAILED", operator=vertex.name,
                    error=f"subtask {key[1] + 1}/{vertex.parallelism} of '{vertex.name}' died: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            reports[key] = report
            if report.status != "FINISHED":
                return self._stop_after(report, reports)
        results: dict[int, list[Any]] = {}
        for key in sorted(reports):
            for sink_id, value in reports[key].results.items():
                results.setdefault(sink_id, []).append(value)
        return JobOutcome("FINISHED", results, metrics=self._metrics(reports))

    def _stop_after(self, report: TerminationReport, reports) -> JobOutcome:
        for actor in self.actors.values():
            actor.cancel.remote()
        return JobOutcome(report.status, error=report.error, operator=report.operator,
                          subtask=report.index, traceback=report.traceback, metrics=self._metrics(reports))

    def _metrics(self, reports) -> dict[str, dict[str, float]]:
        return {f"{self.plan.vertices[v].name}/{i}": r.metrics for (v, i), r in reports.items()}

    def _kill_all(self) -> None:
        for actor in self.actors.values():
            try:
                ray.kill(actor)
            except Exception:
                pass
