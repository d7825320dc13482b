"""The job master actor: deploys a job's subtasks, runs its checkpoints, fails it over.

One event thread owns all job state (Trio-style: every transition in one
place). Subtasks and clients only put events (:mod:`raystream.engine.job_events`)
on its queue:

* a subtask *finished* (all its input ended and its output is sent);
* a checkpoint acknowledged or declined (handed to the checkpoint coordinator);
* a subtask's ``await_termination`` call returned FAILED, or raised because
  its process died (``RayActorError``) — the job fails over.

Failover is global: every subtask is killed and the job is redeployed as a
new *attempt* from the latest completed checkpoint, after the restart
strategy's delay, until its attempts run out. Messages of older attempts are
dropped everywhere. A job without checkpoints fails on the first failure.

End of input (FLIP-147): once every subtask has finished, the master triggers
a final checkpoint; the job is FINISHED when it completes, so the tail of the
output is committed. Then the subtasks are stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from raystream.actors.subtask import SubtaskActor, SubtaskSpec, TerminationReport
from raystream.actors.subtask_checkpoints import CheckpointingSpec, RestoreSpec
from raystream.checkpoint.config import CheckpointConfig, RestartStrategy
from raystream.checkpoint.coordinator import (CheckpointCoordinator, CheckpointStatus,
                                              SavepointTicket, TooManyCheckpointFailures)
from raystream.checkpoint.coordinator_holder import CoordinatorFailure, OperatorCoordinators
from raystream.checkpoint.storage import (CheckpointStorage, CorruptCheckpointError, StateHandle,
                                          StorageUnavailableError)
from raystream.checkpoint.subtask_gateway import EventDeliveryError, GatewayProtocolError
from raystream.engine import registry
from raystream.engine.errors import JobNotRunningError
from raystream.engine.failpoints import Failpoint, Failpoints, InjectedFailure
from raystream.engine.graph import Resources
from raystream.engine.job_events import (CancelRequested, CheckpointAcknowledged,
                                         CheckpointDeclined, GatewayAcknowledged, JobEvent,
                                         OperatorEventReceived, Reply, SavepointMode,
                                         SavepointRequest, SavepointRequested, SubtaskFinished)
from raystream.engine.job_status import JobStatus, check_transition
from raystream.engine.metrics import JobMetricsExporter
from raystream.engine.plan import JobPlan

log = logging.getLogger(__name__)

NAMESPACE = "raystream"
POLL_S = 0.05
# Unaligned checkpoints are taken between two slices of a received batch: about
# Flink's network buffer (32 KiB), so a barrier never waits behind a whole message.
UNALIGNED_SLICE_BYTES = 32 * 1024
RELEASE_WAIT_S = 2.0  # for the subtasks of a failed or canceled job to end before pooling
HOST_TIMEOUT_S = 20.0  # a live actor hosts its next subtask within this (it stops the old one first)
# Subtasks spread over the cluster's nodes (within what each operator asks for), so one
# lost node costs a part of every operator, and a job uses every node's CPUs and memory.
SUBTASK_SCHEDULING = "SPREAD"
NODE_PING_TIMEOUT_S = 2.0  # how long the subtasks of a node that may be lost get to answer
PUBLISH_EVERY_S = 1.0  # how often a changed job summary goes to the cluster's job directory
PUBLISHED_CHECKPOINTS = 100  # the newest checkpoints a summary lists


def master_actor_name(job_id: str) -> str:
    """The Ray actor name (in namespace ``raystream``) of a job's master."""
    return f"raystream/{job_id}/master"


@dataclass(frozen=True)
class JobOptions:
    credits: int = 8
    actor_start_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0  # for every subtask to stop (and confirm its final commit)
    checkpoints: CheckpointConfig | None = None
    restart: RestartStrategy = field(default_factory=RestartStrategy.none)
    failpoints: tuple[Failpoint, ...] = ()
    restore_from: str | None = None
    submission_id: str | None = None  # the Ray Jobs API submission that runs the driver
    # idle subtask actors of the driver's pool for the first attempt (engine/actor_pool.py),
    # and the keeper they go back to when the job ends
    pooled: tuple[Any, ...] = ()
    keeper: Any = None
    # a detached job master outlives its driver, and ends itself DETACHED_LINGER_S after
    # the job ended (time for a client to fetch the outcome) unless a client ends it first
    detached: bool = False


DETACHED_LINGER_S = 600.0


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


class _RayDelivery:
    """The delivery of an operator event: a Ray call to the subtask's control lane."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self._error: BaseException | None = None
        self._done = False

    def done(self) -> bool:
        if not self._done:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                self._done = True
                try:
                    ray.get(self.ref)
                except Exception as exc:
                    self._error = exc
        return self._done

    def error(self) -> BaseException | None:
        return self._error


class _Failure(Exception):
    """A subtask failed (raised inside the event thread to start a failover)."""

    def __init__(self, report: TerminationReport) -> None:
        super().__init__(report.error)
        self.report = report


def _deployment_failure(exc: RayActorError) -> _Failure:
    """A subtask's process died while its attempt was being deployed."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return _Failure(TerminationReport(
        -1, -1, "FAILED", operator="deployment",
        error=f"a subtask died during deployment: {type(exc).__name__}: {first_line}"))


