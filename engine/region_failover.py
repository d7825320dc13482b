"""Whether a failure restarts a region or the whole job (no Ray here).

The job master asks :class:`RegionFailover` at every failure, telling it what it
knows of the job then (:class:`Circumstances`). A region restarts alone only when
nothing is in doubt (docs/architecture.md, Failover); the answer is a
:class:`Verdict`: the region, or why the whole job restarts.

A region restart is a protocol of its own, with one :class:`Phase`, changed only
through :data:`TRANSITIONS`:

===========  =================================================  ===========
from         event                                              to
===========  =================================================  ===========
STEADY       a region was redeployed                            RESTARTING
RESTARTING   a checkpoint completed (the region took part)      STEADY
RESTARTING   the whole job was redeployed                       STEADY
STEADY       the whole job was redeployed                       STEADY
===========  =================================================  ===========

While RESTARTING, every failure restarts the whole job: the region's restart
itself failed, or something failed before the job was consistent again.

    >>> from raystream.engine.regions import Regions
    >>> regions = Regions((frozenset({(0, 0)}), frozenset({(0, 1)}), frozenset({(1, 0)})),
    ...                   committers=frozenset({(1, 0)}))
    >>> failover = RegionFailover(regions, FailoverStrategy.REGION)
    >>> calm = Circumstances(aligned=True, draining=False, latest_is_savepoint=False,
    ...                      coordinators_reset=True, finished=frozenset())
    >>> failover.verdict((0, 1), calm)
    Verdict(region=frozenset({(0, 1)}), reason='')
    >>> failover.region_restarted(); failover.verdict((0, 0), calm).reason
    'a region restart has not completed a checkpoint yet'
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raystream.engine.failover import FailoverStrategy
from raystream.engine.job_events import SubtaskKey
from raystream.engine.regions import Region, Regions


class Phase(enum.Enum):
    STEADY = "steady"  # no region restart since the newest completed checkpoint
    RESTARTING = "restarting"  # a region was redeployed; no checkpoint completed since


TRANSITIONS: frozenset[tuple[Phase, Phase]] = frozenset({
    (Phase.STEADY, Phase.RESTARTING),
    (Phase.RESTARTING, Phase.STEADY),
    (Phase.STEADY, Phase.STEADY),
})


@dataclass(frozen=True)
class Circumstances:
    """What the master knows of the job when a subtask fails."""

    aligned: bool  # aligned checkpoints without an alignment timeout
    draining: bool  # a stop with a drain is under way
    latest_is_savepoint: bool | None  # the newest completed checkpoint's kind (None: none)
    coordinators_reset: bool  # every operator coordinator can reset one subtask
    finished: frozenset[SubtaskKey]  # the subtasks that reported finished


@dataclass(frozen=True)
class Verdict:
    """The region to restart alone, or None and why the whole job restarts."""

    region: Region | None
    reason: str = ""


class RegionFailover:
    def __init__(self, regions: Regions, strategy: FailoverStrategy) -> None:
        self.regions, self.strategy = regions, strategy
        self.phase = Phase.STEADY

    def verdict(self, failed: SubtaskKey | None, now: Circumstances) -> Verdict:
        """What the failure of ``failed`` (None: not one subtask's: a coordinator's, a
        deployment's, a restore's) restarts."""
        doubt = self._doubt(failed, now)
        if doubt:
            return Verdict(None, doubt)
        assert failed is not None
        region = self.regions.restart_set(failed)
        if region is None:
            return Verdict(None, "the failed subtask's region holds a committer, or is all "
                                 "the job but its committers")
        return Verdict(region)

    def _doubt(self, failed: SubtaskKey | None, now: Circumstances) -> str:
        """Why no region may restart alone now ("": nothing is in doubt)."""
        if self.strategy is not FailoverStrategy.REGION:
            return "failover='full'"
        if failed is None:
            return "not one subtask's failure"
        if self.phase is Phase.RESTARTING:
            return "a region restart has not completed a checkpoint yet"
        if not now.aligned:
            return "unaligned checkpoints (channel state may name what died)"
        if now.draining:
            return "the job drains"
        if now.latest_is_savepoint is None:
            return "no completed checkpoint"
        if now.latest_is_savepoint:
            return "the newest checkpoint is a savepoint"
        if not now.coordinators_reset:
            return "an operator coordinator cannot reset one subtask"
        if now.finished & self.regions.committers:
            return "a committer has finished"
        return ""

    def region_restarted(self) -> None:
        self._transition(Phase.RESTARTING)

    def checkpoint_completed(self) -> None:
        if self.phase is Phase.RESTARTING:
            self._transition(Phase.STEADY)

    def job_restarted(self) -> None:
        """The whole job was redeployed (a global failover, or its first deployment)."""
        self._transition(Phase.STEADY)

    def _transition(self, to: Phase) -> None:
        if (self.phase, to) not in TRANSITIONS:
            raise RuntimeError(f"region failover: {self.phase.value} -> {to.value} is not a "
                               f"transition")
        self.phase = to
