"""What the driver holds of a running job: a client, and at the end a result."""

from __future__ import annotations

import time
from typing import Any, cast

import pyarrow as pa
import ray
from ray.exceptions import RayActorError

from raystream.checkpoint.coordinator import CheckpointStats
from raystream.engine import actor_pool, registry
from raystream.engine.sink_handle import SinkHandle
from raystream.engine.diagnosis import JobDiagnosis
from raystream.engine.errors import JobNotFoundError, JobNotRunningError, job_failed_error
from raystream.engine.job_master import NAMESPACE, JobOutcome
from raystream.engine.job_options import master_actor_name
from raystream.engine.job_options import RESUME_HINT
from raystream.engine.job_report import outcome_of_summary
from raystream.engine.job_status import JobStatus
from raystream.engine.plan import JobPlan
from raystream.engine.savepoint_failure import SavepointFailure, SavepointFailureCause



class JobResult:
    """The outcome of a finished job: sink results, timings and per-subtask metrics."""

    def __init__(self, job_name: str, outcome: JobOutcome, plan: JobPlan | None) -> None:
        self.job_name = job_name
        self.status = outcome.status
        self.deploy_s = outcome.deploy_s
        self.run_s = outcome.run_s
        self.metrics = outcome.metrics
        self.restarts = outcome.restarts
        self.failures = outcome.failures
        self.restores = outcome.restores  # per failover: attempt, checkpoint_id, restore_s
        self.checkpoints = outcome.checkpoints
        self._results = outcome.results

    def table(self, sink: SinkHandle) -> pa.Table:
        """Everything a ``collect()`` sink received: without checkpoints subtask by subtask,
        in arrival order; with checkpoints what this run committed, exactly once, checkpoint
        by checkpoint (of a canceled job, what it committed before the cancel; a run
        resumed from its checkpoint holds the rest)."""
        read = getattr(sink, "read", None)
        if callable(read):  # a sink with committed files of its own
            return read()
        parts = self._results.get(sink.transformation_id)
        if parts is None and self.status is JobStatus.CANCELED:
            raise ValueError(f"job '{self.job_name}' was canceled and {sink} committed nothing "
                             f"before: a canceled job's collect() sink holds what its "
                             f"checkpoints committed (none completed, or the job had none)")
        if parts is None:
            raise KeyError(f"{sink} is not a sink of job '{self.job_name}'")
        if not all(isinstance(p, pa.Table) for p in parts):
            raise TypeError(f"{sink} does not collect records; use result.count({sink.name!r})")
        non_empty = [p for p in parts if p.num_columns]
        return pa.concat_tables(non_empty, promote_options="default") if non_empty else pa.table({})

    def to_spark(self, spark: Any, sink: SinkHandle) -> Any:
        """A Spark DataFrame of what ``sink`` received, without files in between.

        A ``collect()`` sink's rows go through Ray's object store
        (``rs.spark.to_spark``: blocks owned by this driver, exact types);
        a Parquet sink's committed files are read by Spark itself
        (``rs.spark.read``).

            >>> import raystream as rs
            >>> df = result.to_spark(rs.spark.session(), sink)   # doctest: +SKIP
            >>> df.groupBy("k").count().show()                     # doctest: +SKIP
        """
        from raystream.spark import read, to_spark

        path = getattr(sink, "path", None)
        if path is not None:
            return read(spark, path)
        return to_spark(spark, self.table(sink))

    def count(self, sink: SinkHandle) -> int:
        """Number of records a ``discard()`` or ``collect()`` sink received."""
        parts = self._results[sink.transformation_id]
        return sum(p.num_rows if isinstance(p, pa.Table) else int(p) for p in parts)

    def __repr__(self) -> str:
        return f"JobResult({self.job_name!r}, {self.status}, run {self.run_s:.2f} s)"


