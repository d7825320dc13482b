"""What a job does after a failure (engine/failover.py; region or global:
engine/region_failover.py): no Ray, no subtasks.

The expected decisions are written out by hand from the restart strategies'
documented semantics (attempts, delays) and the restore order: the newest
completed checkpoint, else the savepoint the job started from, else the beginning.
"""

from __future__ import annotations

import dataclasses

import pytest

from raystream.checkpoint.config import RestartStrategy
from raystream.engine.failover import (Failover, FailJob, Failure, FailoverStrategy, Restart,
                                       RestoreSource)
from raystream.engine.region_failover import Circumstances, Phase, RegionFailover, Verdict
from raystream.engine.regions import Regions

BOOM = Failure("boom", operator="map", subtask=1, traceback="Traceback ...")


def test_a_job_without_checkpoints_fails_on_its_first_failure():
    failover = Failover(RestartStrategy.fixed_delay(3, 0.0))
    decision = failover.on_failure(BOOM, completed=None, at=10.0)
    assert decision == FailJob("boom (no checkpoints: no restart)", operator="map", subtask=1,
                               traceback="Traceback ...")
    assert failover.failures == ["boom"]


def test_restarts_from_the_newest_completed_checkpoint_until_the_budget_is_used_up():
    failover = Failover(RestartStrategy.fixed_delay(2, 1.5))
    first = failover.on_failure(BOOM, completed=[1, 2], at=1.0)
    second = failover.on_failure(Failure("again"), completed=[2, 5], at=2.0)
    third = failover.on_failure(Failure("and again", operator="sink"), completed=[5, 6], at=3.0)
    assert first == Restart(1, 1.5, RestoreSource.CHECKPOINT, 2)
    assert second == Restart(2, 1.5, RestoreSource.CHECKPOINT, 5)
    assert third == FailJob("and again (restart attempts exhausted: 2)", operator="sink")
    assert failover.failures == ["boom", "again", "and again"]
    # each failure is recorded with the attempt it ended, where it happened and when
    assert [(d["attempt"], d["operator"], d["subtask"], d["at"])
            for d in failover.failure_details] == [(0, "map", 1, 1.0), (1, None, None, 2.0),
                                                   (2, "sink", None, 3.0)]


def test_no_restart_strategy_fails_at_once_without_a_suffix():
    failover = Failover(RestartStrategy.none())
    assert failover.on_failure(BOOM, completed=[4], at=0.0) == FailJob(
        "boom", operator="map", subtask=1, traceback="Traceback ...")


def test_no_checkpoint_yet_restarts_from_the_beginning():
    failover = Failover(RestartStrategy.fixed_delay(1, 0.0))
    assert failover.on_failure(BOOM, completed=[], at=0.0) == Restart(
        1, 0.0, RestoreSource.BEGINNING, None)


def test_a_job_started_from_a_savepoint_goes_back_to_it_until_it_has_a_checkpoint():
    failover = Failover(RestartStrategy.fixed_delay(3, 0.0))
    failover.started_from(7)
    assert failover.on_failure(BOOM, completed=[], at=0.0) == Restart(
        1, 0.0, RestoreSource.SAVEPOINT, 7)
    assert failover.on_failure(BOOM, completed=[9], at=0.0) == Restart(
        2, 0.0, RestoreSource.CHECKPOINT, 9)


def test_exponential_backoff_delays_grow_to_their_cap():
    failover = Failover(RestartStrategy.exponential_backoff(5, initial_s=0.5, max_s=3.0,
                                                            multiplier=2.0))
    delays = []
    for _ in range(5):
        decision = failover.on_failure(BOOM, completed=[1], at=0.0)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert isinstance(failover.on_failure(BOOM, completed=[1], at=0.0), FailJob)


def test_a_failure_without_a_message():
    failover = Failover(RestartStrategy.none())
    assert failover.on_failure(Failure(None), completed=None, at=0.0) == FailJob(
        " (no checkpoints: no restart)")
    assert failover.failures == ["unknown failure"]


def test_nothing_to_restore_fails_the_job_naming_the_failure():
    assert Failover.cannot_restore(BOOM, "checkpoint 4 is corrupt") == FailJob(
        "boom; the job cannot restore: checkpoint 4 is corrupt", operator="map",
        traceback="Traceback ...")


@pytest.mark.parametrize("attempts", [0, 1, 4])
def test_the_attempt_numbers_count_the_restarts(attempts):
    failover = Failover(RestartStrategy.fixed_delay(attempts, 0.0))
    decisions = [failover.on_failure(BOOM, completed=[3], at=0.0) for _ in range(attempts + 1)]
    assert [d.attempt for d in decisions if isinstance(d, Restart)] == list(range(1, attempts + 1))
    assert isinstance(decisions[-1], FailJob)


# -- region or global (engine/region_failover.py) ---------------------------------------------

def _regions() -> Regions:
    # two writer regions (vertex 0 at p=2) and their committer (vertex 1)
    return Regions((frozenset({(0, 0)}), frozenset({(0, 1)}), frozenset({(1, 0)})),
                   committers=frozenset({(1, 0)}))


def _calm(**changes) -> Circumstances:
    return dataclasses.replace(Circumstances(aligned=True, draining=False,
                                             latest_is_savepoint=False,
                                             coordinators_reset=True, finished=frozenset()),
                               **changes)


def test_a_subtask_failure_restarts_its_region_only_when_nothing_is_in_doubt():
    failover = RegionFailover(_regions(), FailoverStrategy.REGION)
    assert failover.verdict((0, 1), _calm()).region == frozenset({(0, 1)})
    in_doubt = {
        "not one subtask's failure": (None, _calm()),
        "unaligned checkpoints (channel state may name what died)":
            ((0, 1), _calm(aligned=False)),
        "the job drains": ((0, 1), _calm(draining=True)),
        "no completed checkpoint": ((0, 1), _calm(latest_is_savepoint=None)),
        "the newest checkpoint is a savepoint": ((0, 1), _calm(latest_is_savepoint=True)),
        "an operator coordinator cannot reset one subtask":
            ((0, 1), _calm(coordinators_reset=False)),
        "a committer has finished": ((0, 1), _calm(finished=frozenset({(1, 0)}))),
    }
    for reason, (failed, now) in in_doubt.items():
        assert failover.verdict(failed, now) == Verdict(None, reason)
    # the committer's own failure, and the same job with failover="full"
    assert failover.verdict((1, 0), _calm()).region is None
    full = RegionFailover(_regions(), FailoverStrategy.FULL)
    assert full.verdict((0, 1), _calm()).reason == "failover='full'"


def test_a_failure_before_the_restarted_region_completes_a_checkpoint_restarts_the_job():
    failover = RegionFailover(_regions(), FailoverStrategy.REGION)
    failover.region_restarted()
    assert failover.verdict((0, 0), _calm()).region is None  # the other region too
    with pytest.raises(RuntimeError, match="restarting -> restarting"):
        failover.region_restarted()
    failover.checkpoint_completed()
    assert failover.phase is Phase.STEADY
    assert failover.verdict((0, 0), _calm()).region == frozenset({(0, 0)})
    failover.region_restarted()
    failover.job_restarted()  # the fallback: the whole job redeployed
    assert failover.phase is Phase.STEADY
