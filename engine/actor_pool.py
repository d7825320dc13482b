"""Idle subtask processes kept between the jobs of one driver.

A subtask actor is a process that has imported Ray, pyarrow, pandas and
raystream: about two seconds of CPU before it can host a subtask, several
times what a small job then runs. Flink keeps its TaskManagers between the
jobs of a session cluster; likewise a driver keeps up to ``max_idle`` idle
subtask actors between its jobs:

* :meth:`SubtaskActorPool.lease` (in the driver, when a job is submitted)
  takes idle actors from the driver's :class:`_Keeper`, which starts new ones
  for the rest. The keeper created them and holds them, so they outlive each
  job master (an actor dies with the process that created it, or when no
  handle to it is left) and end with the driver, which owns the keeper.
* The job master asks the keeper (a named actor) for the actors leased to its
  job — and so does a master Ray restarted, which must stop the subtasks its
  predecessor ran on them. (Handles in the master's constructor arguments
  would put those arguments in the object store, where a restart may not
  find them.) It hosts its first attempt's subtasks on them (``host``,
  as on a failover), after checking that each is alive: an actor that died
  while idle (a test's SIGKILL, a lost node) is replaced, not counted as a
  failure of the job.
* When the job ends, its master gives the actors whose subtask has ended
  back to the keeper, which keeps ``max_idle`` of them and kills the rest;
  the others are killed.

The keeper also holds what the driver's warm job masters run
(:mod:`~raystream.engine.master_pool`): a warm master notes its job there
before it starts it (:func:`remember_assignment`), and its successor, after
Ray restarted it, learns the job there (:func:`assignment_of`), as a master
created for its job has it in its constructor's arguments. The driver tells
the keeper to forget it (:func:`forget_assignment`) only once it has the job's
outcome and has ended the master, so a successor always learns the job: to run
it on, or to answer the driver's retried call with the outcome its predecessor
published (a master killed just after publishing it had left a successor with
no job, and the driver's call waiting on it forever).

Only subtasks with the default resources run on pooled actors; a vertex that
asks for CPUs, memory or accelerators gets actors of its own, as before.
``RAYSTREAM_ACTOR_POOL=0`` turns pooling off (every job starts its own).
"""

from __future__ import annotations

import os
from typing import Any

import ray
import ray.exceptions

from raystream.actors.subtask_actor import SubtaskActor
from raystream.actors.resources import Resources
from raystream.engine.deployment import NAMESPACE, SUBTASK_SCHEDULING

MAX_IDLE = 8  # idle subtask actors a driver keeps between jobs


def _new_actor() -> Any:
    # (ray's typed remote() misses concurrency_groups, so pyright sees the plain class)
    return SubtaskActor.options(  # pyright: ignore[reportAttributeAccessIssue]
        namespace=NAMESPACE, scheduling_strategy=SUBTASK_SCHEDULING,
        **Resources().ray_options()).remote(None)


