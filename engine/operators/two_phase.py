"""Exactly-once sinks in Flink's Sink V2 shape: a :class:`SinkWriter` and one :class:`Committer`.

``stream.sink_exactly_once(writer, committer)`` adds two operators:

* a writer operator at the stream's parallelism: it hands every batch to the
  :class:`SinkWriter`, and in ``prepare_snapshot_pre_barrier(n)`` asks it to
  finish what it wrote and give its *committables* (small JSON-able dicts:
  a file name, a transaction id), which it emits so they travel before
  barrier ``n``. At the end of input it does the same once more;
* a committer operator (parallelism 1, fed by every writer): its
  checkpointed state holds the committables not yet committed, grouped by
  the checkpoint whose snapshot first held them. When checkpoint ``n``
  completes it calls ``Committer.commit(incarnation, n, committables)`` once
  for everything pending up to ``n``. Restored from checkpoint ``k``, it
  first lets the committer drop what this incarnation committed above ``k``
  (output that will be produced again), then commits the restored
  committables under ``k`` again, skipping those already committed — so a
  checkpoint whose notification was lost is committed on restore.

Region failover (:mod:`raystream.engine.regions`): the committer is not part
of its writers' regions, so it keeps running (and committing) when one writer's
region restarts from checkpoint ``k``. Each committable travels with the
writer subtask and attempt that handed it over and the checkpoint it belongs
to; the committer then drops those of the writer's failed attempt that belong
to checkpoints after ``k`` (:meth:`CommitterOperator.upstream_restarted`):
the restored writer writes that output again, and nothing after ``k`` was
committed (``k`` is the newest completed checkpoint, and no later one
completes without the restored writer). What it handed over up to ``k`` is
in the committer's state of ``k`` (aligned: it came before barrier ``k``) and
stays, as do the other writers' committables of the checkpoints the failover
aborted: they are committed with the next completed one, since a commit takes
everything pending up to its checkpoint (Flink's ``CommitterOperator``).

A writer may leave the slow part of making its committables durable to the
subtask's snapshot thread (:meth:`SinkWriter.make_durable`), as a state file
is written there: the checkpoint is acknowledged only after it succeeded.

A commit must be idempotent per (incarnation, checkpoint id). The
incarnation is the run's job id (``<job name>-<8 hex>``): the same across
the failovers of a run, different for every run, also for two runs restored
from one savepoint. A run restored from another run's snapshot undoes what
that run committed after the snapshot and commits the snapshot's pending
committables that run had not committed, under its own incarnation (unless the
committer's output is each run's own: ``Committer.shared_output``). Without
checkpoints, everything is committed as checkpoint 0 when a bounded job ends,
and nothing if it fails.

A minimal sink that commits files by renaming them:

    >>> class Writer(SinkWriter):
    ...     def open(self, ctx): self.rows = []
    ...     def write(self, batch): self.rows.extend(batch.to_pylist())
    ...     def prepare_commit(self, checkpoint_id):
    ...         rows, self.rows = self.rows, []
    ...         return [{"id": f"{checkpoint_id}-{len(rows)}", "rows": rows}] if rows else []
    >>> class Printer(Committer):
    ...     def commit(self, incarnation, checkpoint_id, committables):
    ...         print(checkpoint_id, [c["id"] for c in committables])
    >>> # stream.sink_exactly_once(Writer(), Printer(), name="printer")
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from raystream.actors.operator import (CountsWrittenRows, Operator, OperatorSnapshot,
                                       RestoredState, RuntimeContext, SinkOperator)

log = logging.getLogger(__name__)

STATE_FORMAT = 1
_TRANSPORT = pa.schema([("checkpoint", pa.int64()), ("committable", pa.string()),
                        ("subtask", pa.int32()), ("attempt", pa.int32())])


@dataclass(frozen=True)
class Handed:
    """A committable as the committer holds it: from writer ``subtask``'s ``attempt``,
    for ``checkpoint`` (-1 and -1: restored, from before the restored checkpoint)."""

    committable: dict
    checkpoint: int
    subtask: int = -1
    attempt: int = -1


class SinkContext:
    """What a writer or committer knows of where it runs."""

    def __init__(self, operator: Operator) -> None:
        self._operator = operator

    @property
    def runtime(self) -> RuntimeContext:
        return self._operator.ctx

    @property
    def next_checkpoint_id(self) -> int:
        """The checkpoint that what is written now will belong to (a writer's context)."""
        if not isinstance(self._operator, SinkWriterOperator):
            raise TypeError(f"{self._operator.name}: only a sink writer writes for a checkpoint")
        return self._operator.last_checkpoint + 1

    def failpoint(self, point: str) -> None:
        """Pass through a named failpoint (tests place failures there)."""
        if self._operator.failpoints is not None:
            self._operator.failpoints.hit(point)


class SinkWriter:
    """Writes batches; gives its committables before every barrier."""

    # Batches without rows are not written, unless the writer keeps their schema (the
    # collect writer: a result without rows still has its columns).
    writes_empty_batches: bool = False

    def open(self, ctx: SinkContext) -> None:
        self.ctx = ctx

    def write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def prepare_commit(self, checkpoint_id: int | None) -> list[dict]:
        """Make what was written durable and return its committables (JSON-able dicts).

        ``checkpoint_id`` is None at the end of input.
        """
        raise NotImplementedError

    def make_durable(self) -> Callable[[], None] | None:
        """Called at every checkpoint's synchronous snapshot, after ``prepare_commit``: work
        that makes the committables handed over so far durable, run on the subtask's
        snapshot thread before the checkpoint is acknowledged (a failure declines the
        checkpoint; the next one must try again). None: nothing left to do."""
        return None

    def abort(self) -> None:
        """The subtask is going away: discard output that was never handed over."""


class Committer:
    """Makes committables visible, once, when their checkpoint completes."""

    # Output that outlives a run (files, a topic) is shared by the runs restored from one
    # another's snapshots: a run restored from another run's snapshot commits what that
    # run left pending and undoes what it committed after the snapshot. False: each run's
    # output is its own (collect: the job's result), and another run's is left alone.
    shared_output: bool = True

    def open(self, ctx: SinkContext) -> None:
        self.ctx = ctx

    def commit(self, incarnation: str, checkpoint_id: int, committables: list[dict]) -> None:
        """Commit as one unit; a second call for the same (incarnation, id) changes nothing."""
        raise NotImplementedError

    def committed_ids(self, incarnation: str) -> set[str]:
        """Ids (``committable_id``) of what this incarnation committed already."""
        return set()

    def truncate(self, incarnation: str, above: int) -> list[int]:
        """Undo this incarnation's commits of checkpoints above ``above``; return their ids."""
        return []

    def committable_id(self, committable: dict) -> str:
        return str(committable["id"])


class SinkWriterOperator(CountsWrittenRows, Operator):
    def __init__(self, name: str, writer: SinkWriter) -> None:
        super().__init__(name)
        self.writer = writer
        self.last_checkpoint = 0
        self.ended = False  # end of input: everything was handed over

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.last_checkpoint = restored.checkpoint_id if restored is not None else 0

    def open(self) -> None:
        self.writer.open(SinkContext(self))

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows or self.writer.writes_empty_batches:
            self.writer.write(batch)
            self.counted(batch)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        durable = self.writer.make_durable()
        return OperatorSnapshot(make_durable=durable) if durable is not None else None

    def _hand_over(self, checkpoint_id: int | None) -> None:
        committables = self.writer.prepare_commit(checkpoint_id)
        if committables:
            label = checkpoint_id if checkpoint_id is not None else self.last_checkpoint + 1
            n, ctx = len(committables), self.ctx
            self.output.emit(pa.RecordBatch.from_pydict({
                "checkpoint": [label] * n,
                "committable": [json.dumps(c, sort_keys=True) for c in committables],
                "subtask": [ctx.subtask_index] * n, "attempt": [ctx.attempt] * n},
                schema=_TRANSPORT))

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        if not self.ended:
            self._hand_over(checkpoint_id)  # the committables travel before barrier n
        self.last_checkpoint = max(self.last_checkpoint, checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.last_checkpoint = max(self.last_checkpoint, checkpoint_id)

    def finish(self) -> None:
        # End of input: hand over while the output channels are still open (the
        # final checkpoint's barrier comes after end-of-input on them).
        self._hand_over(None)
        self.ended = True

    def close(self) -> None:
        self.writer.abort()


class CommitterOperator(SinkOperator):
    def __init__(self, name: str, committer: Committer) -> None:
        super().__init__(name)
        self.committer = committer
        self.incarnation: str | None = None
        self.pending: dict[int, list[Handed]] = {}  # checkpoint id -> committables
        self.incoming: list[Handed] = []  # received since the last snapshot
        self.commits = 0  # commits made by this instance

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.committer.open(SinkContext(self))
        states = [json.loads(s) for s in (restored.operator_states if restored else []) if s]
        # Every run commits under its own incarnation: two runs restored from one
        # savepoint never take each other's commits for their own.
        self.incarnation = run_incarnation(self.ctx)
        if restored is None or not states:
            return
        for state in states:
            if state.get("format") != STATE_FORMAT:
                raise ValueError(f"{self.name}: unknown committer state format "
                                 f"{state.get('format')!r}")
        origin = states[0]["incarnation"]  # the run that took the snapshot (maybe this one)
        if origin != self.incarnation and not self.committer.shared_output:
            return  # what that run had pending is its own output, not this run's
        for state in states:
            for checkpoint_id, committables in state["pending"]:
                self.pending.setdefault(int(checkpoint_id), []).extend(
                    Handed(c, int(checkpoint_id)) for c in committables)
        k = restored.checkpoint_id
        # What the snapshot's run committed after it will be produced again from here.
        dropped = self.committer.truncate(origin, above=k)
        if dropped:
            log.warning("%s: restored checkpoint %d; undid newer commits %s of %s",
                        self.name, k, dropped, origin)
        done = self.committer.committed_ids(origin)
        if origin != self.incarnation:
            done |= self.committer.committed_ids(self.incarnation)
        for checkpoint_id in list(self.pending):
            left = [c for c in self.pending[checkpoint_id]
                    if self.committer.committable_id(c.committable) not in done]
            if left:
                self.pending[checkpoint_id] = left
            else:
                del self.pending[checkpoint_id]
        # Checkpoint k completed: what its state holds may be committed now
        # (its notification may never have arrived).
        self._commit_upto(k)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.incoming.extend(
            Handed(json.loads(c), n, subtask, attempt) for c, n, subtask, attempt in zip(
                *(batch.column(name).to_pylist()
                  for name in ("committable", "checkpoint", "subtask", "attempt"))))

    def upstream_restarted(self, upstream: int, attempt: int, checkpoint_id: int) -> None:
        # (module doc) what the writer's older attempts handed over for later checkpoints
        # is written again by ``attempt``; up to ``checkpoint_id`` it stays
        def kept(c: Handed) -> bool:
            return not (c.subtask == upstream and c.attempt < attempt
                        and c.checkpoint > checkpoint_id)
        self.incoming = [c for c in self.incoming if kept(c)]
        for n in list(self.pending):
            self.pending[n] = [c for c in self.pending[n] if kept(c)]
            if not self.pending[n]:
                del self.pending[n]

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        if self.incoming:
            self.pending.setdefault(checkpoint_id, []).extend(self.incoming)
            self.incoming = []
        data = json.dumps({"format": STATE_FORMAT, "incarnation": self.incarnation,
                           "pending": [[c, [h.committable for h in items]]
                                       for c, items in sorted(self.pending.items())]},
                          sort_keys=True, separators=(",", ":")).encode()
        return OperatorSnapshot(operator_state=lambda: data)  # serialized now: consistent

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit_upto(checkpoint_id)

    def finish(self) -> None:
        if not self.ctx.checkpointing:  # a bounded job without checkpoints commits at its end
            if self.incoming:
                self.pending.setdefault(0, []).extend(self.incoming)
                self.incoming = []
            self._commit_upto(0)

    def _commit_upto(self, checkpoint_id: int) -> None:
        ids = sorted(c for c in self.pending if c <= checkpoint_id)
        if not ids:
            return
        if self.incarnation is None:
            raise RuntimeError(f"{self.name}: a commit before its state was initialized")
        self.committer.commit(self.incarnation, checkpoint_id,
                              [c.committable for i in ids for c in self.pending[i]])
        self.commits += 1
        for i in ids:
            del self.pending[i]


def run_incarnation(ctx: RuntimeContext) -> str:
    """The commit-log incarnation of the run ``ctx`` belongs to: its job id, made
    path-safe (``<job name>-<8 hex>``); for an operator run by hand, a new one."""
    return incarnation_of(ctx.job_id) if ctx.job_id else new_incarnation(ctx.job_name)


def incarnation_of(job_id: str) -> str:
    """The commit-log incarnation of the run with job id ``job_id``."""
    return _path_safe(job_id)


def new_incarnation(job_name: str) -> str:
    """``<job name, made path-safe>-<12 random hex digits>``."""
    return f"{_path_safe(job_name)}-{uuid.uuid4().hex[:12]}"


def _path_safe(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "job"
    return safe if safe[0].isalnum() else "j" + safe
