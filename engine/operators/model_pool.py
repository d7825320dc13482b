"""The Ray actors of one ``map_batches`` subtask's model pool: they are started, fed
batches by object ref, resized between a minimum and a maximum, and replaced when they
die (see :mod:`raystream.engine.operators.pool_map` for the operator around it).

Each actor (:class:`~raystream.engine.operators.pool_worker.PoolWorker`) is a Ray actor of
its own with the resources asked for (``num_cpus``, ``num_gpus``, custom ones): on a
cluster with an autoscaler, an actor that fits no node is a resource request that adds
one. Its owner is the subtask's process, so it dies with the subtask (a failover starts
the pool anew) and is killed when the subtask closes.

An actor is ``STARTING`` until its model is built (its ``ready`` call returned), then
``READY``: it is sent at most ``per_actor`` batches at a time (one being computed, the
next ones already transferred), in the order they were submitted. Batches no actor can
take yet wait in the pool's queue. The pool grows by one actor whenever batches wait,
every actor is busy and none is starting (Ray Data's actor pool does the same), up to
``size.max``; an actor idle for ``idle_timeout_s`` is stopped while more than
``size.min`` run. An actor that dies (a SIGKILL, its node lost) is replaced at once and
the batches it had are sent again, first: each batch's result is taken once, from the
call that returned it. A model whose constructor raises fails the job (restarting it
would raise again); so does an actor dying ``MAX_DEATHS_IN_A_ROW`` times with no batch
completed in between.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pyarrow as pa
import ray
from ray.exceptions import RayActorError, RayTaskError

from raystream.engine.errors import RaystreamError
from raystream.engine.operators.pool_worker import BatchResult, ModelSpec, PoolWorker

MAX_DEATHS_IN_A_ROW = 3
_LATENCY_WINDOW = 100  # batches the mean latency is taken over


class PoolFailedError(RaystreamError):
    """A model pool's actors keep dying before they complete a batch."""


class ActorPhase(Enum):
    """Where one pool actor is (its transitions are in :data:`_TRANSITIONS`)."""

    STARTING = "starting"  # created; its model is being built
    READY = "ready"  # takes batches
    GONE = "gone"  # died, or stopped (the pool shrank or closed)


_TRANSITIONS = {ActorPhase.STARTING: {ActorPhase.READY, ActorPhase.GONE},
                ActorPhase.READY: {ActorPhase.GONE}, ActorPhase.GONE: set()}


@dataclass(frozen=True)
class PoolSize:
    """How many actors a pool has: at least ``min``, at most ``max``.

        >>> PoolSize.of(4), PoolSize.of((1, 3))
        (PoolSize(min=4, max=4), PoolSize(min=1, max=3))
    """

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"concurrency needs 1 <= min <= max, got ({self.min}, {self.max})")

    @classmethod
    def of(cls, concurrency: int | tuple[int, int]) -> "PoolSize":
        """``concurrency`` as ``map_batches`` takes it: a fixed size, or ``(min, max)``."""
        if isinstance(concurrency, int):
            return cls(concurrency, concurrency)
        low, high = concurrency
        return cls(low, high)


@dataclass(frozen=True)
class _Call:
    entry: int
    batch: Any  # the input's ObjectRef (the subtask owns it until the result is taken)
    rows: int


@dataclass
class _Actor:
    handle: Any
    ready_ref: Any
    phase: ActorPhase = ActorPhase.STARTING
    calls: dict[Any, _Call] = field(default_factory=dict)  # result ref -> its call
    sent_at: dict[Any, float] = field(default_factory=dict)  # result ref -> monotonic s
    idle_since: float = field(default_factory=time.monotonic)

    def move(self, phase: ActorPhase) -> None:
        if phase not in _TRANSITIONS[self.phase]:
            raise AssertionError(f"pool actor: no transition {self.phase} -> {phase}")
        self.phase = phase


@dataclass(frozen=True)
class Completed:
    """A batch's call returned: its output, or what the model raised."""

    entry: int
    batches: list[pa.RecordBatch] | None = None
    error: BaseException | None = None


