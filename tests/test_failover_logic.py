"""What a job does after a failure (engine/failover.py): no Ray, no subtasks.

The expected decisions are written out by hand from the restart strategies'
documented semantics (attempts, delays) and the restore order: the newest
completed checkpoint, else the savepoint the job started from, else the beginning.
"""

from __future__ import annotations

import pytest

from raystream.checkpoint.config import RestartStrategy
from raystream.engine.failover import (Failover, FailJob, Failure, Restart,
                                       RestoreSource)

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