class JobClient:
    """Handle on a job started with ``env.execute_async``, or attached to a running job
    of the Ray cluster with :meth:`attach`."""

    def __init__(self, job_id: str, job_name: str, master: Any, plan: JobPlan | None,
                 *, owner: bool = True, leased: tuple[Any, ...] = ()) -> None:
        self.job_id = job_id
        self.job_name = job_name
        self.plan = plan
        self._master = master
        self._owner = owner  # the driver that started the job ends its master after it
        self._leased = leased  # the driver's pooled actors the job runs on
        self._outcome: JobOutcome | None = None

    @classmethod
    def attach(cls, job: str) -> "JobClient":
        """A client for a running job of the connected Ray cluster, started by another
        process (``raystream run`` or ``submit``, another driver). ``job`` is a job id,
        a unique prefix of one, or a job name.

            >>> import ray, raystream as rs
            >>> ray.init(address="auto")  # doctest: +SKIP
            >>> rs.JobClient.attach("clickstream").savepoint("s3://bucket/savepoints/sp1")  # doctest: +SKIP
            's3://bucket/savepoints/sp1'

        Its ``wait()`` does not end the job's master: the driver that started the job does.
        """
        summary = registry.find_job(job)
        if summary["status"] in registry.TERMINAL_STATUSES:  # a detached master may linger
            raise JobNotRunningError(f"job {summary['job_id']} is {summary['status']}")
        try:
            master = ray.get_actor(master_actor_name(summary["job_id"]), namespace=NAMESPACE)
        except ValueError:
            raise JobNotRunningError(
                f"job {summary['job_id']} is {summary['status']} as last reported, but its job "
                f"master is gone (its driver exited); {RESUME_HINT.format(name=summary['name'])}"
            ) from None
        return cls(summary["job_id"], summary["name"], master, None, owner=False)

    def status(self) -> str:
        """CREATED, DEPLOYING, RUNNING, CANCELING, FINISHED, FAILED or CANCELED."""
        if self._outcome is not None:
            return self._outcome.status
        return ray.get(self._master.get_status.remote())

    def wait(self, timeout_s: float | None = None) -> JobResult:
        """Block until the job ends; raise a :class:`~raystream.JobFailedError` if it failed
        (a :class:`~raystream.JobFailedOnBadRecord` or :class:`~raystream.JobFailedOnFileRead`
        if a user's data failed it)."""
        if self._outcome is None:
            try:
                # JobMaster.wait's type (ray.get of an actor call is typed List[Any])
                outcome = cast(JobOutcome | None, ray.get(self._master.wait.remote(timeout_s)))
            except RayActorError as e:
                if self._owner:
                    # the master died: nobody gives its pooled actors back or stops them
                    for actor in self._leased:
                        ray.kill(actor)
                    outcome = self._master_lost(e)
                else:
                    outcome = self._outcome_from_directory()  # its driver took it and left
            if outcome is None:
                raise TimeoutError(f"job '{self.job_name}' still running after {timeout_s} s")
            self._outcome = outcome
            if self._owner:
                ray.kill(self._master)
                self._forget_master()
        outcome = self._outcome
        if outcome.status is JobStatus.FAILED:
            message = f"job '{self.job_name}' failed: {outcome.error}"
            if outcome.failures[:-1]:
                message += "\n\nEarlier failures (restarted):\n" + "\n".join(
                    f"  {f}" for f in outcome.failures[:-1])
            if outcome.traceback:
                message += "\n\nOriginal traceback:\n" + outcome.traceback
            raise job_failed_error(message, error_types=outcome.error_types,
                                   operator=outcome.operator, subtask=outcome.subtask,
                                   traceback=outcome.traceback)
        return JobResult(self.job_name, outcome, self.plan)

    def _forget_master(self) -> None:
        """The job's warm master is gone with its outcome here: its assignment can go
        from the driver's pool keeper (kept until now, so that a successor of a master
        that died after publishing the outcome answers with it rather than hang)."""
        keeper = actor_pool.POOL.keeper_name()
        if keeper is not None:
            actor_pool.forget_assignment(keeper, master_actor_name(self.job_id))

    def cancel(self) -> None:
        """Ask every subtask to stop; ``wait()`` then returns a CANCELED result."""
        if self._outcome is None:
            ray.get(self._master.cancel.remote())

    def savepoint(self, path: str, *, timeout_s: float | None = 300, retry: int = 0) -> str:
        """Take a savepoint to ``path`` (a directory or URI) while the job keeps running.

        Always aligned; it commits no side effects and is never used for
        failover; it is never deleted automatically. Returns ``path``. A savepoint that
        fails raises :class:`~raystream.SavepointFailedError`; one that may succeed if
        asked again (declined, timed out, cut short by a failover) is asked again up to
        ``retry`` times first.
        """
        return self._savepoint(path, stop=False, drain=False, timeout_s=timeout_s, retry=retry)

    def stop_with_savepoint(self, path: str, *, drain: bool = False,
                            timeout_s: float | None = 300, retry: int = 0) -> JobResult:
        """Stop the sources, take a savepoint to ``path``, commit, and end the job.

        With ``drain`` the sources end their input first (event time advances
        to the end, so every window fires) and the final checkpoint is the
        savepoint. Restore it with ``env.execute(..., restore_from=path)``,
        at any parallelism. A stop that fails raises
        :class:`~raystream.SavepointFailedError` (the job goes on); ``retry`` as for
        :meth:`savepoint`.
        """
        self._savepoint(path, stop=True, drain=drain, timeout_s=timeout_s, retry=retry)
        return self.wait(timeout_s)

    def _savepoint(self, path: str, *, stop: bool, drain: bool, timeout_s: float | None,
                   retry: int) -> str:
        if retry < 0:
            raise ValueError(f"retry must be 0 or more, not {retry}")
        retried = 0
        while True:
            try:
                # JobMaster.savepoint's type (ray.get of an actor call is typed List[Any])
                answer = cast(str | SavepointFailure,
                              ray.get(self._master.savepoint.remote(path, stop, drain, timeout_s)))
            except RayActorError as exc:  # the master is gone for good (else Ray retried)
                answer = SavepointFailure(SavepointFailureCause.JOB_ENDED, path,
                                          f"its job master died ({type(exc).__name__})",
                                          job_still_running=False)
            if isinstance(answer, str):
                return answer
            if not answer.retryable or retried == retry:
                raise answer.error()
            retried += 1

    def subtask_actor(self, operator_name: str, index: int) -> Any:
        """The Ray actor running subtask ``index`` of the chain holding ``operator_name``
        in the job's current attempt (a test kills it with ``ray.kill``)."""
        if self.plan is None:
            raise ValueError("an attached client does not know the job's plan")
        vertex = self.plan.vertex_of(operator_name)
        # JobMaster.subtask_actors' type (ray.get of an actor call is typed List[Any])
        actors = cast(dict[str, list[Any]], ray.get(self._master.subtask_actors.remote()))
        actor = actors[vertex.name][index]
        if actor is None:
            raise ValueError(f"subtask {index} of '{vertex.name}' is not deployed (the job is "
                             f"starting or restarting)")
        return actor

    def progress(self) -> dict[str, Any]:
        """A running job's status, attempt, failures so far and checkpoint history, with
        its progress (the fields of :class:`~raystream.engine.job_progress.JobProgress`:
        rows read and written and their rates, the share of a bounded input read, the
        watermark at the sinks and its lag, and what it does in words). Counts never go
        back, through restarts too.

            >>> p = client.progress()  # doctest: +SKIP
            >>> p["phase"], p["rows_read"], p["fraction_read"], p["watermark_lag_s"]  # doctest: +SKIP
            ('running', 55750, 0.46, 118.2)
        """
        return ray.get(self._master.progress.remote())

    def diagnosis(self) -> JobDiagnosis:
        """Why the running job has not finished: the subtasks that have not reported
        finished, each with what it waits for (splits, end of input on which channels),
        and the checkpoints in progress with the subtasks they wait for.

        >>> print(client.diagnosis())  # doctest: +SKIP
        job clicks: RUNNING, attempt 1, newest completed checkpoint 7, no final checkpoint yet
          not finished: window[1] (attempt 1): inputs open; channel 1:0->1 open (...)
        """
        return ray.get(self._master.diagnosis.remote())

    def checkpoints(self) -> list[CheckpointStats]:
        """The job's checkpoint history: id, status, duration, size, savepoint location."""
        if self._outcome is not None:
            return list(self._outcome.checkpoints)
        return self.progress()["checkpoints"]

    def metrics(self) -> dict[str, dict[str, float]]:
        """Metrics of every subtask (records and bytes in/out, batches, backpressure,
        watermark), by ``"chain/index"``: live while the job runs, final after it ended."""
        if self._outcome is not None:
            return dict(self._outcome.metrics)
        return ray.get(self._master.metrics.remote())

    def placement(self) -> dict[str, str]:
        """The Ray node id of the job master (``"job master"``) and of every subtask of the
        running job (``"chain/index"``)."""
        return ray.get(self._master.get_placement.remote())

    def _master_lost(self, cause: Exception) -> JobOutcome:
        """The job master died under this driver: the job failed; the directory says so."""
        error = (f"its job master died ({type(cause).__name__}); {self._resume_hint()}")
        try:
            summary = registry.find_job(self.job_id)
        except JobNotFoundError:
            pass  # it died before publishing anything
        else:
            if summary["status"] not in registry.TERMINAL_STATUSES:
                registry.publish({**summary, "status": JobStatus.FAILED.value, "error": error,
                                  "ended_at": time.time()})
        return JobOutcome(JobStatus.FAILED, error=error)

    def _resume_hint(self) -> str:
        return RESUME_HINT.format(name=self.job_name)

    def _outcome_from_directory(self) -> JobOutcome:
        summary = registry.find_job(self.job_id)
        if summary["status"] not in registry.TERMINAL_STATUSES:
            return JobOutcome(JobStatus.FAILED, error=f"the job master of {self.job_id} is gone "
                                                    f"(its driver exited while it was "
                                                    f"{summary['status']}); {self._resume_hint()}")
        return outcome_of_summary(summary)
