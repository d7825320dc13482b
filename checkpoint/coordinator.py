"""The checkpoint coordinator (Flink's ``CheckpointCoordinator``).

Lives in the job master actor and is driven from its one event thread, so
every transition of a checkpoint happens in one place, in order:

    trigger ──► PENDING ──(every subtask acknowledged)──► metadata written ──► COMPLETED
                   │                                                          (notify subtasks)
                   └──(decline · timeout · failover · subsumed)──► ABORTED (notify subtasks)

Checkpoint ``n`` is complete exactly when its metadata file is durable; only
then are subtasks told (``notify_checkpoint_complete``), so side effects are
committed only for checkpoints a restore can return to. Ids increase across
restarts (the next id is above every ``chk-<id>`` directory in storage).

Unaligned checkpoints (``CheckpointConfig(unaligned=True)`` or
``aligned_timeout``) also list each subtask's channel state file; such a
checkpoint restores only into the same job graph at the same parallelism
(its metadata keeps the plan's description to check that).
"""

from __future__ import annotations

import collections
import enum
import logging
import time
from dataclasses import dataclass
from typing import Callable

from raystream.checkpoint.barrier import Barrier, SnapshotKind
from raystream.checkpoint.restore import OperatorRestore, RestoreSpec
from raystream.checkpoint.config import AlignmentMode, CheckpointConfig
from raystream.checkpoint.coordinator_holder import OperatorCoordinators
from raystream.checkpoint.handles import IncrementalHandle, OperatorSubtaskState
from raystream.checkpoint.keygroups import HASH_VERSION
from raystream.checkpoint.metadata import CheckpointMetadata, OperatorFiles, RowCounts
from raystream.checkpoint.pending_checkpoint import AcknowledgeResult, PendingCheckpoint, SubtaskKey
from raystream.checkpoint.shared_state import SharedStateRegistry
from raystream.checkpoint.storage import (SAVEPOINT_JOB_KEY, CheckpointStorage,
                                          CorruptCheckpointError, StateHandle,
                                          snapshot_destination)
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.checkpoint.state_backend import is_disk
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.core.failpoints import Failpoints

log = logging.getLogger(__name__)

ABORT_LOG_EVERY_S = 5.0  # at most one "checkpoint aborted" line per job this often
HISTORY_RETAINED = 1000  # rows of checkpoint history a job keeps (progress(), result.checkpoints)


class TooManyCheckpointFailures(RuntimeError):
    """More checkpoints failed in a row than ``tolerable_failures``: the job fails over."""


class _ThrottledLog:
    """A warning repeated often (checkpoints aborting one after another) is logged at most
    once per ``every_s``, with the number of lines left out since."""

    def __init__(self, logger: logging.Logger, every_s: float) -> None:
        self.logger, self.every_s = logger, every_s
        self._last = float("-inf")
        self._left_out = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._left_out += 1
            return
        if self._left_out:
            message, args = message + " (%d more since the last such line)", (*args, self._left_out)
        self.logger.warning(message, *args)
        self._last, self._left_out = now, 0


@dataclass(eq=False)
class SavepointTicket:
    """A savepoint asked for. It waits in the coordinator's queue until fewer than
    ``max_concurrent`` checkpoints are pending (ahead of the next periodic one), so it
    never overlaps more checkpoints than the job allows; ``checkpoint_id`` is set when
    it is triggered."""

    target: str
    kind: SnapshotKind  # SAVEPOINT or STOP_SAVEPOINT
    checkpoint_id: int | None = None


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A completed checkpoint, or a completed stop savepoint (final: it committed its
    output, so a restore goes back to it like to a checkpoint)."""

    checkpoint_id: int
    metadata: CheckpointMetadata
    storage_uri: str
    job_key: str

    @property
    def is_savepoint(self) -> bool:
        return self.job_key == SAVEPOINT_JOB_KEY

    def restore_spec(self) -> RestoreSpec:
        return restore_spec_of(self.checkpoint_id, self.metadata, self.storage_uri)


@dataclass(frozen=True)
class CommittedSavepoint:
    """A stop savepoint whose completion was notified (its output may be committed):
    checkpoint ``checkpoint_id`` of the savepoint directory ``location``. A successor of
    the job's master restores it (:meth:`CheckpointCoordinator.take_over`) if it is newer
    than the job's newest checkpoint: it is not among the job's checkpoints."""

    checkpoint_id: int
    location: str


class CheckpointStatus(enum.StrEnum):
    """Where a checkpoint is (a StrEnum: JSON and command-line output stay plain text)."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    CORRUPT = "CORRUPT"  # completed, then found damaged at a restore: never restored


