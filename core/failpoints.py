"""Seeded failpoints: failures placed at named points of the runtime, for tests.

A job may carry failpoints (``StreamEnvironment(failpoints=[...])``). Each
fires once, in the attempt it names, at its ``hit``-th pass through the
point, in the subtask it names; it then either raises (the subtask fails like
a user-function error) or ends the worker process at once (like a crash).

Points: ``in_processing`` (a data batch), ``in_snapshot`` (synchronous
snapshot), ``in_async_write`` (background write), ``right_after_restore``,
``after_metadata_before_notify`` (coordinator, after the checkpoint is durable
and before anyone is told; it always raises, which fails the job over),
``mid_commit`` (a committer, between its files; the Kafka committer between
producing and committing its transaction), ``after_complete_before_commit``
(the Kafka committer: a checkpoint completed, its transaction not begun).
The job master's own: ``master_stopping`` (a stop savepoint is complete and
committed, the subtasks not stopped yet) and ``master_ended`` (the job is over
and its actors are handed back, its outcome not published yet) and
``master_published`` (the outcome published, the driver not told yet); ``exit`` ends
the master's process there, which Ray restarts (a successor takes the job over).

``final=True``: only in the snapshot (``in_snapshot``, ``in_async_write``) of
the final checkpoint, the one after every subtask's end of input (FLIP-147).

    >>> fp = Failpoint("in_processing", operator="map", subtask=1, hit=3)
    >>> [fp.matches("in_processing", "source -> map", 1, attempt=0) for _ in range(1)]
    [True]
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

POINTS = ("in_processing", "in_snapshot", "in_async_write", "right_after_restore",
          "after_metadata_before_notify", "mid_commit", "after_complete_before_commit",
          "master_stopping", "master_ended", "master_published")
MASTER_POINTS = ("master_stopping", "master_ended", "master_published")


class InjectedFailure(RuntimeError):
    """Raised by a failpoint with ``action="raise"``."""


@dataclass(frozen=True)
class Failpoint:
    point: str
    operator: str | None = None  # any operator of the chain; None: every chain
    subtask: int | None = None   # None: every subtask
    hit: int = 1                 # fire at this pass through the point
    attempt: int = 0             # only in this job attempt
    action: str = "exit"         # "exit" (process dies) or "raise"
    final: bool = False          # only in the final checkpoint's snapshot

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ValueError(f"unknown failpoint {self.point!r}; known: {', '.join(POINTS)}")
        if self.action not in ("exit", "raise"):
            raise ValueError("action must be 'exit' or 'raise'")
        if self.final and self.point not in ("in_snapshot", "in_async_write"):
            raise ValueError(f"final=True is for the snapshot points (in_snapshot, "
                             f"in_async_write), not {self.point!r}")

    def matches(self, point: str, chain: str, subtask: int | None, attempt: int, *,
                final: bool = False) -> bool:
        return (point == self.point and attempt == self.attempt and (final or not self.final)
                and (self.operator is None or self.operator in chain.split(" -> "))
                and (self.subtask is None or subtask == self.subtask))


class Failpoints:
    """The failpoints of one place (a subtask, the coordinator or the job master) in one
    attempt."""

    def __init__(self, failpoints: tuple[Failpoint, ...], chain: str, subtask: int | None,
                 attempt: int) -> None:
        self._armed = [f for f in failpoints if f.operator is None
                       or f.operator in chain.split(" -> ")]
        self._chain, self._subtask, self._attempt = chain, subtask, attempt
        self._hits: dict[Failpoint, int] = {}

    @classmethod
    def of_job_master(cls, failpoints: tuple[Failpoint, ...], attempt: int) -> Failpoints:
        """The job master's own points (:data:`MASTER_POINTS`) in ``attempt``."""
        return cls(tuple(f for f in failpoints if f.point in MASTER_POINTS), "job master", None,
                   attempt)

    @classmethod
    def of_coordinator(cls, failpoints: tuple[Failpoint, ...], attempt: int) -> Failpoints:
        """The checkpoint coordinator's point in ``attempt``. It always raises: ending the
        master's process would end the job, not fail it over."""
        return cls(tuple(dataclasses.replace(f, action="raise") for f in failpoints
                         if f.point == "after_metadata_before_notify"), "coordinator", None,
                   attempt)

    def hit(self, point: str, *, final: bool = False) -> None:
        """Pass through ``point`` (``final``: in the final checkpoint's snapshot)."""
        for fp in self._armed:
            if fp.matches(point, self._chain, self._subtask, self._attempt, final=final):
                count = self._hits.get(fp, 0) + 1
                self._hits[fp] = count
                if count == fp.hit:
                    if fp.action == "exit":
                        os._exit(17)
                    raise InjectedFailure(f"failpoint {point} in {self._chain}"
                                          f"[{self._subtask}] (attempt {self._attempt})")