@ray.remote(concurrency_groups={"client": 8, "control": 1}, max_restarts=0, max_task_retries=0)
class JobMaster:
    def __init__(self, job_id: str, job_name: str, plan: JobPlan, options: JobOptions) -> None:
        self.job_id, self.job_name, self.plan, self.options = job_id, job_name, plan, options
        self.attempt = 0
        self.status = JobStatus.CREATED
        self.outcome: JobOutcome | None = None
        self.done = threading.Event()
        self.events: queue.Queue[JobEvent] = queue.Queue()
        self.actors: dict[tuple[int, int], Any] = {}
        self.placement: dict[str, str] = {}  # "chain/index" -> id of the node it runs on
        self.died_on: set[str] = set()  # nodes where subtasks of this attempt died
        self.terminations: dict[Any, tuple[int, int]] = {}
        self.finished: dict[tuple[int, int], dict] = {}
        self.failures: list[str] = []
        # each failure with where it happened and its traceback, for the web UI
        self.failure_details: list[dict] = []
        self.restores: list[dict] = []
        self.coordinator = None
        # the operator coordinators (split enumerators, ...) with their subtask gateways
        self.operator_coordinators = OperatorCoordinators([])  # created by the event thread
        self.spare: Any = None  # a warm, empty subtask actor for failover
        self.pooled = list(options.pooled)  # the driver's actors, until the first deployment
        self._pooled_ids = {actor._actor_id for actor in options.pooled}
        self.savepoints: dict[int, SavepointRequest] = {}  # by the id of its checkpoint
        # asked for, waiting in the coordinator for a free checkpoint slot
        self.queued_savepoints: list[tuple[SavepointTicket, SavepointRequest]] = []
        self.draining: SavepointRequest | None = None  # its savepoint is the final checkpoint
        self.started_at = time.time()
        self.exporter = JobMetricsExporter(job_name, job_id)
        self._published: tuple[float, str] = (float("-inf"), "")  # when, what
        self._thread = threading.Thread(target=self._run, name="job master", daemon=True)
        self._thread.start()

    # -- client calls ----------------------------------------------------------------------
    @ray.method(concurrency_group="client")
    def wait(self, timeout_s: float | None = None) -> JobOutcome | None:
        self.done.wait(timeout_s)
        return self.outcome

    @ray.method(concurrency_group="client")
    def get_status(self) -> str:
        return self.status

    @ray.method(concurrency_group="client")
    def cancel(self) -> None:
        self.events.put(CancelRequested())

    @ray.method(concurrency_group="client")
    def savepoint(self, path: str, stop: bool = False, drain: bool = False,
                  timeout_s: float | None = None) -> str:
        """Take a savepoint to ``path``; with ``stop`` the job ends after it (FINISHED)."""
        if self.done.is_set():  # the event loop has ended: nothing would answer
            raise JobNotRunningError(f"job {self.job_id} is {self.status}")
        mode = (SavepointMode.DRAIN if drain else SavepointMode.STOP if stop
                else SavepointMode.KEEP_RUNNING)
        request = SavepointRequest(path, mode, Reply())
        self.events.put(SavepointRequested(request))
        return request.reply.wait(timeout_s)

    @ray.method(concurrency_group="client")
    def subtask_actors(self) -> dict[str, list[Any]]:
        """The actors hosting the current attempt's subtasks, by chain."""
        actors = dict(self.actors)
        return {v.name: [actors.get((v.id, i)) for i in range(v.parallelism)]
                for v in self.plan.vertices}

    @ray.method(concurrency_group="client")
    def get_placement(self) -> dict[str, str]:
        """The node (id) of the job master and of every subtask of the current attempt,
        by "chain/index"."""
        return {"job master": ray.get_runtime_context().get_node_id(), **self.placement}

    @ray.method(concurrency_group="client")
    def metrics(self) -> dict[str, dict[str, float]]:
        """Live metrics of every subtask of the current attempt, by "chain/index"
        (none while the job deploys or restarts)."""
        return self._collect_metrics() if self.status is JobStatus.RUNNING else {}

    @ray.method(concurrency_group="client")
    def progress(self) -> dict[str, Any]:
        coordinator = self.coordinator
        return {"status": self.status, "attempt": self.attempt, "failures": list(self.failures),
                "restores": list(self.restores), "master_pid": os.getpid(),
                "completed_checkpoints": ([c.checkpoint_id for c in coordinator.completed]
                                          if coordinator else []),
                "checkpoints": coordinator.stats() if coordinator else []}

    # -- subtask calls (control lane) ---------------------------------------------------------
    @ray.method(concurrency_group="control")
    def report_finished(self, attempt: int, vertex: int, index: int, results: dict) -> None:
        self.events.put(SubtaskFinished(attempt, (vertex, index), results))

    @ray.method(concurrency_group="control")
    def acknowledge_checkpoint(self, attempt: int, checkpoint_id: int, vertex: int, index: int,
                               written: dict, stats: dict) -> None:
        self.events.put(CheckpointAcknowledged(attempt, checkpoint_id, (vertex, index), written,
                                                stats))

    @ray.method(concurrency_group="control")
    def decline_checkpoint(self, attempt: int, checkpoint_id: int, vertex: int, index: int,
                           reason: str) -> None:
        self.events.put(CheckpointDeclined(attempt, checkpoint_id, (vertex, index), reason))

    @ray.method(concurrency_group="control")
    def operator_event(self, attempt: int, operator: str, index: int, event: Any) -> None:
        """An operator event from subtask ``index`` of ``operator`` to its coordinator."""
        self.events.put(OperatorEventReceived(attempt, operator, index, event))

    @ray.method(concurrency_group="control")
    def acknowledge_coordinator_checkpoint(self, attempt: int, operators: list[str], index: int,
                                           checkpoint_id: int) -> None:
        """Subtask ``index`` of ``operators`` took its synchronous snapshot of the checkpoint."""
        self.events.put(GatewayAcknowledged(attempt, tuple(operators), index, checkpoint_id))

    # -- the event thread ------------------------------------------------------------------------
    def _run(self) -> None:
        started = time.perf_counter()
        deploy_s = 0.0
        try:
            self._set_status(JobStatus.DEPLOYING)
            self._publish()
            self.operator_coordinators = OperatorCoordinators(self.plan.coordinated_operators())
            self._create_coordinator()
            restore = None
            if self.options.restore_from is not None:
                restore = self.coordinator.restore_from(self.options.restore_from)
            self.operator_coordinators.start()
            if restore is not None:
                self._reset_operator_coordinators(restore)
            outcome = self._deploy_first(restore)
            deploy_s = time.perf_counter() - started
            if outcome is None:
                if self.status is JobStatus.DEPLOYING:  # else a failover while deploying ran it
                    self._set_status(JobStatus.RUNNING)
                self._publish()
                outcome = self._event_loop()
        except Exception as exc:  # could not deploy: report it, never hang the client
            outcome = JobOutcome(JobStatus.FAILED, error=f"job '{self.job_name}' could not run: "
                                                 f"{type(exc).__name__}: {exc}")
        finally:
            self._answer_open_savepoints("the job ended before it")
            self.operator_coordinators.close()
            self._release_actors()
        outcome.deploy_s = deploy_s
        outcome.run_s = time.perf_counter() - started - deploy_s
        outcome.restarts = self.attempt
        outcome.failures = list(self.failures)
        outcome.restores = list(self.restores)
        outcome.checkpoints = self.coordinator.stats() if self.coordinator else []
        self.outcome = outcome
        self._set_status(outcome.status)
        self._publish()
        self.done.set()
        if self.options.detached:  # no driver may be left to end it
            time.sleep(DETACHED_LINGER_S)
            ray.kill(ray.get_runtime_context().current_actor)

    def _set_status(self, status: JobStatus) -> None:
        """Every status change goes through here (checked against the transition table)."""
        self.status = check_transition(self.status, status)

    def _event_loop(self) -> JobOutcome:
        while True:
            try:
                outcome = self._step()
                if outcome is not None:
                    return outcome
            except (_Failure, InjectedFailure, TooManyCheckpointFailures, CoordinatorFailure,
                    EventDeliveryError, GatewayProtocolError) as failure:
                outcome = self._failover(failure)
                if outcome is not None:
                    return outcome

    def _step(self) -> JobOutcome | None:
        """Handle what happened since the last step; an outcome ends the job."""
        timeout = POLL_S
        due = self.operator_coordinators.next_due()
        if due is not None:  # a coordinator's call_later: do not sleep past it
            timeout = min(POLL_S, max(0.0, due - time.monotonic()))
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            event = None
        while event is not None:
            outcome = self._handle(event)
            if outcome is not None:
                return outcome
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                event = None
        ready, _ = ray.wait(list(self.terminations), num_returns=1, timeout=0)
        if ready:
            report = self._termination_report(ready[0])
            if report.status != "FINISHED":
                raise _Failure(report)
        self.operator_coordinators.run_due(time.monotonic())
        if self.coordinator is not None:
            self.coordinator.tick(time.monotonic())
            outcome = self._answer_savepoints()
            if outcome is not None:
                return outcome
        if time.monotonic() - self._published[0] >= PUBLISH_EVERY_S:
            self._publish()
        return self._maybe_finish()

    def _answer_savepoints(self) -> JobOutcome | None:
        queued = []
        for ticket, request in self.queued_savepoints:
            if ticket.checkpoint_id is None:
                queued.append((ticket, request))
            else:
                self.savepoints[ticket.checkpoint_id] = request
        self.queued_savepoints = queued
        for n, request in list(self.savepoints.items()):
            stats = self.coordinator.history[n]
            if stats.status is CheckpointStatus.PENDING:
                continue
            del self.savepoints[n]
            if stats.status is not CheckpointStatus.COMPLETED:
                request.reply.set(error=f"savepoint {n} failed: {stats.reason}")
                if request is self.draining:  # the input has ended: a checkpoint ends the job
                    self.draining = None
            elif request.mode is SavepointMode.KEEP_RUNNING:
                request.reply.set(stats.savepoint)
            elif request.mode is SavepointMode.STOP:
                return self._end_after_savepoint(request)
        return None

    def _end_after_savepoint(self, request: SavepointRequest) -> JobOutcome:
        """End the job after its completed stop savepoint. The caller hears of success once
        every subtask has stopped; if one fails instead, the job fails over to the savepoint
        (its output is committed: never rolled back) and the caller is told so."""
        try:
            outcome = self._end(JobStatus.FINISHED)
        except _Failure as failure:
            request.reply.set(error=f"savepoint {request.path} is complete, but the job did not "
                                    f"stop ({failure}); it goes on from that savepoint")
            raise
        request.reply.set(request.path)
        return outcome

    def _answer_open_savepoints(self, reason: str) -> None:
        """A failover or the end of the job: every savepoint not answered yet is answered
        now (a completed one that was to stop the job did not stop it)."""
        open_requests = list(self.savepoints.items())
        open_requests += [(ticket.checkpoint_id, request)
                          for ticket, request in self.queued_savepoints]
        if self.draining is not None and self.draining not in self.savepoints.values():
            open_requests.append((None, self.draining))
        self.savepoints, self.queued_savepoints, self.draining = {}, [], None
        for n, request in open_requests:
            stats = self.coordinator.history.get(n) if self.coordinator and n else None
            if stats is not None and stats.status is CheckpointStatus.COMPLETED:
                if request.mode is SavepointMode.KEEP_RUNNING:
                    request.reply.set(stats.savepoint)
                else:
                    request.reply.set(error=f"savepoint {request.path} is complete, but the job "
                                            f"did not stop: {reason}")
            else:
                request.reply.set(error=f"savepoint to {request.path} failed: {reason}")

    def _handle(self, event: JobEvent) -> JobOutcome | None:
        coordinator = self.coordinator
        match event:
            case CancelRequested():
                for actor in self.actors.values():
                    actor.cancel.remote()
                return JobOutcome(JobStatus.CANCELED)
            case SubtaskFinished(attempt, subtask, results) if attempt == self.attempt:
                self.finished[subtask] = results
            case SavepointRequested(request):
                self._handle_savepoint_request(request)
            case OperatorEventReceived(attempt, operator, index, payload) if (
                    attempt == self.attempt):
                self.operator_coordinators.handle_event_from_subtask(operator, index, payload)
            case GatewayAcknowledged(attempt, operators, index, n) if attempt == self.attempt:
                self.operator_coordinators.acknowledge(list(operators), index, n)
            case CheckpointAcknowledged(attempt, n, subtask, written, stats) if (
                    coordinator is not None):
                coordinator.acknowledge(attempt, n, subtask, written, stats)
            case CheckpointDeclined(attempt, n, subtask, reason) if coordinator is not None:
                coordinator.decline(attempt, n, subtask, reason)
        return None  # anything else: an older attempt's, or no coordinator to hand it to

    def _handle_savepoint_request(self, request: SavepointRequest) -> None:
        if self.coordinator is None:
            request.reply.set(
                error="savepoints need checkpoints: StreamEnvironment(checkpoints=...)")
        elif request.mode is SavepointMode.DRAIN:  # the final checkpoint goes to its path
            self.draining = request
            for (vertex, _), actor in self.actors.items():
                if self.plan.vertices[vertex].is_source:
                    actor.drain.remote()
        else:
            try:
                ticket = self.coordinator.request_savepoint(
                    request.path, stop=request.mode is SavepointMode.STOP)
            except Exception as exc:  # the job may fail over: the caller still hears
                request.reply.set(error=f"savepoint to {request.path} failed: "
                                        f"{type(exc).__name__}: {exc}")
                raise
            self.queued_savepoints.append((ticket, request))

    def _maybe_finish(self) -> JobOutcome | None:
        if len(self.finished) < len(self.actors):
            return None
        coordinator = self.coordinator
        if coordinator is not None:
            final = coordinator.final_checkpoint
            if final is None:
                if not coordinator.final_due(time.monotonic()):
                    return None
                target = self.draining.path if self.draining else None
                n = coordinator.trigger(final=True, savepoint_target=target,
                                        stop=target is not None)
                if self.draining is not None:
                    self.savepoints[n] = self.draining
                return None
            if not any(c.checkpoint_id == final for c in coordinator.completed):
                return None
            if self.draining is not None:
                request, self.draining = self.draining, None
                return self._end_after_savepoint(request)
        return self._end(JobStatus.FINISHED)

    def _end(self, status: JobStatus) -> JobOutcome:
        """The job is over: stop every subtask, then gather results and metrics.

        A subtask handles its mailbox in order, so once it has stopped it has
        also handled the final checkpoint's notification (a committer has
        committed it). A subtask that fails on the way, or has not stopped
        after ``stop_timeout_s`` (a committer still committing, a hung sink),
        fails the job over: the job is never reported finished before every
        final commit was confirmed.
        """
        metrics = self._collect_metrics()
        for actor in self.actors.values():
            actor.stop.remote()
        pending = list(self.terminations)
        done, not_done = ray.wait(pending, num_returns=len(pending),
                                  timeout=self.options.stop_timeout_s)
        for ref in done:
            report = self._termination_report(ref)
            if report.status == "FAILED":
                raise _Failure(report)
        if not_done:
            raise _Failure(self._not_stopped(not_done))
        return JobOutcome(status, self._results(), metrics=metrics)

    def _not_stopped(self, refs: list[Any]) -> TerminationReport:
        """The failure of subtasks that did not confirm their stop (and so their final
        commit) in time."""
        keys = [self.terminations[ref] for ref in refs]
        names = [f"subtask {index + 1}/{self.plan.vertices[vertex].parallelism} of "
                 f"'{self.plan.vertices[vertex].name}'" for vertex, index in keys]
        vertex, index = keys[0]
        return TerminationReport(
            vertex, index, "FAILED", operator=self.plan.vertices[vertex].name,
            error=f"{', '.join(names)} did not stop within {self.options.stop_timeout_s:g} s after the "
                  f"final checkpoint: its final commit is not confirmed")

    def _results(self) -> dict[int, list[Any]]:
        results: dict[int, list[Any]] = {}
        for key in sorted(self.finished):
            for sink_id, value in self.finished[key].items():
                if value is not None:
                    results.setdefault(sink_id, []).append(value)
        if self.coordinator is not None:
            ids = {node.name: node.transformation_id for v in self.plan.vertices for node in v.nodes}
            for name, handles in self.coordinator.committed_outputs().items():
                results[ids[name]] = [self._read_committed(handles)]
        return results

    def _read_committed(self, handles: list[dict]) -> pa.Table:
        from raystream.checkpoint.storage import StateHandle

        tables = []
        for handle in handles:
            data = self.coordinator.storage.read_state(StateHandle.from_json(handle))
            with pa.ipc.open_stream(data) as reader:
                tables.append(reader.read_all())
        tables = [t for t in tables if t.num_columns]
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})

    def _collect_metrics(self) -> dict[str, dict[str, float]]:
        actors = self.actors  # the event thread may replace it (failover)
        names = {key: f"{self.plan.vertices[key[0]].name}/{key[1]}" for key in actors}
        refs = {key: actor.metrics.remote() for key, actor in actors.items()}
        try:
            return {names[k]: v for k, v in zip(refs, ray.get(list(refs.values()), timeout=10))}
        except Exception:
            return {}

    # -- the cluster's job directory ----------------------------------------------------------
    def _summary(self) -> dict[str, Any]:
        coordinator, outcome = self.coordinator, self.outcome
        checkpoints = coordinator.stats()[-PUBLISHED_CHECKPOINTS:] if coordinator else []
        summary = {
            "job_id": self.job_id, "name": self.job_name, "status": self.status,
            "attempt": self.attempt, "submission_id": self.options.submission_id,
            "started_at": self.started_at, "ended_at": None, "failures": list(self.failures),
            "restores": list(self.restores), "plan": self.plan.describe(),
            "graph": self._graph(), "failure_details": list(self.failure_details),
            "placement": dict(self.placement),
            "checkpoints": [dataclasses.asdict(stats) for stats in checkpoints],
        }
        if outcome is not None:
            summary.update(ended_at=time.time(), error=outcome.error, metrics=outcome.metrics,
                           deploy_s=outcome.deploy_s, run_s=outcome.run_s)
        return summary

    def _graph(self) -> list[dict[str, Any]]:
        """The plan as data (for the web UI): each chain with its operators, parallelism
        and inputs (the upstream chain and the partitioning)."""
        return [{"id": v.id, "name": v.name, "parallelism": v.parallelism,
                 "operators": [node.name for node in v.nodes],
                 "inputs": [{"from": e.source_vertex, "partitioning": str(e.partitioning)}
                            for e in v.inputs]}
                for v in self.plan.vertices]

    def _publish(self) -> None:
        """Export the job's checkpoint metrics; publish its summary if it changed.
        Never fails the job."""
        self.exporter.export(self.coordinator.stats() if self.coordinator else [], self.attempt)
        summary = self._summary()
        text = json.dumps({k: v for k, v in summary.items() if k != "ended_at"}, default=str)
        if text == self._published[1]:
            self._published = (time.monotonic(), text)
            return
        try:
            registry.publish(summary)
            self._published = (time.monotonic(), text)
        except Exception as exc:  # the directory is for people watching, not for the job
            log.warning("could not publish the summary of %s: %s", self.job_id, exc)

    def _termination_report(self, ref: Any) -> TerminationReport:
        key = self.terminations.pop(ref)
        try:
            return ray.get(ref)
        except RayActorError as exc:
            vertex = self.plan.vertices[key[0]]
            node = self.placement.get(f"{vertex.name}/{key[1]}")
            if node is not None:
                self.died_on.add(node)
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            return TerminationReport(
                key[0], key[1], "FAILED", operator=vertex.name,
                error=f"subtask {key[1] + 1}/{vertex.parallelism} of '{vertex.name}' died: "
                      f"{type(exc).__name__}: {first_line}")

    # -- failover ---------------------------------------------------------------------------------
    def _failover(self, failure: Exception) -> JobOutcome | None:
        if isinstance(failure, _Failure):
            report = failure.report
        elif isinstance(failure, (CoordinatorFailure, EventDeliveryError, GatewayProtocolError)):
            report = TerminationReport(-1, -1, "FAILED", error=str(failure),
                                       operator=getattr(failure, "operator", "coordinator"))
        else:
            report = TerminationReport(-1, -1, "FAILED", error=f"checkpoint coordinator: {failure}",
                                       operator="coordinator")
        self.failures.append(report.error or "unknown failure")
        self.failure_details.append({"attempt": self.attempt, "at": time.time(),
                                     "error": report.error or "unknown failure",
                                     "operator": report.operator,
                                     "subtask": report.index if report.index >= 0 else None,
                                     "traceback": report.traceback})
        self._answer_open_savepoints(f"the job failed over after: {report.error}")
        restart = len(self.failures)
        if self.options.checkpoints is None or restart > self.options.restart.attempts:
            for actor in self.actors.values():
                actor.cancel.remote()
            why = "" if self.options.checkpoints is not None else " (no checkpoints: no restart)"
            if self.options.checkpoints is not None and self.options.restart.attempts:
                why = f" (restart attempts exhausted: {self.options.restart.attempts})"
            return JobOutcome(JobStatus.FAILED, error=(report.error or "") + why,
                              operator=report.operator,
                              subtask=report.index if report.index >= 0 else None,
                              traceback=report.traceback)
        self._set_status(JobStatus.RESTARTING)
        self._publish()
        self.coordinator.abort_all(f"failover after: {report.error}")
        lost_nodes = self._lost_nodes()
        time.sleep(self.options.restart.delay_before(restart))
        self.attempt += 1
        self.coordinator.start_attempt(self.attempt, self._coordinator_failpoints())
        started = time.perf_counter()
        try:
            restore = self.coordinator.verified_restore_spec()
        except StorageUnavailableError as exc:  # it may come back: a failure like any other
            return self._failover(_Failure(TerminationReport(
                -1, -1, "FAILED", operator="restore", error=f"could not restore: {exc}")))
        except (CorruptCheckpointError, OSError, RuntimeError) as exc:  # nowhere to go back to
            return JobOutcome(JobStatus.FAILED, error=f"{report.error}; the job cannot restore: {exc}",
                              operator=report.operator, traceback=report.traceback)
        try:
            self._reset_operator_coordinators(restore)
            self._deploy(restore=restore, avoid_nodes=lost_nodes)
            self.restores.append({"attempt": self.attempt, "failure": report.error,
                                  "checkpoint_id": restore.checkpoint_id if restore else None,
                                  "restore_s": time.perf_counter() - started,
                                  "lost_nodes": lost_nodes})
        except RayActorError as exc:  # a subtask died while being wired: fail over again
            return self._failover(_deployment_failure(exc))
        self._set_status(JobStatus.RUNNING)
        return None

    def _deploy_first(self, restore: RestoreSpec | None) -> JobOutcome | None:
        """Deploy the first attempt. A subtask lost meanwhile is a failure like any
        other: the restart strategy applies (an outcome only if it ends the job)."""
        try:
            self._deploy(restore=restore)
        except RayActorError as exc:
            return self._failover(_deployment_failure(exc))
        return None

    def _lost_nodes(self) -> list[str]:
        """Nodes that seem to have died with subtasks of this job, to keep the restart off.

        Ray declares a node dead only once its health checks fail (15 s by default); until
        then it would place new subtasks there and the restart would fail again. A node is
        taken for lost when a subtask on it died, it is not this master's node, and none of
        the job's other subtasks there answers within ``NODE_PING_TIMEOUT_S``.
        """
        suspects, self.died_on = self.died_on - {ray.get_runtime_context().get_node_id()}, set()
        if not suspects:
            return []
        on_node = {node: [actor for (v, i), actor in self.actors.items()
                          if self.placement.get(f"{self.plan.vertices[v].name}/{i}") == node]
                   for node in suspects}
        pings = {node: [actor.ready.remote() for actor in actors] for node, actors in on_node.items()}
        refs = [ref for node_refs in pings.values() for ref in node_refs]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=NODE_PING_TIMEOUT_S)
        answered = set()
        for ref in done:
            try:
                ray.get(ref)
                answered.add(ref)
            except Exception:  # a dead subtask answers with an error
                pass
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        return sorted(node for node, node_refs in pings.items()
                      if node in alive and not answered.intersection(node_refs))

    # -- deployment -------------------------------------------------------------------------------
    def _coordinator_failpoints(self) -> Failpoints:
        # The coordinator's failpoints always raise: ending the master's process
        # would end the job, not fail it over.
        return Failpoints(tuple(dataclasses.replace(f, action="raise")
                                for f in self.options.failpoints
                                if f.point == "after_metadata_before_notify"),
                          "coordinator", None, self.attempt)

    def _create_coordinator(self) -> None:
        config = self.options.checkpoints
        if config is None:
            return
        self.coordinator = CheckpointCoordinator(
            config=config, job_key=self.job_id, job_name=self.job_name,
            subtasks=[(v.id, i) for v in self.plan.vertices for i in range(v.parallelism)],
            max_parallelism=self.plan.max_parallelism,
            vertex_heads={v.id: v.nodes[0].name for v in self.plan.vertices},
            topology=self.plan.describe(),
            send_trigger=lambda barrier: [a.trigger_checkpoint.remote(barrier)
                                          for a in self.actors.values()],
            notify_complete=lambda n: [a.notify_checkpoint_complete.remote(n, self.attempt)
                                       for a in self.actors.values()],
            notify_aborted=lambda n: [a.notify_checkpoint_aborted.remote(n, self.attempt)
                                      for a in self.actors.values()],
            failpoints=self._coordinator_failpoints(),
            operator_coordinators=self.operator_coordinators)

    def _deploy(self, restore: RestoreSpec | None, avoid_nodes: list[str] = ()) -> None:
        """Deploy the current attempt, none of it on ``avoid_nodes`` (ids of lost nodes).

        Actors of the previous attempt that are still alive host their new subtask
        (no new process to start); a dead one is replaced by the warm spare where
        its resources allow, else by a new actor."""
        plan, options = self.plan, self.options
        previous, self.actors, self.terminations, self.finished = self.actors, {}, {}, {}
        self.died_on = set()
        avoid = {"label_selector": {"ray.io/node-id": f"!in({','.join(avoid_nodes)})"}
                 } if avoid_nodes else {}
        me = ray.get_runtime_context().current_actor
        checkpointing = None
        if options.checkpoints is not None:
            unaligned = options.checkpoints.alignment != "aligned"
            checkpointing = CheckpointingSpec(options.checkpoints.storage, self.job_id, me,
                                              UNALIGNED_SLICE_BYTES if unaligned else None,
                                              state_backend=options.checkpoints.state_backend)
        specs = {(vertex.id, index): SubtaskSpec(
                     self.job_id, self.job_name, self.attempt, vertex, index, plan.max_parallelism,
                     options.credits, master=me, checkpointing=checkpointing, restore=restore,
                     failpoints=options.failpoints)
                 for vertex in plan.vertices for index in range(vertex.parallelism)}
        lost = set(avoid_nodes)
        on_lost = {key for key in previous
                   if self.placement.get(f"{plan.vertices[key[0]].name}/{key[1]}") in lost}
        for key in on_lost:  # calls to them could hang until Ray declares the node dead
            ray.kill(previous[key])
        hosted = {key: previous[key].host.remote(spec)
                  for key, spec in specs.items() if key in previous and key not in on_lost}
        for key, ref in hosted.items():
            try:
                ray.get(ref, timeout=HOST_TIMEOUT_S)
                self.actors[key] = previous[key]
            except (RayActorError, RuntimeError, GetTimeoutError, ray.exceptions.RayTaskError):
                ray.kill(previous[key])  # dead, or its subtask would not stop
        self._host_on_pooled(specs)
        for key, spec in specs.items():
            if key in self.actors:
                continue
            vertex = plan.vertices[key[0]]
            if self.spare is not None and lost:  # it may be on a lost node: do not wait on it
                ray.kill(self.spare)
                self.spare = None
            if self.spare is not None and vertex.resources == Resources():
                spare, self.spare = self.spare, None
                try:
                    ray.get(spare.host.remote(spec), timeout=HOST_TIMEOUT_S)
                    self.actors[key] = spare
                    continue
                except (RayActorError, GetTimeoutError):
                    ray.kill(spare)
            self.actors[key] = SubtaskActor.options(
                name=spec.actor_name, namespace=NAMESPACE,
                scheduling_strategy=SUBTASK_SCHEDULING, **avoid,
                **vertex.resources.ray_options()).remote(spec)
        try:
            nodes = ray.get([a.ready.remote() for a in self.actors.values()],
                            timeout=options.actor_start_timeout_s)
        except GetTimeoutError:
            raise RuntimeError(
                f"{len(self.actors)} subtask actors did not start within "
                f"{options.actor_start_timeout_s:.0f} s; the cluster has "
                f"{ray.available_resources()} available") from None
        self.placement = {f"{plan.vertices[v].name}/{i}": node
                          for (v, i), node in zip(self.actors, nodes)}
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
        for actor in self.actors.values():
            actor.start.remote()  # a subtask that dies from here on is seen by its termination
        if self.operator_coordinators:
            self.operator_coordinators.bind(self._event_transport())
        if self.spare is None and self.pooled and not lost:
            self.spare = self.pooled.pop()  # a leased actor left over: the warm spare
        if self.spare is None and options.checkpoints is not None and options.restart.attempts:
            # A warm, empty actor (process started, modules imported) to replace a
            # subtask that dies; created in the background, never waited for here.
            self.spare = SubtaskActor.options(
                name=f"raystream/{self.job_id}/spare@{self.attempt}", namespace=NAMESPACE,
                scheduling_strategy=SUBTASK_SCHEDULING, **avoid,
                **Resources().ray_options()).remote(None)

    def _event_transport(self):
        """Operator events of this attempt go to a subtask's control lane; delivered once
        the call returned (the event is in the subtask's mailbox)."""
        vertex_of = {node.name: vertex.id for vertex in self.plan.vertices for node in vertex.nodes}
        actors, attempt = dict(self.actors), self.attempt

        def transport(operator: str, index: int):
            actor = actors[(vertex_of[operator], index)]
            return lambda event: _RayDelivery(
                actor.handle_operator_event.remote(attempt, operator, event))
        return transport

    def _reset_operator_coordinators(self, restore: RestoreSpec | None) -> None:
        """Global failover (or a start from a savepoint): every operator coordinator goes
        back to the restored checkpoint's state, or to its start without one."""
        if not self.operator_coordinators:
            return
        states = {}
        if restore is not None:
            storage = CheckpointStorage(restore.storage_uri)
            states = {name: storage.read_state(StateHandle.from_json(handle))
                      for name, handle in restore.coordinators.items()}
        self.operator_coordinators.reset(restore.checkpoint_id if restore else None, states)

    def _host_on_pooled(self, specs: dict[tuple[int, int], SubtaskSpec]) -> None:
        """Host the subtasks with default resources on the driver's leased actors (first
        attempt only). An actor that died while idle is dropped (not a failure of this
        job); one that dies while hosting is a deployment failure like any other."""
        leased, self.pooled = self.pooled, []
        if not leased:
            return
        pings = {actor.ready.remote(): actor for actor in leased}
        ready, late = ray.wait(list(pings), num_returns=len(pings),
                               timeout=self.options.actor_start_timeout_s)
        live = []
        for ref in ready:
            try:
                ray.get(ref)
                live.append(pings[ref])
            except RayActorError:
                pass  # died while idle: its subtask goes to a new actor
        for ref in late:
            ray.kill(pings[ref])
        hosting = {}
        for key, spec in specs.items():
            if live and key not in self.actors and (
                    self.plan.vertices[key[0]].resources == Resources()):
                actor = live.pop()
                hosting[key] = (actor, actor.host.remote(spec))
        self.pooled = live  # left over: the spare, or back to the pool at the end
        died: RayActorError | None = None
        for key, (actor, ref) in hosting.items():
            try:
                ray.get(ref, timeout=self.options.actor_start_timeout_s)
                self.actors[key] = actor
            except (GetTimeoutError, ray.exceptions.RayTaskError):  # a subtask that would not
                ray.kill(actor)                                       # stop: a new actor instead
            except RayActorError as exc:  # it died deploying: a failure of this job
                died = died or exc
        if died is not None:
            raise died  # the failover hosts the next attempt on the live ones

    def _release_actors(self) -> None:
        """The job is over: the driver's pooled actors whose subtask has ended go back to
        its pool; every other actor of the job is killed."""
        actors = [*self.actors.values(), *self.pooled,
                  *([self.spare] if self.spare is not None else [])]
        # a subtask whose termination was reported has ended (one that died was replaced,
        # or failed the job: a dead actor given back is dropped at the next lease)
        ended = set(self.actors) - set(self.terminations.values())
        if self.terminations:  # a failed or canceled job: its subtasks may still be ending
            done, _ = ray.wait(list(self.terminations), num_returns=len(self.terminations),
                               timeout=RELEASE_WAIT_S)
            for ref in done:
                try:
                    ray.get(ref)
                    ended.add(self.terminations[ref])
                except Exception:  # its process died (or its node): not for the pool
                    pass
        idle_ids = {self.actors[key]._actor_id for key in ended if key in self.actors}
        idle_ids |= {a._actor_id for a in [*self.pooled, self.spare] if a is not None}
        back = {a._actor_id: a for a in actors
                if a._actor_id in self._pooled_ids and a._actor_id in idle_ids}
        if self.options.keeper is not None and self._pooled_ids:
            self.options.keeper.give_back.remote(
                list(back.values()), [i.hex() for i in self._pooled_ids if i not in back])
        for actor in actors:
            if actor._actor_id not in back:
                try:
                    ray.kill(actor)
                except Exception:
                    pass