class AbortCause(enum.StrEnum):
    """Why a checkpoint was aborted (a StrEnum: it goes to JSON with its stats)."""

    DECLINED = "DECLINED"  # by a subtask, the operator coordinators, or the storage
    TIMED_OUT = "TIMED_OUT"
    SUBSUMED = "SUBSUMED"  # a later checkpoint completed first
    FAILOVER = "FAILOVER"  # cut short by a failover


@dataclass
class CheckpointStats:
    """One row of a job's checkpoint history."""

    checkpoint_id: int
    trigger_ts_ms: int
    status: CheckpointStatus
    duration_s: float = 0.0  # trigger to completion (or abort)
    size: int = 0  # bytes written: operator state and channel state
    reason: str = ""
    abort_cause: AbortCause | None = None  # of an aborted one
    savepoint: str | None = None  # the savepoint's location, for savepoints
    alignment_s: float = 0.0  # longest time a subtask waited for barriers to align
    # the longest of any subtask (Flink's checkpoint details): from the trigger until its
    # first barrier, its synchronous snapshot, its asynchronous write
    start_delay_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    channel_state_bytes: int = 0  # in-flight data written (unaligned checkpoints)
    unaligned: bool = False  # some subtask took it unaligned (or a barrier overtook data)

    def __post_init__(self) -> None:  # read back from JSON (the job directory): plain text
        self.status = CheckpointStatus(self.status)
        if self.abort_cause is not None:
            self.abort_cause = AbortCause(self.abort_cause)

    def aborted(self, reason: str, cause: AbortCause, duration_s: float) -> None:
        self.status, self.reason, self.duration_s = CheckpointStatus.ABORTED, reason, duration_s
        self.abort_cause = cause

    def completed(self, pending: PendingCheckpoint, duration_s: float) -> None:
        self.status, self.duration_s = CheckpointStatus.COMPLETED, duration_s
        self.size, self.alignment_s = pending.size, pending.alignment_s
        self.start_delay_s, self.sync_s = pending.start_delay_s, pending.sync_s
        self.async_s = pending.async_s
        self.unaligned, self.channel_state_bytes = pending.unaligned, pending.channel_state_bytes

    def corrupt(self, reason: str) -> None:
        """Completed, then found damaged at a restore."""
        self.status, self.reason = CheckpointStatus.CORRUPT, reason