class ModelPool:
    """The actors of one subtask's pool (see the module docs)."""

    def __init__(self, where: str, spec: ModelSpec, size: PoolSize, *,
                 actor_options: dict[str, Any], per_actor: int = 2,
                 idle_timeout_s: float = 10.0) -> None:
        self.where, self.spec, self.size = where, spec, size
        self.per_actor, self.idle_timeout_s = per_actor, idle_timeout_s
        self._remote = ray.remote(PoolWorker).options(
            max_restarts=0, max_task_retries=0, **actor_options)  # replaced by the pool
        self._actors: list[_Actor] = []
        self._waiting: deque[_Call] = deque()
        self._deaths_in_a_row = 0
        # figures for the operator's metrics
        self.replaced = self.batches_done = 0
        self.busy_s = 0.0
        self.peak = 0
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)

    # -- actors ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the pool's minimum of actors (each builds its model meanwhile)."""
        while len(self._actors) < self.size.min:
            self._start_actor()

    def _start_actor(self) -> None:
        handle = self._remote.remote(self.spec, self.where)
        self._actors.append(_Actor(handle, handle.ready.remote()))
        self.peak = max(self.peak, len(self._actors))

    def _stop_actor(self, actor: _Actor) -> None:
        actor.move(ActorPhase.GONE)
        self._actors.remove(actor)
        ray.kill(actor.handle, no_restart=True)

    def _died(self, actor: _Actor, cause: BaseException) -> None:
        """``actor`` died: its batches go first in the queue, in order, to whichever
        actor is free next; a new actor replaces it."""
        self._stop_actor(actor)
        self._waiting.extendleft(sorted(actor.calls.values(), key=lambda c: c.entry,
                                        reverse=True))
        self.replaced += 1
        self._deaths_in_a_row += 1
        if self._deaths_in_a_row > MAX_DEATHS_IN_A_ROW:
            raise PoolFailedError(
                f"{self.where}: its pool actors died {self._deaths_in_a_row} times in a "
                f"row without completing a batch; the last: {type(cause).__name__}: {cause}")
        self._start_actor()

    def stop(self) -> None:
        """Kill every actor of the pool (the subtask closes)."""
        for actor in list(self._actors):
            self._stop_actor(actor)
        self._waiting.clear()

    # -- batches -----------------------------------------------------------------------
    def submit(self, entry: int, batch: pa.RecordBatch) -> None:
        """Compute ``batch`` (the operator's queue entry ``entry``) on some actor."""
        self._waiting.append(_Call(entry, ray.put(batch), batch.num_rows))
        self._dispatch()

    def poll(self, timeout_s: float) -> list[Completed]:
        """The calls that returned, waiting up to ``timeout_s`` for one; actors that
        became ready take batches, dead ones are replaced, the pool resized."""
        refs = [a.ready_ref for a in self._actors if a.phase is ActorPhase.STARTING]
        refs += [ref for a in self._actors for ref in a.calls]
        done: list[Completed] = []
        if refs:
            first, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
            if first:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in ready:
                    done.extend(self._returned(ref))
        self._resize()
        self._dispatch()
        return done

    def _returned(self, ref: Any) -> list[Completed]:
        actor = next((a for a in self._actors if a.ready_ref == ref or ref in a.calls), None)
        if actor is None:  # its actor died (another of its refs told) and was replaced
            return []
        if ref == actor.ready_ref and actor.phase is ActorPhase.STARTING:
            try:
                ray.get(ref)
            except RayTaskError as exc:  # the model's constructor raised: so would a new one
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                cause.add_note(f"{self.where}: raised by the model's constructor "
                               f"{self.spec.model.__name__}(...) in a pool actor")
                raise cause from None
            except RayActorError as exc:
                self._died(actor, exc)
                return []
            actor.move(ActorPhase.READY)
            actor.idle_since = time.monotonic()
            return []
        call, sent = actor.calls.pop(ref), actor.sent_at.pop(ref)
        if not actor.calls:
            actor.idle_since = time.monotonic()
        try:
            result: BatchResult = ray.get(ref)
        except RayTaskError as exc:  # the model (or its output) raised: the job's error
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            return [Completed(call.entry, error=cause)]
        except RayActorError as exc:
            actor.calls[ref] = call  # re-sent with the actor's others
            self._died(actor, exc)
            return []
        self._deaths_in_a_row = 0
        self.batches_done += 1
        self.busy_s += result.busy_s
        self._latencies.append(time.monotonic() - sent)
        return [Completed(call.entry, batches=result.batches)]

    def _dispatch(self) -> None:
        """Send waiting batches, in order, to the least loaded ready actors."""
        while self._waiting:
            ready = [a for a in self._actors
                     if a.phase is ActorPhase.READY and len(a.calls) < self.per_actor]
            if not ready:
                return
            actor = min(ready, key=lambda a: len(a.calls))
            call = self._waiting.popleft()
            ref = actor.handle.call.remote(call.batch)
            actor.calls[ref] = call
            actor.sent_at[ref] = time.monotonic()

    def _resize(self) -> None:
        """Grow by one when batches wait for a busy pool; stop an actor idle too long."""
        starting = any(a.phase is ActorPhase.STARTING for a in self._actors)
        if self._waiting and not starting and len(self._actors) < self.size.max:
            self._start_actor()
            return
        now = time.monotonic()
        for actor in list(self._actors):
            if (len(self._actors) > self.size.min and not self._waiting
                    and actor.phase is ActorPhase.READY and not actor.calls
                    and now - actor.idle_since >= self.idle_timeout_s):
                self._stop_actor(actor)

    # -- what it reports ---------------------------------------------------------------
    def can_shrink(self) -> bool:
        """Whether the pool has more actors than its minimum (it shrinks when idle)."""
        return len(self._actors) > self.size.min

    def metrics(self) -> dict[str, float]:
        latencies = self._latencies
        return {"pool_size": float(len(self._actors)),
                "pool_ready": float(sum(a.phase is ActorPhase.READY for a in self._actors)),
                "pool_size_peak": float(self.peak),
                "pool_queue": float(len(self._waiting)),
                "pool_sent": float(sum(len(a.calls) for a in self._actors)),
                "pool_busy_s": self.busy_s,
                "pool_batches": float(self.batches_done),
                "pool_batch_latency_ms": (1000 * sum(latencies) / len(latencies)
                                          if latencies else 0.0),
                "pool_actors_replaced": float(self.replaced)}

    def describe(self) -> str:
        """The pool in a few words (what a job that does not finish waits for)."""
        ready = sum(a.phase is ActorPhase.READY for a in self._actors)
        return (f"{len(self._waiting)} batches queued, "
                f"{sum(len(a.calls) for a in self._actors)} sent, {ready} of "
                f"{len(self._actors)} pool actors ready (a starting actor may wait for Ray "
                f"to find the resources it asked for)")