@ray.remote(num_cpus=0, max_restarts=0)
class _Keeper:
    """Owns the pooled actors of one driver (it created them, so they live as long as it
    holds them: beyond the job master that used them, and no longer than the driver) and
    keeps the idle ones."""

    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self.idle: list[Any] = []
        self.owned: dict[str, Any] = {}  # actor id -> handle, idle or leased to a job
        self.leases: dict[str, list[Any]] = {}  # job id -> the actors leased to it
        # warm job master's actor name -> (job id, [ref to its MasterAssignment]): the ref in
        # a list, so that it is held here (the assignment stays in the object store, for
        # the master's successor) and not fetched
        self.assignments: dict[str, tuple[str, list[Any]]] = {}

    def lease(self, n: int, job_id: str) -> list[Any]:
        """``n`` actors for ``job_id``: idle ones first, new ones for the rest."""
        taken, self.idle = self.idle[:n], self.idle[n:]
        while len(taken) < n:
            actor = _new_actor()
            self.owned[actor._actor_id.hex()] = actor
            taken.append(actor)
        self.leases[job_id] = taken
        return taken

    def lease_idle(self, job_id: str) -> list[Any]:
        """One more idle actor for ``job_id`` (its warm spare after a failover used the
        last), or none: never a new one, whose start would compete with the recovery."""
        if not self.idle:
            return []
        actor = self.idle.pop()
        self.leases.setdefault(job_id, []).append(actor)
        return [actor]

    def leased(self, job_id: str) -> list[Any]:
        """The actors leased to ``job_id`` (and not given back)."""
        return list(self.leases.get(job_id, ()))

    def give_back(self, job_id: str, actors: list[Any], gone: list[str]) -> None:
        """A job ended: ``actors`` are idle again; the actors ``gone`` (ids) died or were
        killed, and are forgotten. Beyond ``max_idle``, the oldest idle ones are killed."""
        self.leases.pop(job_id, None)
        for actor_id in gone:
            self.owned.pop(actor_id, None)
        self.idle.extend(actors)
        while len(self.idle) > self.max_idle:
            actor = self.idle.pop(0)
            self.owned.pop(actor._actor_id.hex(), None)
            try:
                ray.kill(actor)
            except Exception:  # already gone
                pass

    def assign(self, master: str, job_id: str, assignment: list[Any]) -> None:
        """The warm job master named ``master`` is about to run ``job_id``."""
        self.assignments[master] = (job_id, assignment)

    def assignment(self, master: str) -> list[Any]:
        """What ``assign`` was told for ``master`` (empty if nothing, or its job ended)."""
        return self.assignments.get(master, ("", []))[1]

    def forget(self, master: str) -> None:
        """The driver has the outcome of the job of ``master`` and has ended it: no
        successor of ``master`` will be asked for it. (Not at ``give_back``, nor when the
        outcome is published: a master that dies before its driver has the outcome has
        a successor, which must learn the job to end it or to answer with its outcome.)"""
        self.assignments.pop(master, None)

    def sizes(self) -> tuple[int, int]:
        """(idle, owned): for tests and diagnostics."""
        return len(self.idle), len(self.owned)


class SubtaskActorPool:
    """The driver's side: lease actors for a job from its keeper."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._keeper: Any = None
        self._ray_job: str | None = None

    @staticmethod
    def enabled() -> bool:
        return os.environ.get("RAYSTREAM_ACTOR_POOL", "1") not in ("0", "false", "no")

    def keeper(self, placement: Any = None) -> Any:
        """This driver's keeper (a new one after Ray was restarted, or after it was lost).

        ``placement``: its scheduling strategy. The driver puts it on the head node: the
        pooled actors share its fate (it owns them), so it must not sit on a worker node
        that may be lost."""
        job = ray.get_runtime_context().get_job_id()
        if self._keeper is None or self._ray_job != job:
            self._keeper = _Keeper.options(
                name=keeper_name(job, os.getpid()), namespace=NAMESPACE,
                scheduling_strategy=placement).remote(self.max_idle)
            self._ray_job = job
        return self._keeper

    def keeper_name(self) -> str | None:
        """The actor name of this driver's keeper (None before it has one)."""
        return None if self._ray_job is None else keeper_name(self._ray_job, os.getpid())

    def lease(self, n: int, job_id: str, placement: Any = None) -> list[Any]:
        """``n`` subtask actors with the default resources for ``job_id`` (none if
        pooling is off)."""
        if n <= 0 or not self.enabled():
            return []
        try:
            return ray.get(self.keeper(placement).lease.remote(n, job_id))
        except ray.exceptions.RayActorError:  # the keeper was lost (and its actors with it)
            self._keeper = None
            return ray.get(self.keeper(placement).lease.remote(n, job_id))


def remember_assignment(keeper: str, master: str, job_id: str, held: list[Any]) -> None:
    """Tell the keeper that the warm job master named ``master`` runs ``job_id``, of the
    ``MasterAssignment`` in ``held`` (a list holding its ref)."""
    ray.get(ray.get_actor(keeper, namespace=NAMESPACE).assign.remote(master, job_id, held))


def assignment_of(keeper: str, master: str) -> Any:
    """The ``MasterAssignment`` the driver gave the warm job master named ``master``
    (None if none, or the keeper is gone: with its driver, which owned the master)."""
    try:
        held = ray.get(ray.get_actor(keeper, namespace=NAMESPACE).assignment.remote(master))
    except (ValueError, ray.exceptions.RayActorError):
        return None
    return ray.get(held[0]) if held else None


def forget_assignment(keeper: str, master: str) -> None:
    """Tell the keeper that the job of the warm job master named ``master`` is over (a
    no-op if the keeper is gone)."""
    try:
        ray.get_actor(keeper, namespace=NAMESPACE).forget.remote(master)
    except ValueError:
        pass


def keeper_name(ray_job_id: str, pid: int) -> str:
    return f"raystream/pool-keeper/{ray_job_id}/{pid}"


POOL = SubtaskActorPool()