class CheckpointCoordinator:
    def __init__(self, *, config: CheckpointConfig, job_key: str, job_name: str,
                 subtasks: list[SubtaskKey], max_parallelism: int,
                 vertex_heads: dict[int, str] | None = None, topology: str = "",
                 send_trigger: Callable[[Barrier], None],
                 notify_complete: Callable[[int], None],
                 notify_aborted: Callable[[int], None],
                 failpoints: Failpoints,
                 operator_coordinators: OperatorCoordinators | None = None) -> None:
        self.config = config
        self.storage = CheckpointStorage(config.storage)
        self.storage.check_writable(job_key)
        self.job_key, self.job_name = job_key, job_name
        self.subtasks = list(subtasks)
        self.max_parallelism = max_parallelism
        # vertex id -> its head operator's name: restored watermarks follow operators,
        # not vertex ids, which change with the chaining of another job version
        self.vertex_heads = vertex_heads or {}
        self.topology = topology  # the plan's description: channel state needs the same plan
        self._send_trigger = send_trigger
        self._notify_complete = notify_complete
        self._notify_aborted = notify_aborted
        self.failpoints = failpoints
        # snapshotted first in every checkpoint; barriers wait for their events' delivery
        self.operator_coordinators = operator_coordinators or OperatorCoordinators([])
        self.attempt = 0
        # the subtasks a region failover restarted, with their attempt (the others run
        # ``attempt``'s, or an older region's)
        self.attempts: dict[SubtaskKey, int] = {}
        self.pending: dict[int, PendingCheckpoint] = {}
        self.completed: list[CompletedCheckpoint] = []  # oldest first
        self._undeleted: set[int] = set()  # discarded checkpoints whose directory remained
        # files of incremental checkpoints shared between checkpoints: who uses which
        self.shared_state = SharedStateRegistry(self.storage, job_key)
        self.history: dict[int, CheckpointStats] = {}
        self._rows_before = RowCounts()  # at the checkpoint this attempt restored
        # each subtask's rows in its attempt at the newest completed checkpoint (none: it
        # restored that one): what a region restored to it counts on from
        self._rows_at_latest: dict[SubtaskKey, RowCounts] = {}
        self.failures_in_a_row = 0
        # The newest checkpoint whose completion was notified: its output may be committed
        # (what a committer did with the notification is not visible here).
        self.committed_upto = 0
        self._last_id = self.storage.highest_checkpoint_id(job_key)
        self._last_trigger = time.monotonic()
        self._last_completion = float("-inf")  # min_pause never delays the first checkpoint
        self.final_checkpoint: int | None = None
        self._final_aborted = False  # a final checkpoint failed: retry it at the interval
        # every subtask of the attempt has finished: the next checkpoint is the final one,
        # which the master triggers; periodic ones would only delay it (or, after a failed
        # final one, starve it: each took the interval it waits for)
        self._input_ended = False
        self._aborts_log = _ThrottledLog(log, ABORT_LOG_EVERY_S)
        self.initial_restore: RestoreSpec | None = None  # savepoint the job started from
        self._queued_savepoints: collections.deque[SavepointTicket] = collections.deque()
        self.acknowledgements: collections.Counter[AcknowledgeResult] = collections.Counter()

    # -- triggering ------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Called often by the master: periodic trigger, barriers held for operator
        events, timeouts."""
        for n, pending in list(self.pending.items()):
            if now - pending.started > self.config.timeout_s:
                self.abort(n, f"timed out after {self.config.timeout_s:g} s",
                           cause=AbortCause.TIMED_OUT)
            elif pending.barrier is not None:
                self._send_barrier_when_events_are_done(pending)
        self._trigger_queued_savepoints()
        if (self.final_checkpoint is None and not self._input_ended
                and not self._queued_savepoints
                and len(self.pending) < self.config.max_concurrent
                and now - self._last_trigger >= self.config.interval_s
                and now - self._last_completion >= self.config.min_pause_s):
            self.trigger()

    def request_savepoint(self, target: str, *, stop: bool = False) -> SavepointTicket:
        """Queue a savepoint to ``target``; it is triggered as soon as a checkpoint slot
        is free (at once when one is). Unlike a periodic checkpoint it ignores
        ``min_pause_s``: someone is waiting for it."""
        ticket = SavepointTicket(target, SnapshotKind.STOP_SAVEPOINT if stop
                                 else SnapshotKind.SAVEPOINT)
        self._queued_savepoints.append(ticket)
        self._trigger_queued_savepoints()
        return ticket

    def _trigger_queued_savepoints(self) -> None:
        # none after the final checkpoint: the job ends with it
        while (self._queued_savepoints and self.final_checkpoint is None
               and len(self.pending) < self.config.max_concurrent):
            ticket = self._queued_savepoints.popleft()
            ticket.checkpoint_id = self.trigger(ticket.kind, savepoint_target=ticket.target)

    def end_of_input(self) -> None:
        """Every subtask of the attempt has finished: no periodic checkpoint is triggered
        any more; the next is the final one (:meth:`final_due`)."""
        self._input_ended = True

    def final_due(self, now: float) -> bool:
        """May the master trigger the final checkpoint (FLIP-147) now? As soon as a
        checkpoint slot is free the first time in an attempt; after one failed, no sooner
        than ``interval_s`` after the last trigger."""
        if len(self.pending) >= self.config.max_concurrent:
            return False
        return not self._final_aborted or now - self._last_trigger >= self.config.interval_s

    def trigger(self, kind: SnapshotKind = SnapshotKind.CHECKPOINT, *,
                savepoint_target: str | None = None) -> int:
        """Start checkpoint n of ``kind`` (a savepoint's to ``savepoint_target``).

        A savepoint is always aligned, and unless it stops the job it neither
        commits side effects nor serves failover (Flink >= 1.15). A final
        checkpoint follows the end of input (FLIP-147).
        """
        self._last_id += 1
        n = self._last_id
        now = time.monotonic()
        self._last_trigger = now
        ts = int(time.time() * 1000)
        self.pending[n] = PendingCheckpoint(n, ts, now, set(self.subtasks), kind=kind,
                                            savepoint_target=savepoint_target)
        self.history[n] = CheckpointStats(n, ts, CheckpointStatus.PENDING,
                                          savepoint=savepoint_target)
        self._forget_old_history()
        if kind.is_final:
            self.final_checkpoint = n
        unaligned, timeout_ms = False, None
        if not kind.is_savepoint:  # savepoints are always aligned
            unaligned = self.config.alignment is AlignmentMode.UNALIGNED
            if self.config.aligned_timeout is not None:
                timeout_ms = int(round(self.config.aligned_timeout * 1000))
        pending = self.pending[n]
        pending.barrier = Barrier(n, self.attempt, ts, kind, savepoint_target,
                                  unaligned=unaligned, aligned_timeout_ms=timeout_ms)
        if self.operator_coordinators:  # operator coordinators first (Flink's order)
            states = self.operator_coordinators.checkpoint(n)
            try:
                pending.coordinators = self._write_coordinator_states(n, states, savepoint_target)
                pending.size += sum(handle.size for handle in pending.coordinators.values())
            except Exception as exc:
                self.abort(n, f"declined: the operator coordinators' state could not be "
                              f"written: {type(exc).__name__}: {exc}")
                return n
        self._send_barrier_when_events_are_done(pending)
        return n

    def _write_coordinator_states(self, n: int, states: dict[str, bytes],
                                  savepoint_target: str | None) -> dict[str, StateHandle]:
        storage, job_key = snapshot_destination(self.storage, self.job_key, savepoint_target)
        return {name: storage.write_state(job_key, n, f"coordinator-{index}.state",
                                          state)
                for index, (name, state) in enumerate(sorted(states.items()))}

    def _send_barrier_when_events_are_done(self, pending: PendingCheckpoint) -> None:
        """Inject the barrier at the sources once every operator event sent before the
        coordinators' snapshots has reached its subtask (FLINK-26029); a failed delivery
        fails the checkpoint, and the job fails over."""
        n = pending.checkpoint_id
        try:
            ready = self.operator_coordinators.ready_to_trigger(n)
        except Exception as exc:
            self.abort(n, f"operator event not delivered: {exc}")
            raise
        barrier = pending.barrier
        if ready and barrier is not None:
            pending.barrier = None
            self._send_trigger(barrier)

    # -- acknowledgements -------------------------------------------------------------------
    def acknowledge(self, attempt: int, n: int, subtask: SubtaskKey,
                    written: dict[str, OperatorSubtaskState],
                    stats: SnapshotStats) -> AcknowledgeResult:
        """Take subtask ``subtask``'s state of checkpoint ``n``; the checkpoint completes
        with its last acknowledgement."""
        result = self._acknowledge(attempt, n, subtask, written, stats)
        self.acknowledgements[result] += 1
        if result in (AcknowledgeResult.DUPLICATE, AcknowledgeResult.UNKNOWN):
            log.warning("checkpoint %d of %s: %s acknowledgement from subtask %s", n,
                        self.job_name, result.value, subtask)
        return result

    def _acknowledge(self, attempt: int, n: int, subtask: SubtaskKey,
                     written: dict[str, OperatorSubtaskState],
                     stats: SnapshotStats) -> AcknowledgeResult:
        pending = self.pending.get(n)
        if not self.runs(subtask, attempt) or (pending is None and n <= self._last_id):
            return AcknowledgeResult.DISCARDED
        if pending is None:
            return AcknowledgeResult.UNKNOWN
        result = pending.acknowledge(subtask, written, stats)
        if result is AcknowledgeResult.SUCCESS and pending.fully_acknowledged:
            self._complete(pending)
        return result

    def decline(self, attempt: int, n: int, subtask: SubtaskKey, reason: str) -> None:
        if self.runs(subtask, attempt) and n in self.pending:
            self.abort(n, f"declined by subtask {subtask}: {reason}")

    def abort(self, n: int, reason: str, *, failed: bool = True,
              cause: AbortCause = AbortCause.DECLINED) -> None:
        """Abort pending checkpoint ``n``. A *failed* one (declined, timed out,
        not writable) counts toward ``tolerable_failures``; a subsumed one, one
        cut short by a failover, or a savepoint (its failure goes to whoever asked
        for it, as in Flink) does not."""
        pending = self.pending.pop(n, None)
        if pending is None:
            return
        self.history[n].aborted(reason, cause, time.monotonic() - pending.started)
        if pending.kind.is_final:
            self.final_checkpoint = None  # the master triggers another final checkpoint
            self._final_aborted = True
        self._aborts_log.warning("checkpoint %d of %s aborted: %s", n, self.job_name, reason)
        self._notify_aborted(n)
        self.operator_coordinators.abort(n)
        if not pending.kind.is_savepoint:
            self._discard(n)  # files a subtask still writes later stay: the job dir is theirs
        if failed and not pending.kind.is_savepoint:
            self.failures_in_a_row += 1
            if self.failures_in_a_row > self.config.tolerable_failures:
                raise TooManyCheckpointFailures(
                    f"{self.failures_in_a_row} checkpoints failed in a row (tolerable: "
                    f"{self.config.tolerable_failures}); the last: {reason}")

    def start_attempt(self, attempt: int, failpoints: Failpoints,
                      rows: RowCounts = RowCounts()) -> None:
        """A failover redeploys the job as ``attempt``: acknowledgements of older
        attempts are ignored from now on, and the final checkpoint (FLIP-147) is
        taken again once the restored subtasks finish. ``rows``: read and written at
        the checkpoint the attempt restores (its checkpoints add the attempt's)."""
        self.attempt, self.failpoints = attempt, failpoints
        self.attempts = {}
        self._rows_before = rows
        self._rows_at_latest = {}
        self.final_checkpoint = None
        # the restored subtasks have input to read again, and their final checkpoint is a
        # first one (a final checkpoint of the attempt before failed with it)
        self._input_ended = self._final_aborted = False

    def start_region(self, attempt: int, subtasks: frozenset[SubtaskKey]) -> RowCounts:
        """A region failover redeploys ``subtasks`` alone as ``attempt`` from the newest
        completed checkpoint (the others go on): their older attempts' acknowledgements
        are ignored from now on. They have input to read again, so a final checkpoint is
        taken again once they finish. Returns their rows at that checkpoint in their
        attempts before, which the job's counts keep (the new attempt counts from 0)."""
        kept = sum((self._rows_at_latest.pop(s, RowCounts()) for s in subtasks), RowCounts())
        self._rows_before += kept
        self.attempts.update(dict.fromkeys(subtasks, attempt))
        self.final_checkpoint = None
        self._input_ended = self._final_aborted = False
        return kept

    def runs(self, subtask: SubtaskKey, attempt: int) -> bool:
        """Is ``attempt`` the one ``subtask`` runs now?"""
        return attempt == self.attempts.get(subtask, self.attempt)

    def abort_all(self, reason: str) -> None:
        """A failover: every pending checkpoint is aborted and queued savepoints are
        dropped (whoever asked for them hears of the failover from the master)."""
        self._queued_savepoints.clear()
        for n in sorted(self.pending):
            self.abort(n, reason, failed=False, cause=AbortCause.FAILOVER)

    # -- completion ---------------------------------------------------------------------------
    def _complete(self, pending: PendingCheckpoint) -> None:
        n = pending.checkpoint_id
        metadata = self._metadata(pending)
        gone = self.shared_state.unknown(n, metadata)
        if gone:  # a subtask reused files of a checkpoint retention discarded meanwhile
            self.abort(n, f"it references shared state files no retained checkpoint keeps "
                          f"(deleted): {', '.join(gone[:3])}", failed=False)
            return
        storage, job_key = snapshot_destination(self.storage, self.job_key,
                                                pending.savepoint_target)
        try:
            storage.write_metadata(job_key, n, metadata.to_json())
        except Exception as exc:
            self.abort(n, f"metadata could not be written: {type(exc).__name__}: {exc}")
            return
        del self.pending[n]
        self.history[n].completed(pending, time.monotonic() - pending.started)
        if not pending.kind.commits:
            return  # a savepoint of a running job: no commit, no failover target
        self.completed.append(CompletedCheckpoint(n, metadata, storage.uri, job_key))
        self._rows_at_latest = dict(pending.rows_of)
        self.shared_state.register(n, metadata)
        self._last_completion = time.monotonic()
        self.failures_in_a_row = 0
        for older in [m for m in self.pending if m < n]:
            self.abort(older, f"subsumed by checkpoint {n}", failed=False,
                       cause=AbortCause.SUBSUMED)
        self._discard_beyond_retention()
        self.failpoints.hit("after_metadata_before_notify")
        self.committed_upto = n
        self._notify_complete(n)
        self.operator_coordinators.complete(n)

    def _metadata(self, pending: PendingCheckpoint) -> CheckpointMetadata:
        operators: dict[str, dict[str, list]] = {}
        handles = []
        for subtask in sorted(pending.written):
            for name, state in pending.written[subtask].items():
                files = operators.setdefault(name, {"operator_state": [], "keyed_state": [],
                                                    "keyed_db": []})
                doc = state.to_json()  # the metadata file's edge: JSON from here on
                for kind in ("operator_state", "keyed_state", "keyed_db"):
                    if kind in doc:
                        files[kind].append(doc[kind])
                        handles.append(doc[kind])
                if state.keyed_db is not None:  # the files its manifest references: verified too
                    handles.extend(f.to_json() for f in state.keyed_db.files)
        by_head: dict[str, list[list[list[int]]]] = {}
        for (vertex, _), runs in pending.watermarks.items():
            by_head.setdefault(self.vertex_heads.get(vertex, f"vertex-{vertex}"), []).append(runs)
        watermarks = {head: WatermarkFloors.combine(runs, max_parallelism=self.max_parallelism)
                      .to_json() for head, runs in by_head.items()}
        channel_state = {key: h.to_json() for key, h in sorted(pending.channel_state.items())}
        coordinators = {name: h.to_json() for name, h in pending.coordinators.items()}
        handles.extend(coordinators.values())
        handles.extend(channel_state.values())
        return CheckpointMetadata(
            job=self.job_name, checkpoint_id=pending.checkpoint_id, attempt=self.attempt,
            trigger_ts_ms=pending.trigger_ts_ms, max_parallelism=self.max_parallelism,
            hash_version=HASH_VERSION,
            operators={name: OperatorFiles(tuple(files["operator_state"]),
                                           tuple(files["keyed_state"]), tuple(files["keyed_db"]))
                       for name, files in operators.items()},
            handles=tuple(handles), watermarks=watermarks,
            coordinators=coordinators, channel_state=channel_state,
            topology=self.topology if channel_state else None,
            rows=self._rows_before + pending.rows,
            state_backend="disk" if is_disk(self.config.state_backend) else "heap")

    def _discard_beyond_retention(self) -> None:
        while len(self.completed) > self.config.retained:
            oldest = self.completed.pop(0)
            if not oldest.is_savepoint:  # savepoints are never deleted automatically
                self._discard(oldest.checkpoint_id)
                self.shared_state.release(oldest.checkpoint_id)
        # Directories that could not be deleted before, or that a subtask still
        # writing into an aborted checkpoint created again after it was deleted:
        # whatever is below the newest completed checkpoint and neither kept nor
        # pending goes, so a long job's storage does not grow with them.
        kept = {c.checkpoint_id for c in self.completed} | set(self.pending)
        newest = self.completed[-1].checkpoint_id if self.completed else 0
        try:
            stale = {n for n in self.storage.checkpoint_dir_ids(self.job_key)
                     if n < newest and n not in kept}
        except OSError as exc:
            log.warning("could not list the checkpoints of %s: %s", self.job_name, exc)
            stale = set()
        for n in sorted(self._undeleted | stale):
            self._undeleted.discard(n)
            self._discard(n, again=True)
        self.shared_state.sweep(newest)

    def _discard(self, n: int, again: bool = False) -> None:
        try:
            self.storage.discard(self.job_key, n)
        except OSError as exc:
            self._undeleted.add(n)
            if again:
                log.warning("could not delete checkpoint %d: %s", n, exc)

    # -- restore ------------------------------------------------------------------------------
    def latest(self) -> CompletedCheckpoint | None:
        return self.completed[-1] if self.completed else None

    def completed_ids(self) -> list[int]:
        """The ids of the retained completed checkpoints (and stop savepoints), oldest first."""
        return [c.checkpoint_id for c in self.completed]

    def checkpoint_stats(self, n: int) -> CheckpointStats | None:
        """The history row of checkpoint ``n`` (None once forgotten)."""
        return self.history.get(n)

    def verified_restore_spec(self) -> RestoreSpec | None:
        """The restore spec of the newest completed checkpoint (or stop savepoint) whose
        files all verify.

        A corrupt one is skipped (and forgotten) in favour of an older one only if no
        output was committed for it, i.e. its completion was never notified: restoring
        older state would commit that output again. Otherwise this raises
        :class:`CorruptCheckpointError` naming the corrupt file.
        """
        while self.completed:
            latest = self.completed[-1]
            n = latest.checkpoint_id
            try:
                CheckpointStorage(latest.storage_uri).verified_metadata(latest.job_key, n)
                return latest.restore_spec()
            except CorruptCheckpointError as exc:
                if n <= self.committed_upto:
                    raise CorruptCheckpointError(
                        exc.path, f"{exc.reason}; output was committed up to checkpoint "
                                  f"{self.committed_upto} of {self.job_name}, so no older "
                                  f"checkpoint may replace {n}") from exc
                log.warning("checkpoint %d of %s is corrupt and committed nothing: restoring an "
                            "older one: %s", n, self.job_name, exc)
                self.completed.pop()
                self.history[n].corrupt(str(exc))
        if self.committed_upto:  # what committed it was discarded by retention
            raise RuntimeError(f"no completed checkpoint of {self.job_name} since checkpoint "
                               f"{self.committed_upto} (which committed output) verifies")
        return self.initial_restore

    def restore_spec(self) -> RestoreSpec | None:
        latest = self.latest()
        return latest.restore_spec() if latest is not None else None

    def restore_from(self, path: str) -> RestoreSpec:
        """The spec of a savepoint or retained checkpoint of another run, for a new job.

        Checkpoint ids of this job continue above the restored one.
        """
        storage_uri, key = locate_snapshot(path)
        skipped: list[CorruptCheckpointError] = []
        found = CheckpointStorage(storage_uri).latest_valid_checkpoint(key, skipped=skipped)
        if found is None:
            if skipped:  # name the damage, not just the absence
                raise skipped[0]
            raise FileNotFoundError(f"no complete savepoint or checkpoint under {path}")
        n, metadata = found[0], CheckpointMetadata.from_json(found[1])
        if metadata.max_parallelism != self.max_parallelism:
            raise ValueError(
                f"{path} was taken with max_parallelism {metadata.max_parallelism}; this job "
                f"has {self.max_parallelism}. Keyed state is partitioned into max_parallelism key "
                f"groups, so it cannot change: set StreamEnvironment(max_parallelism="
                f"{metadata.max_parallelism}).")
        if metadata.hash_version != HASH_VERSION:
            raise ValueError(f"{path} used key hash version {metadata.hash_version}; this "
                             f"raystream uses {HASH_VERSION}")
        if metadata.channel_state and metadata.topology != self.topology:
            raise ValueError(
                f"{path} is an unaligned checkpoint holding in-flight data (channel state) of "
                f"a job graph other than this one:\n{metadata.topology}\nthis job:\n"
                f"{self.topology}\nChannel state is not redistributed: restore it at the same "
                f"parallelism and job graph, or restore from a savepoint (always aligned).")
        self._last_id = max(self._last_id, n)
        self.initial_restore = restore_spec_of(n, metadata, storage_uri)
        return self.initial_restore

    def take_over(self, savepoint: CommittedSavepoint | None = None) -> RestoreSpec | None:
        """The job's master died and this coordinator is its successor's: the job's newest
        completed checkpoint becomes this coordinator's latest (retention covers it, and so
        does the registry of shared files) and is what the job restores — or ``savepoint``,
        the stop savepoint the dead master committed, if it is newer. None: the job has
        none.

        Whether the dead master notified its completion (and a sink committed its output)
        is unknown, so it is taken as notified: if it is corrupt, this raises
        :class:`CorruptCheckpointError` instead of going back past it. New checkpoint
        ids continue above every ``chk-<id>`` directory (see ``__init__``) and above
        ``savepoint``."""
        completed = set(self.storage.completed_checkpoint_ids(self.job_key))
        found = self.storage.latest_valid_checkpoint(self.job_key,
                                                     must_not_skip=completed.__contains__)
        location = None
        if savepoint is not None and (found is None or savepoint.checkpoint_id > found[0]):
            location, job_key = savepoint.location, SAVEPOINT_JOB_KEY
            storage = CheckpointStorage(location)
            found = savepoint.checkpoint_id, storage.verified_metadata(job_key,
                                                                       savepoint.checkpoint_id)
        elif found is None:
            return None
        else:
            storage, job_key = self.storage, self.job_key
        n, metadata = found[0], CheckpointMetadata.from_json(found[1])
        self._last_id = max(self._last_id, n)
        self.completed.append(CompletedCheckpoint(n, metadata, storage.uri, job_key))
        self.shared_state.register(n, metadata)
        self.history[n] = CheckpointStats(n, metadata.trigger_ts_ms, CheckpointStatus.COMPLETED,
                                          savepoint=location)
        self.committed_upto = n
        return self.completed[-1].restore_spec()

    def stats(self) -> list[CheckpointStats]:
        """The checkpoint history, oldest first (ids only grow: insertion order)."""
        return list(self.history.values())

    def _forget_old_history(self) -> None:
        """A long job keeps the newest ``HISTORY_RETAINED`` rows (Flink keeps a bounded
        history too); pending checkpoints are never forgotten."""
        excess = len(self.history) - HISTORY_RETAINED
        for n in [n for n in self.history if n not in self.pending][:max(excess, 0)]:
            del self.history[n]


def restore_spec_of(checkpoint_id: int, metadata: CheckpointMetadata,
                    storage_uri: str) -> RestoreSpec:
    return RestoreSpec(checkpoint_id, storage_uri,
                       {name: OperatorRestore(
                           [StateHandle.from_json(h) for h in files.operator_state],
                           [StateHandle.from_json(h) for h in files.keyed_state],
                           [IncrementalHandle.from_json(h) for h in files.keyed_db])
                        for name, files in metadata.operators.items()},
                       dict(metadata.watermarks),
                       {key: StateHandle.from_json(h) for key, h in metadata.channel_state.items()},
                       {name: StateHandle.from_json(h)
                        for name, h in metadata.coordinators.items()},
                       rows=metadata.rows)


def locate_snapshot(path: str) -> tuple[str, str]:
    """(storage URI, job key) of a savepoint directory or of a job's checkpoint directory."""
    path = path.rstrip("/")
    if CheckpointStorage(path).completed_checkpoint_ids(SAVEPOINT_JOB_KEY):
        return path, SAVEPOINT_JOB_KEY
    parent, _, key = path.rpartition("/")
    if not parent or not key:
        raise FileNotFoundError(f"{path} is neither a savepoint nor a job's checkpoint directory")
    return parent, key
