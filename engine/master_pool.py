"""The driver's warm job master: the next job's master process, started ahead.

A job master is a process of its own, and starting one (Python, Ray, pyarrow
and raystream imported) takes about a second of CPU: most of what a small
job waited before its first record. So a driver keeps one *warm* master,
started with no job as soon as the previous one was taken; the next job
hands it its :class:`~raystream.engine.job_options.MasterAssignment` with
``run`` (:meth:`WarmMasters.hand_over`), as the driver hands its pooled
subtask actors over (:mod:`~raystream.engine.actor_pool`).

* A warm master is named ``raystream/master/<hex>`` before its job is known;
  the job that takes it gets the id ``<name>-<hex>``
  (:func:`~raystream.engine.job_options.master_actor_name`).
* Ray restarts a warm master whenever its process dies, and retries the calls
  made to it: its job's restart strategy is applied by the successor, which
  fails a job that may not restart with the error its driver would have
  given, and takes over one that may.
* A warm master leaves its job with the driver's pool keeper before it starts
  it, and its successor learns the job there
  (:func:`~raystream.engine.actor_pool.assignment_of`); a master that died
  before had not started it, and Ray retries ``run`` on its successor.
* A detached job's master must outlive its driver, so it is created for its
  job as before (its assignment in its constructor's arguments), as is every
  master with ``RAYSTREAM_ACTOR_POOL=0``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import ray

from raystream.actors.resources import Resources
from raystream.engine import actor_pool
from raystream.engine.job_master import NAMESPACE, JobMaster, MasterAssignment
from raystream.engine.job_options import master_actor_name

MASTER_RESOURCES = Resources(num_cpus=0)
# a warm master is restarted whenever its process dies: its successor decides, by the
# job's restart strategy, whether the job restarts or fails
WARM_RESTARTS = {"max_restarts": -1, "max_task_retries": -1}


def new_job_id(name: str, warm: str | None = None) -> str:
    """The id of a job called ``name``: ``<name>-<hex>``, the hex of the warm master
    that runs it (a new one if none)."""
    return f"{name}-{warm or uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class WarmMaster:
    """A job master started with no job: the job that takes it gets the id
    ``<name>-<hex>``."""

    hex: str
    actor: Any


class WarmMasters:
    """The driver's side: one warm job master, taken by the next job and replaced."""

    def __init__(self) -> None:
        self._warm: WarmMaster | None = None
        self._ray_job: str | None = None

    def take(self, placement: Any) -> WarmMaster:
        """The warm master — one started now if there is none — after starting the next
        one, which warms meanwhile."""
        job = ray.get_runtime_context().get_job_id()
        warm = self._warm if self._ray_job == job else None  # (none after Ray restarted)
        self._warm, self._ray_job = self._start(placement), job
        return warm if warm is not None else self._start(placement)

    def hand_over(self, master: Any, assignment: MasterAssignment) -> None:
        """Give ``master`` (taken) its job; returns once it runs it."""
        ray.get(master.run.remote([ray.put(assignment)]))

    @staticmethod
    def _start(placement: Any) -> WarmMaster:
        hex_ = uuid.uuid4().hex[:8]
        actor_pool.POOL.keeper(placement)  # (created with the first master, if not yet)
        # (ray's typed remote() misses concurrency_groups, so pyright sees the plain class)
        master = JobMaster.options(  # pyright: ignore[reportAttributeAccessIssue]
            name=master_actor_name(new_job_id("", hex_)), namespace=NAMESPACE,
            scheduling_strategy=placement, **WARM_RESTARTS,
            **MASTER_RESOURCES.ray_options()).remote(None, actor_pool.POOL.keeper_name())
        return WarmMaster(hex_, master)


MASTERS = WarmMasters()
