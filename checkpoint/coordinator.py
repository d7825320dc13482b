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

Output committed by a checkpoint (a collect sink's batches) is listed in the
metadata, cumulatively: restoring checkpoint ``n`` restores exactly the
output committed up to ``n``.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from raystream.actors.messages import Barrier
from raystream.actors.subtask_checkpoints import OperatorRestore, RestoreSpec
from raystream.checkpoint.config import CheckpointConfig
from raystream.checkpoint.keygroups import HASH_VERSION
from raystream.engine.failpoints import Failpoints

log = logging.getLogger(__name__)

SubtaskKey = tuple[int, int]  # (vertex id, subtask index)


class TooManyCheckpointFailures(RuntimeError):
    """More checkpoints failed in a row than ``tolerable_failures``: the job fails over."""


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    trigger_ts_ms: int
    started: float
    waiting: set[SubtaskKey]
    written: dict[SubtaskKey, dict] = field(default_factory=dict)
    size: int = 0
    final: bool = False


@dataclass
class CheckpointStats:
    """One row of a job's checkpoint history."""

    checkpoint_id: int
    trigger_ts_ms: int
    status: str  # "PENDING" | "COMPLETED" | "ABORTED"
    duration_s: float = 0.0
    size: int = 0
    reason: str = ""


class CheckpointCoordinator:
    def __init__(self, *, config: CheckpointConfig, job_key: str, job_name: str,
                 subtasks: list[SubtaskKey], max_parallelism: int,
                 send_trigger: Callable[[Barrier], None],
                 notify_complete: Callable[[int], None],
                 notify_aborted: Callable[[int], None],
                 failpoints: Failpoints) -> None:
        from raystream.checkpoint.storage import CheckpointStorage

        self.config = config
        self.storage = CheckpointStorage(config.storage)
        self.job_key, self.job_name = job_key, job_name
        self.subtasks = list(subtasks)
        self.max_parallelism = max_parallelism
        self._send_trigger = send_trigger
        self._notify_complete = notify_complete
        self._notify_aborted = notify_aborted
        self.failpoints = failpoints
        self.attempt = 0
        self.pending: dict[int, PendingCheckpoint] = {}
        self.completed: list[tuple[int, dict]] = []  # (id, metadata), oldest first
        self.history: dict[int, CheckpointStats] = {}
        self.failures_in_a_row = 0
        self._last_id = self.storage.highest_checkpoint_id(job_key)
        self._last_trigger = time.monotonic()
        self._last_completion = float("-inf")  # min_pause never delays the first checkpoint
        self.final_checkpoint: int | None = None

    # -- triggering ------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Called often by the master: periodic trigger and timeouts."""
        for n, pending in list(self.pending.items()):
            if now - pending.started > self.config.timeout_s:
                self.abort(n, f"timed out after {self.config.timeout_s:g} s")
        if (self.final_checkpoint is None and len(self.pending) < self.config.max_concurrent
                and now - self._last_trigger >= self.config.interval_s
                and now - self._last_completion >= self.config.min_pause_s):
            self.trigger()

    def trigger(self, *, final: bool = False) -> int:
        self._last_id += 1
        n = self._last_id
        now = time.monotonic()
        self._last_trigger = now
        ts = int(time.time() * 1000)
        self.pending[n] = PendingCheckpoint(n, ts, now, set(self.subtasks), final=final)
        self.history[n] = CheckpointStats(n, ts, "PENDING")
        if final:
            self.final_checkpoint = n
        self._send_trigger(Barrier(n, self.attempt, ts))
        return n

    # -- acknowledgements -------------------------------------------------------------------
    def acknowledge(self, attempt: int, n: int, subtask: SubtaskKey, written: dict,
                    stats: dict) -> None:
        pending = self.pending.get(n)
        if attempt != self.attempt or pending is None or subtask not in pending.waiting:
            return  # late: aborted, subsumed or of an older attempt
        pending.waiting.discard(subtask)
        pending.written[subtask] = written
        pending.size += int(stats.get("size", 0))
        if not pending.waiting:
            self._complete(pending)

    def decline(self, attempt: int, n: int, subtask: SubtaskKey, reason: str) -> None:
        if attempt == self.attempt and n in self.pending:
            self.abort(n, f"declined by subtask {subtask}: {reason}")

    def abort(self, n: int, reason: str, *, failed: bool = True) -> None:
        """Abort pending checkpoint ``n``. A *failed* one (declined, timed out,
        not writable) counts toward ``tolerable_failures``; a subsumed one or
        one cut short by a failover does not."""
        pending = self.pending.pop(n, None)
        if pending is None:
            return
        stats = self.history[n]
        stats.status, stats.reason = "ABORTED", reason
        stats.duration_s = time.monotonic() - pending.started
        if pending.final:
            self.final_checkpoint = None  # the master triggers another final checkpoint
        log.warning("checkpoint %d of %s aborted: %s", n, self.job_name, reason)
        self._notify_aborted(n)
        if failed:
            self.failures_in_a_row += 1
            if self.failures_in_a_row > self.config.tolerable_failures:
                raise TooManyCheckpointFailures(
                    f"{self.failures_in_a_row} checkpoints failed in a row (tolerable: "
                    f"{self.config.tolerable_failures}); the last: {reason}")

    def abort_all(self, reason: str) -> None:
        for n in sorted(self.pending):
            self.abort(n, reason, failed=False)

    # -- completion ---------------------------------------------------------------------------
    def _complete(self, pending: PendingCheckpoint) -> None:
        n = pending.checkpoint_id
        metadata = self._metadata(pending)
        try:
            self.storage.write_metadata(self.job_key, n, metadata)
        except Exception as exc:
            self.abort(n, f"metadata could not be written: {type(exc).__name__}: {exc}")
            return
        del self.pending[n]
        self.completed.append((n, metadata))
        stats = self.history[n]
        stats.status, stats.size = "COMPLETED", pending.size
        stats.duration_s = time.monotonic() - pending.started
        self._last_completion = time.monotonic()
        self.failures_in_a_row = 0
        for older in [m for m in self.pending if m < n]:
            self.abort(older, f"subsumed by checkpoint {n}", failed=False)
        self._discard_beyond_retention()
        self.failpoints.hit("after_metadata_before_notify")
        self._notify_complete(n)

    def _metadata(self, pending: PendingCheckpoint) -> dict:
        operators: dict[str, dict[str, list]] = {}
        committed = copy.deepcopy(self.completed[-1][1]["committed"]) if self.completed else {}
        handles = []
        for subtask in sorted(pending.written):
            for name, entry in pending.written[subtask].items():
                files = operators.setdefault(name, {"operator_state": [], "keyed_state": []})
                for kind in ("operator_state", "keyed_state"):
                    if kind in entry:
                        files[kind].append(entry[kind])
                        handles.append(entry[kind])
                known = {h["path"] for h in committed.get(name, [])}
                for handle in entry.get("committables", []):
                    if handle["path"] not in known:  # an origin offered again: commit once
                        committed.setdefault(name, []).append(handle)
                        known.add(handle["path"])
        return {"job": self.job_name, "checkpoint_id": pending.checkpoint_id,
                "attempt": self.attempt, "trigger_ts_ms": pending.trigger_ts_ms,
                "max_parallelism": self.max_parallelism, "hash_version": HASH_VERSION,
                "operators": operators, "committed": committed, "handles": handles}

    def _discard_beyond_retention(self) -> None:
        while len(self.completed) > self.config.retained:
            n, _ = self.completed.pop(0)
            try:
                self.storage.discard(self.job_key, n)
            except OSError as exc:
                log.warning("could not delete checkpoint %d: %s", n, exc)

    # -- restore ------------------------------------------------------------------------------
    def latest(self) -> tuple[int, dict] | None:
        return self.completed[-1] if self.completed else None

    def verified_restore_spec(self) -> RestoreSpec | None:
        """The restore spec of the newest checkpoint whose files all verify.

        A corrupt newer checkpoint is skipped in favour of an older one (its
        collect-sink output was committed only in its own metadata, so falling
        back re-commits nothing twice); a skipped checkpoint is forgotten.
        """
        if not self.completed:
            return None
        found = self.storage.latest_valid_checkpoint(self.job_key)
        if found is None:
            raise RuntimeError(f"no completed checkpoint of {self.job_name} verifies in "
                               f"{self.config.storage}")
        n = found[0]
        skipped = [m for m, _ in self.completed if m > n]
        if skipped:
            log.warning("checkpoints %s of %s are corrupt: restoring %d", skipped,
                        self.job_name, n)
            self.completed = [(m, md) for m, md in self.completed if m <= n]
            for m in skipped:
                self.history[m].status, self.history[m].reason = "CORRUPT", "failed verification"
        return self.restore_spec()

    def restore_spec(self) -> RestoreSpec | None:
        latest = self.latest()
        if latest is None:
            return None
        n, metadata = latest
        return RestoreSpec(n, {name: OperatorRestore(files["operator_state"], files["keyed_state"])
                               for name, files in metadata["operators"].items()})

    def committed_outputs(self) -> dict[str, list[dict]]:
        """Committable handles of every sink, as of the latest completed checkpoint."""
        latest = self.latest()
        return latest[1]["committed"] if latest else {}

    def stats(self) -> list[CheckpointStats]:
        return [self.history[n] for n in sorted(self.history)]
