"""The job master actor: deploys a job's subtasks, runs its checkpoints, fails it over.

One event thread owns all job state (Trio-style: every transition in one
place). Subtasks and clients only put events (:mod:`raystream.engine.job_events`)
on its queue:

* a subtask *finished* (all its input ended and its output is sent);
* a checkpoint acknowledged or declined (handed to the checkpoint coordinator);
* a subtask's ``await_termination`` call returned FAILED, or raised because
  its process died (``RayActorError``) — the job fails over.

A failover redeploys the job as a new *attempt* from the latest completed
checkpoint, after the restart strategy's delay, until its attempts run out:
the failed subtask's pipelined region alone (:mod:`~raystream.engine.regions`)
when the job has independent regions and nothing is in doubt
(:mod:`~raystream.engine.region_failover`), otherwise every subtask. Messages of older
attempts are dropped everywhere. A job without checkpoints fails on the first
failure.

End of input (FLIP-147): once every subtask has finished, the master triggers
a final checkpoint; the job is FINISHED when it completes, so the tail of the
output is committed. Then the subtasks are stopped.

This module is the actor and its event loop; the parts live beside it:
:mod:`~raystream.engine.deployment` (the subtask actors: every Ray call to them),
:mod:`~raystream.engine.failover` (restart or fail, without Ray),
:mod:`~raystream.engine.savepoint_requests` (savepoints clients wait for) and
:mod:`~raystream.engine.job_report` (outcome, results, the job directory's summary).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from raystream.actors.subtask_spec import SubtaskEnding
from raystream.checkpoint.barrier import SnapshotKind
from raystream.checkpoint.restore import RestoreSpec
from raystream.checkpoint.coordinator import (CheckpointCoordinator, CheckpointStatus,
                                              CommittedSavepoint, TooManyCheckpointFailures)
from raystream.checkpoint.config import AlignmentMode
from raystream.checkpoint.coordinator_holder import CoordinatorFailure, OperatorCoordinators
from raystream.checkpoint.handles import OperatorSubtaskState
from raystream.checkpoint.metadata import RowCounts
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.checkpoint.storage import (CheckpointStorage, CorruptCheckpointError,
                                          StorageUnavailableError)
from raystream.checkpoint.subtask_gateway import EventDeliveryError, GatewayProtocolError
from raystream.engine import master_journal, registry
from raystream.engine.actor_pool import assignment_of, remember_assignment
from raystream.engine.deployment import (NAMESPACE, SUBTASK_SCHEDULING, Deployment,
                                         RegionRefused, SubtaskFailure, deployment_failure,
                                         failure_of)
from raystream.engine.diagnosis import JobDiagnosis, PendingCheckpointView
from raystream.engine.errors import JobNotFoundError
from raystream.engine.failover import Failover, Failure, FailJob, Restart
from raystream.core.failpoints import Failpoints, InjectedFailure
from raystream.engine.job_events import (CancelRequested, CheckpointAcknowledged,
                                         CheckpointDeclined, GatewayAcknowledged, JobEvent,
                                         OperatorEventReceived, Reply, SavepointMode,
                                         SavepointRequest, SavepointRequested, SubtaskFinished,
                                         SubtaskKey, SubtaskReachedStage)
from raystream.engine.job_progress import JobProgress, ProgressTracker, phase_of
from raystream.engine.job_options import (DETACHED_LINGER_S, RESUME_HINT, JobOptions,
                                          MasterAssignment)
from raystream.engine.job_report import JobOutcome, job_summary, outcome_of_summary, sink_results
from raystream.engine.job_status import JobStatus, check_transition
from raystream.engine.master_journal import JournalEntry
from raystream.engine.metrics import JobMetricsExporter
from raystream.checkpoint.local_recovery import StateOrigin
from raystream.engine.recovery import Recovery, RecoveryLog, RecoveryStage, RestoredFrom
from raystream.engine.region_failover import Circumstances, RegionFailover
from raystream.engine.regions import Region, Regions
from raystream.engine.savepoint_failure import SavepointFailure, SavepointFailureCause
from raystream.engine.savepoint_requests import SavepointRequests

# what other modules import from here (the deployment's names for the actor pool)
__all__ = ["NAMESPACE", "SUBTASK_SCHEDULING", "JobMaster", "JobOptions", "JobOutcome",
           "MasterAssignment"]

log = logging.getLogger(__name__)

POLL_S = 0.05
MASTER_DIED = "the job master's process died"
PUBLISH_EVERY_S = 1.0  # how often a changed job summary goes to the cluster's job directory
SAMPLE_EVERY_S = 1.0  # how often a running job's subtask metrics go to its progress
# what fails the job over when the event thread meets it
_FAILURES = (SubtaskFailure, InjectedFailure, TooManyCheckpointFailures, CoordinatorFailure,
             EventDeliveryError, GatewayProtocolError)


def _own_name() -> str:
    name = ray.get_runtime_context().get_actor_name()
    assert name is not None, "a warm job master is a named actor"
    return name


@ray.remote(  # pyright: ignore[reportCallIssue] (Ray's stubs know no concurrency_groups)
    concurrency_groups={"client": 8, "control": 1}, max_restarts=0, max_task_retries=0)
class JobMaster:
    """The job master: of ``assignment``'s job (its Ray options per job:
    :func:`~raystream.engine.job_options.master_restarts`), or, without one, a warm master whose job comes with
    :meth:`run` (:mod:`raystream.engine.master_pool`). ``keeper``: the actor name of
    the driver's pool keeper, which tells a warm master Ray restarted what job its
    predecessor was given."""

    def __init__(self, assignment: MasterAssignment | None = None,
                 keeper: str | None = None) -> None:
        self.keeper = keeper
        # what a client may ask before the master has its job
        self.status = JobStatus.CREATED
        self.outcome: JobOutcome | None = None
        self.done = threading.Event()
        self._begun = threading.Lock()
        self.assignment: MasterAssignment | None = None
        # Ray restarted this actor after its process died: take its job over
        reconstructed = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        if assignment is None and reconstructed and keeper is not None:
            assignment = assignment_of(keeper, _own_name())
        if assignment is not None:
            self._begin(assignment, successor=reconstructed)

    @ray.method(concurrency_group="client")
    def run(self, held: list[Any]) -> None:
        """Run the job of the ``MasterAssignment`` in ``held`` (a warm master). In a list,
        Ray hands over the object's ref, which goes to the keeper before anything of the
        job starts: a successor finds it there. A no-op if a successor runs the job
        already (Ray retried the call on it)."""
        assignment: MasterAssignment = ray.get(held[0])
        if self.assignment is not None:
            if self.assignment.job_id != assignment.job_id:
                raise RuntimeError(f"this job master runs {self.assignment.job_id}, "
                                   f"not {assignment.job_id}")
            return
        assert self.keeper is not None, "a warm job master is created with its keeper"
        # A predecessor that died before this line had not started the job: this is its
        # first master. One that died after left it with the keeper, and its successor
        # (this master's constructor) took it over.
        remember_assignment(self.keeper, _own_name(), assignment.job_id, held)
        self._begin(assignment, successor=False)

    def _begin(self, assignment: MasterAssignment, successor: bool) -> None:
        with self._begun:
            if self.assignment is not None:
                return
            self.assignment = assignment
        job_id, job_name, plan, options = (assignment.job_id, assignment.job_name,
                                           assignment.plan, assignment.options)
        self.job_id, self.job_name, self.plan, self.options = job_id, job_name, plan, options
        self.successor = successor
        self.attempt = 0
        self.events: queue.Queue[JobEvent] = queue.Queue()
        self.deployment = Deployment(job_id, job_name, plan, options)
        self.finished: dict[SubtaskKey, dict] = {}  # this attempt's finished subtasks' results
        self.failover = Failover(options.restart)
        self.regions = Regions.of_plan(plan)
        self.region_failover = RegionFailover(self.regions, options.failover)
        # operator name -> its vertex (events from subtasks name their operator)
        self._vertex_of = {node.name: v.id for v in plan.vertices for node in v.nodes}
        self.recoveries = RecoveryLog(subtasks=plan.num_subtasks())  # one per failover
        self.coordinator: CheckpointCoordinator | None = None
        # the operator coordinators (split enumerators, ...) with their subtask gateways
        self.operator_coordinators = OperatorCoordinators([])  # created by the event thread
        self.savepoints = SavepointRequests()
        self.started_at = time.time()
        self.exporter = JobMetricsExporter(job_name, job_id)
        self.publisher = registry.SummaryPublisher(every_s=PUBLISH_EVERY_S)
        # the stop savepoint that ended the job: answered once the outcome is published
        self._stopped_by: SavepointRequest | None = None
        # the newest stop savepoint this master (or a predecessor) committed
        self._committed_savepoint: CommittedSavepoint | None = None
        self._noted_restores: list[dict] = []  # the recoveries as last noted in the journal
        self.progress_tracker = ProgressTracker(options.input_extent)
        if successor:
            self.outcome = self._ended_before()
            if self.outcome is not None:  # before any call is taken: a retried one hears it
                self.done.set()
        self._thread = threading.Thread(target=self._run, name="job master", daemon=True)
        self._thread.start()
        # a thread of its own: a subtask slow to answer must not hold the event thread
        threading.Thread(target=self._sample_progress, name="job progress",
                         daemon=True).start()

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
                  timeout_s: float | None = None) -> str | SavepointFailure:
        """Take a savepoint to ``path``; with ``stop`` the job ends after it (FINISHED).
        Its path, or why it failed (returned, not raised: the client gets it typed)."""
        if self.done.is_set():  # the event loop has ended: nothing would answer
            if stop and self._stopped_with(path):  # a predecessor's stop, retried by Ray
                return path
            return SavepointFailure(SavepointFailureCause.JOB_ENDED, path,
                                    f"job {self.job_id} is {self.status}",
                                    job_still_running=False)
        mode = (SavepointMode.DRAIN if drain else SavepointMode.STOP if stop
                else SavepointMode.KEEP_RUNNING)
        request = SavepointRequest(path, mode, Reply())
        self.events.put(SavepointRequested(request))
        answer = request.reply.wait(timeout_s)
        if answer is None:
            return SavepointFailure(SavepointFailureCause.NO_ANSWER, path,
                                    f"no answer within {timeout_s} s")
        return answer

    @ray.method(concurrency_group="client")
    def subtask_actors(self) -> dict[str, list[Any]]:
        """The actors hosting the current attempt's subtasks, by chain."""
        return self.deployment.subtask_actors()

    @ray.method(concurrency_group="client")
    def get_placement(self) -> dict[str, str]:
        """The node (id) of the job master and of every subtask of the current attempt,
        by "chain/index"."""
        return {"job master": ray.get_runtime_context().get_node_id(), **self.deployment.placement}

    @ray.method(concurrency_group="client")
    def metrics(self) -> dict[str, dict[str, float]]:
        """Live metrics of every subtask of the current attempt, by "chain/index"
        (none while the job deploys or restarts)."""
        return self.deployment.metrics() if self.status is JobStatus.RUNNING else {}

    @ray.method(concurrency_group="client")
    def progress(self) -> dict[str, Any]:
        if self.assignment is None:  # a warm master, waiting for its job
            return {"status": self.status, "master_pid": os.getpid()}
        coordinator = self.coordinator
        figures = self._progress()
        return {"status": self.status, "attempt": self.attempt,
                "failures": list(self.failover.failures),
                "restores": self.recoveries.rows(), "master_pid": os.getpid(),
                "completed_checkpoints": coordinator.completed_ids() if coordinator else [],
                "checkpoints": coordinator.stats() if coordinator else [],
                **figures.as_dict()}

    def _progress(self) -> JobProgress:
        return self.progress_tracker.progress(phase=self._phase(), now_ms=time.time() * 1000)

    def _phase(self) -> str:
        """What the job does now, in words (asked on client threads)."""
        coordinator = self.coordinator
        final = coordinator.final_checkpoint if coordinator is not None else None
        return phase_of(self.status.value, ended=len(self.finished),
                        subtasks=len(self.deployment.actors), checkpoints=coordinator is not None,
                        final=final, final_complete=coordinator is not None
                        and final in coordinator.completed_ids(),
                        failures=len(self.failover.failures))

    def _sample_progress(self) -> None:
        while not self.done.wait(SAMPLE_EVERY_S):
            if self.status is JobStatus.RUNNING:
                self.progress_tracker.sample(time.monotonic(), self.deployment.metrics())

    @ray.method(concurrency_group="client")
    def diagnosis(self) -> JobDiagnosis:
        """Why the job has not finished yet (see :mod:`raystream.engine.diagnosis`)."""
        finished = set(self.finished)
        unfinished = [key for key in self.deployment.actors if key not in finished]
        answers = self.deployment.liveness(sorted(unfinished))
        coordinator, now = self.coordinator, time.monotonic()
        # copies first: the event thread changes these while a client asks
        pending = () if coordinator is None else tuple(
            PendingCheckpointView(n, now - p.started, tuple(sorted(
                self.deployment.subtask_name(key) for key in tuple(p.waiting))))
            for n, p in sorted(list(coordinator.pending.items())))
        completed = coordinator.completed_ids() if coordinator else []
        return JobDiagnosis(self.job_name, str(self.status), self.attempt,
                            tuple(answers[key] for key in sorted(answers)), pending,
                            coordinator.final_checkpoint if coordinator else None,
                            completed[-1] if completed else None)

    # -- subtask calls (control lane) ---------------------------------------------------------
    @ray.method(concurrency_group="control")
    def report_finished(self, attempt: int, vertex: int, index: int, results: dict) -> None:
        self.events.put(SubtaskFinished(attempt, (vertex, index), results))

    @ray.method(concurrency_group="control")
    def report_stage(self, attempt: int, vertex: int, index: int, stage: str, at: float,
                     origin: StateOrigin | None = None) -> None:
        """A subtask reached ``stage`` (a :class:`RecoveryStage` value) of its attempt."""
        self.events.put(SubtaskReachedStage(attempt, (vertex, index), RecoveryStage(stage), at,
                                            origin))

    @ray.method(concurrency_group="control")
    def acknowledge_checkpoint(self, attempt: int, checkpoint_id: int, vertex: int, index: int,
                               written: dict[str, OperatorSubtaskState],
                               stats: SnapshotStats) -> None:
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
    def _stopped_with(self, path: str) -> bool:
        """The job ended FINISHED by a stop savepoint to ``path``."""
        outcome = self.outcome
        return outcome is not None and outcome.status is JobStatus.FINISHED and any(
            c.savepoint == path and c.status is CheckpointStatus.COMPLETED
            for c in outcome.checkpoints)

    def _run(self) -> None:
        ran = self.outcome is None  # (else a predecessor had published it)
        if ran:
            self.outcome = self._run_job()
        master_journal.forget(self.job_id)
        self.done.set()
        if ran:
            self._master_failpoints().hit("master_published")
        # (the keeper forgets this master's job once its driver has the outcome, not here:
        # a successor of a master that dies before must still learn the job, to answer
        # the driver's retried call with the outcome this master published)
        if self.options.detached:  # no driver may be left to end it
            time.sleep(DETACHED_LINGER_S)
            ray.kill(ray.get_runtime_context().current_actor)

    def _run_job(self) -> JobOutcome:
        started = time.perf_counter()
        deploy_s = 0.0
        try:
            outcome = self._start()
            deploy_s = time.perf_counter() - started
            if outcome is None:
                if self.status is not JobStatus.RUNNING:  # else a failover while deploying ran it
                    self._set_status(JobStatus.RUNNING)
                self._publish()
                outcome = self._event_loop()
        except Exception as exc:  # could not deploy: report it, never hang the client
            outcome = JobOutcome(JobStatus.FAILED, error=f"job '{self.job_name}' could not run: "
                                                 f"{type(exc).__name__}: {exc}")
        finally:
            self.savepoints.answer_open(self.coordinator, SavepointFailureCause.JOB_ENDED,
                                        "the job ended before it", job_still_running=False)
            self.operator_coordinators.close()
            self.deployment.release()
        if outcome.status is JobStatus.CANCELED:  # its subtasks have ended: no more commits
            outcome.results = sink_results(self.plan, {}, self.options.checkpoints, self.job_id)
        outcome.deploy_s = deploy_s
        outcome.run_s = time.perf_counter() - started - deploy_s
        outcome.restarts = self.attempt
        outcome.failures = list(self.failover.failures)
        outcome.restores = self.recoveries.rows()
        outcome.checkpoints = self.coordinator.stats() if self.coordinator else []
        self.progress_tracker.sample(time.monotonic(), outcome.metrics)  # the final figures
        self._master_failpoints().hit("master_ended")
        self.outcome = outcome
        self._set_status(outcome.status)
        self._publish()
        if self._stopped_by is not None:
            # Answered only now: had the master died before publishing, its successor
            # would run the job on, and Ray retries this call on it (a new stop).
            self._stopped_by.reply.set(self._stopped_by.path)
        return outcome

    def _start(self) -> JobOutcome | None:
        """Deploy the first attempt — of the job, or of this master after its predecessor
        died; an outcome if the job ended instead (its restart attempts were used up)."""
        self._set_status(JobStatus.RESTARTING if self.successor else JobStatus.DEPLOYING)
        self._publish()
        self.operator_coordinators = OperatorCoordinators(self.plan.coordinated_operators())
        coordinator = self.coordinator = self._create_coordinator()
        self.deployment.lease_pooled()
        restore = None
        if self.successor:
            restarted = time.time()
            decision = self._take_over()
            if isinstance(decision, FailJob):
                return self._failed(decision)
            assert coordinator is not None  # a master without checkpoints is not restarted
            restore = coordinator.take_over(self._committed_savepoint)
            detected = Recovery.detected(attempt=self.attempt, failure=MASTER_DIED, at=restarted)
            self.recoveries.begin(detected.restoring(
                restore.checkpoint_id if restore else None, ()))
        if restore is None and self.options.restore_from is not None:
            if coordinator is None:
                raise ValueError("restore_from needs checkpoints: "
                                 "StreamEnvironment(checkpoints=...)")
            restore = coordinator.restore_from(self.options.restore_from)
            self.failover.started_from(restore.checkpoint_id)
        self.operator_coordinators.start()
        if restore is not None:
            self.operator_coordinators.reset_to(restore)
        return self._deploy_first(restore)

    def _ended_before(self) -> JobOutcome | None:
        """A successor of a master whose job had already ended: that job's outcome."""
        try:
            summary = registry.find_job(self.job_id)
        except JobNotFoundError:  # nothing published yet: the job had not started
            return None
        if summary["status"] not in registry.TERMINAL_STATUSES:
            return None
        self.status = JobStatus(summary["status"])  # adopted as published, not a transition
        outcome = outcome_of_summary(summary)
        # what the predecessor's collect sinks committed (the rest of its results died with it)
        outcome.results = sink_results(self.plan, {}, self.options.checkpoints, self.job_id)
        return outcome

    def _take_over(self) -> Restart | FailJob:
        """The predecessor died: its subtasks go (those on the driver's pooled actors are
        killed here; the rest were its own actors, which Ray ended with it), and its death
        is a failure the restart strategy decides on, like any other."""
        self.deployment.drop_pooled()
        if not self.options.may_restart:  # (a warm master is restarted for every job)
            return FailJob(f"its job master died ({MASTER_DIED}); "
                           f"{RESUME_HINT.format(name=self.job_name)}")
        noted = master_journal.read(self.job_id)
        if noted is not None:
            self.started_at = noted.started_at
            self.failover.carry_on(noted.failures)
            self.recoveries = RecoveryLog(self.plan.num_subtasks(),
                                          (Recovery.from_dict(row) for row in noted.restores))
            self._committed_savepoint = noted.savepoint
        assert self.options.checkpoints is not None
        storage = CheckpointStorage(self.options.checkpoints.storage)
        completed = storage.completed_checkpoint_ids(self.job_id)
        if self._committed_savepoint is not None:
            completed = sorted({*completed, self._committed_savepoint.checkpoint_id})
        decision = self.failover.on_failure(Failure(MASTER_DIED, "job master"), completed,
                                            at=time.time())
        if isinstance(decision, Restart):
            log.warning("job %s: its master's process died; restarting it as attempt %d",
                        self.job_id, decision.attempt)
            # above every attempt the predecessor may have deployed
            self.attempt = max(decision.attempt, noted.attempt + 1 if noted else 0)
            time.sleep(decision.delay_s)
        return decision

    def _note(self) -> None:
        """Note the attempt about to be deployed (or just restored) for a successor
        (:mod:`~raystream.engine.master_journal`), if this master may have one."""
        if self.options.may_restart:
            self._noted_restores = self.recoveries.rows()
            master_journal.note(self.job_id, JournalEntry(
                self.attempt, self.started_at, tuple(self.failover.failure_details),
                tuple(self._noted_restores), self._committed_savepoint))

    def _set_status(self, status: JobStatus) -> None:
        """Every status change goes through here (checked against the transition table)."""
        self.status = check_transition(self.status, status)

    def _event_loop(self) -> JobOutcome:
        while True:
            try:
                outcome = self._step()
                if outcome is not None:
                    return outcome
            except _FAILURES as failure:
                outcome = self._failover(failure_of(failure))
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
        report = self.deployment.poll_termination()
        if report is not None and report.status is not SubtaskEnding.FINISHED:
            raise SubtaskFailure(report)
        self.operator_coordinators.run_due(time.monotonic())
        if self.coordinator is not None:
            self.coordinator.tick(time.monotonic())
            stop = self.savepoints.answer(self.coordinator)
            if stop is not None:
                return self._end_after_savepoint(stop)
        if self.publisher.due():
            self._publish()
        return self._maybe_finish()

    def _end_after_savepoint(self, request: SavepointRequest) -> JobOutcome:
        """End the job after its completed stop savepoint. The caller hears of success once
        every subtask has stopped and the outcome is published; if a subtask fails instead,
        the job fails over to the savepoint (its output is committed: never rolled back)
        and the caller is told so."""
        self._master_failpoints().hit("master_stopping")
        try:
            outcome = self._end(JobStatus.FINISHED)
        except SubtaskFailure:
            # the failover answers it (complete, not stopped), knowing whether the job goes on
            self.savepoints.did_not_stop(request)
            raise
        self._stopped_by = request
        return outcome

    def _handle(self, event: JobEvent) -> JobOutcome | None:
        coordinator = self.coordinator
        match event:
            case CancelRequested():
                self.deployment.cancel()
                return JobOutcome(JobStatus.CANCELED)
            case SubtaskFinished(attempt, subtask, results) if self._runs(subtask, attempt):
                self.finished[subtask] = results
            case SavepointRequested(request):
                if self.savepoints.request(request, coordinator):
                    self.deployment.drain_sources()  # the final checkpoint goes to its path
            case OperatorEventReceived(attempt, operator, index, payload) if (
                    self._runs((self._vertex_of[operator], index), attempt)):
                self.operator_coordinators.handle_event_from_subtask(operator, index, payload)
            case GatewayAcknowledged(attempt, operators, index, n) if operators and self._runs(
                    (self._vertex_of[operators[0]], index), attempt):
                self.operator_coordinators.acknowledge(list(operators), index, n)
            case SubtaskReachedStage(attempt, subtask, stage, at, origin) if self._runs(
                    subtask, attempt):
                came = origin and RestoredFrom(self.deployment.subtask_name(subtask), origin)
                self.recoveries.timed(attempt, lambda clock: clock.reached(stage, subtask, at=at,
                                                                           restored_from=came))
            case CheckpointAcknowledged(attempt, n, subtask, written, stats) if (
                    coordinator is not None):
                coordinator.acknowledge(attempt, n, subtask, written, stats)
            case CheckpointDeclined(attempt, n, subtask, reason) if coordinator is not None:
                coordinator.decline(attempt, n, subtask, reason)
        return None  # anything else: an older attempt's, or no coordinator to hand it to

    def _runs(self, subtask: tuple[int, int], attempt: int) -> bool:
        """Does ``subtask`` run ``attempt`` now (after a region failover, not every
        subtask runs the newest)?"""
        return self.deployment.attempts.get(subtask) == attempt

    def _maybe_finish(self) -> JobOutcome | None:
        if len(self.finished) < len(self.deployment.actors):
            return None
        coordinator = self.coordinator
        if coordinator is not None:
            final = coordinator.final_checkpoint
            if final is None:
                coordinator.end_of_input()
                if not coordinator.final_due(time.monotonic()):
                    return None
                target = self.savepoints.drain_target()
                kind = (SnapshotKind.FINAL_CHECKPOINT if target is None
                        else SnapshotKind.DRAIN_SAVEPOINT)
                n = coordinator.trigger(kind, savepoint_target=target)
                self.savepoints.final_triggered(n)
                return None
            if final not in coordinator.completed_ids():
                return None
            request = self.savepoints.take_draining()
            if request is not None:
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
        metrics = self.deployment.metrics()
        failed = self.deployment.stop(self.options.stop_timeout_s)
        if failed is not None:
            raise SubtaskFailure(failed)
        return JobOutcome(status, sink_results(self.plan, self.finished,
                                               self.options.checkpoints, self.job_id),
                          metrics=metrics)

    # -- the cluster's job directory ----------------------------------------------------------
    def _publish(self) -> None:
        """Export the job's checkpoint metrics; publish its summary if it changed.
        Never fails the job."""
        checkpoints = self.coordinator.stats() if self.coordinator else []
        self.exporter.export(checkpoints, self.attempt)
        summary = job_summary(
            job_id=self.job_id, job_name=self.job_name, status=self.status,
            attempt=self.attempt, submission_id=self.options.submission_id,
            started_at=self.started_at, plan=self.plan, failover=self.failover,
            restores=self.recoveries.rows(), placement=self.deployment.placement,
            checkpoints=checkpoints, outcome=self.outcome,
            progress=None if self.outcome is None else self._progress().as_dict())
        self.publisher.publish(summary)

    # -- failover ---------------------------------------------------------------------------------
    def _failover(self, failure: Failure) -> JobOutcome | None:
        """Restart the job (or the failed subtask's region) from its latest checkpoint, or
        end it FAILED (the outcome)."""
        coordinator, detected = self.coordinator, time.time()
        decision = self.failover.on_failure(
            failure, coordinator.completed_ids() if coordinator else None, at=detected,
            region=self._region_of(failure))
        restarts = not isinstance(decision, FailJob)
        self.savepoints.answer_open(
            coordinator, SavepointFailureCause.FAILOVER if restarts
            else SavepointFailureCause.JOB_ENDED,
            f"the job {'failed over' if restarts else 'failed'} after: {failure.error}",
            job_still_running=restarts)
        if isinstance(decision, FailJob):
            self.deployment.cancel()
            return self._failed(decision)
        assert coordinator is not None  # only a job with checkpoints restarts
        if decision.region is None:  # a region failover: the rest of the job runs on
            self._set_status(JobStatus.RESTARTING)
            self._publish()
        coordinator.abort_all(f"failover after: {failure.error}")
        lost_nodes = self.deployment.lost_nodes()
        time.sleep(decision.delay_s)
        self.attempt = decision.attempt
        recovery = Recovery.detected(attempt=self.attempt, failure=failure.message, at=detected)
        try:
            restore = coordinator.verified_restore_spec()
        except StorageUnavailableError as exc:  # it may come back: a failure like any other
            return self._failover(Failure(f"could not restore: {exc}", operator="restore"))
        except (CorruptCheckpointError, OSError, RuntimeError) as exc:  # nowhere to go back to
            return self._failed(Failover.cannot_restore(failure, str(exc)))
        if (decision.region is not None and restore is not None and not lost_nodes
                and restore.checkpoint_id == decision.checkpoint_id):
            return self._restart_region(decision.region, restore, recovery)
        if decision.region is not None:  # the newest checkpoint is not what it restores
            self._set_status(JobStatus.RESTARTING)
        try:
            self.operator_coordinators.reset_to(restore)
            self.recoveries.begin(recovery.restoring(restore.checkpoint_id if restore else None,
                                                tuple(lost_nodes)))
            self._deploy(restore=restore, avoid_nodes=lost_nodes)
            self._note()
        except RayActorError as exc:  # a subtask died while being wired: fail over again
            return self._failover(failure_of(deployment_failure(exc)))
        self._set_status(JobStatus.RUNNING)
        return None

    def _region_of(self, failure: Failure) -> Region | None:
        """The subtasks that may restart alone after ``failure``, or None: the whole job
        restarts whenever anything is in doubt (:mod:`~raystream.engine.region_failover`)."""
        config, coordinator = self.options.checkpoints, self.coordinator
        if config is None or coordinator is None:
            return None
        latest = coordinator.latest()
        failed = (None if failure.vertex is None or failure.subtask is None
                  else (failure.vertex, failure.subtask))
        verdict = self.region_failover.verdict(failed, Circumstances(
            aligned=config.alignment is AlignmentMode.ALIGNED and config.aligned_timeout is None,
            draining=self.savepoints.drain_target() is not None,
            latest_is_savepoint=None if latest is None else latest.is_savepoint,
            coordinators_reset=self.operator_coordinators.support_subtask_reset(),
            finished=frozenset(self.finished)))
        if verdict.region is None and len(self.regions.regions) > 1:
            log.info("job %s: a global failover: %s", self.job_id, verdict.reason)
        return verdict.region

    def _restart_region(self, region: Region, restore: RestoreSpec,
                        recovery: Recovery) -> JobOutcome | None:
        """Redeploy ``region`` alone from ``restore`` as the current attempt (a region
        failover); if that fails, the whole job restarts."""
        assert self.coordinator is not None
        names = tuple(sorted(self.deployment.subtask_name(key) for key in region))
        coordinated = {(node.name, index) for vertex, index in region
                       for node in self.plan.vertices[vertex].nodes if node.coordinator}
        self.region_failover.region_restarted()
        log.warning("job %s: restarting region %s from checkpoint %d as attempt %d",
                    self.job_id, ", ".join(names), restore.checkpoint_id, self.attempt)
        self.operator_coordinators.subtask_reset(coordinated, restore.checkpoint_id)
        rows = self.coordinator.start_region(self.attempt, region)
        self.progress_tracker.region_started(
            self.attempt, map(self.deployment.metrics_name, region), rows=rows)
        for key in region:
            self.finished.pop(key, None)
        self.recoveries.begin(recovery.restoring(restore.checkpoint_id, (), names))
        self._note()
        try:
            deployed = self.deployment.deploy_region(self.attempt, region, restore)
        except (RayActorError, RegionRefused) as exc:
            return self._failover(Failure(f"the restart of region {', '.join(names)} failed: "
                                          f"{type(exc).__name__}: {exc}".splitlines()[0],
                                          operator="region failover"))
        self.recoveries.timed(self.attempt, lambda clock: clock.deployed(
            cancelled_at=deployed.cancelled_at, deployed_at=deployed.started_at))
        if coordinated:
            self.operator_coordinators.bind(self.deployment.event_transport(), only=coordinated)
        return None

    @staticmethod
    def _failed(decision: FailJob) -> JobOutcome:
        return JobOutcome(JobStatus.FAILED, error=decision.error, operator=decision.operator,
                          error_types=decision.error_types,
                          subtask=decision.subtask, traceback=decision.traceback)

    # -- deployment -------------------------------------------------------------------------------
    def _deploy_first(self, restore: RestoreSpec | None) -> JobOutcome | None:
        """Deploy the first attempt. A subtask lost meanwhile is a failure like any
        other: the restart strategy applies (an outcome only if it ends the job)."""
        try:
            self._deploy(restore=restore)
        except RayActorError as exc:
            return self._failover(failure_of(deployment_failure(exc)))
        return None

    def _deploy(self, restore: RestoreSpec | None, avoid_nodes: list[str] | None = None) -> None:
        """Deploy the current attempt (none of it on ``avoid_nodes``) and bind the operator
        coordinators to its subtasks."""
        self.finished = {}
        self.region_failover.job_restarted()
        if self.coordinator is not None:
            self.coordinator.start_attempt(self.attempt, self._coordinator_failpoints(),
                                           rows=restore.rows if restore else RowCounts())
        self.progress_tracker.attempt_started(self.attempt,
                                              rows=restore.rows if restore else RowCounts())
        self._note()
        deployed = self.deployment.deploy(self.attempt, restore, avoid_nodes or [])
        self.recoveries.timed(self.attempt, lambda clock: clock.deployed(
            cancelled_at=deployed.cancelled_at, deployed_at=deployed.started_at))
        if self.operator_coordinators:
            self.operator_coordinators.bind(self.deployment.event_transport())

    def _notify_complete(self, n: int) -> None:
        """Checkpoint ``n`` completed: its subtasks are told (committers commit it)."""
        latest = self.coordinator.latest() if self.coordinator is not None else None
        if latest is not None and latest.checkpoint_id == n and latest.is_savepoint:
            # noted before anything is committed: a successor must not restore past it
            self._committed_savepoint = CommittedSavepoint(n, latest.storage_uri)
            self._note()
        elif self.options.may_restart and self.recoveries.rows() != self._noted_restores:
            # a recovery's stages came since the last note (where its state came from):
            # noted, so that a successor master reports the recovery whole
            self._note()
        self.region_failover.checkpoint_completed()  # a restarted region took part in it
        self.deployment.notify_checkpoint_complete(n, self.attempt)

    def _master_failpoints(self) -> Failpoints:
        return Failpoints.of_job_master(self.options.failpoints, self.attempt)

    def _coordinator_failpoints(self) -> Failpoints:
        return Failpoints.of_coordinator(self.options.failpoints, self.attempt)

    def _create_coordinator(self) -> CheckpointCoordinator | None:
        config = self.options.checkpoints
        if config is None:
            return None
        deployment = self.deployment
        return CheckpointCoordinator(
            config=config, job_key=self.job_id, job_name=self.job_name,
            subtasks=[(v.id, i) for v in self.plan.vertices for i in range(v.parallelism)],
            max_parallelism=self.plan.max_parallelism,
            vertex_heads={v.id: v.nodes[0].name for v in self.plan.vertices},
            topology=self.plan.describe(),
            send_trigger=deployment.trigger_checkpoint,
            notify_complete=self._notify_complete,
            notify_aborted=deployment.notify_checkpoint_aborted,
            failpoints=self._coordinator_failpoints(),
            operator_coordinators=self.operator_coordinators)
