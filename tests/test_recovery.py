"""A failover's recovery by stage (engine/recovery.py): the clock that times the stages
from what the deployment and the subtasks report, checked against a model over every
order the reports can arrive in; and the rows people and successor masters read."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raystream.checkpoint.local_recovery import StateOrigin
from raystream.engine.recovery import (STAGES, Recovery, RecoveryClock, RecoveryStage,
                                       describe)

DETECTED_AT = 1_000.0


@st.composite
def reports(draw):
    """The reports of one recovery, in an order they can arrive in: the deployment's
    (cancelled, then started), each subtask's opening (before or after the deployment
    returned) and zero or more first records of sinks (after some subtask opened)."""
    subtasks = draw(st.integers(1, 5))
    cancelled = DETECTED_AT + draw(st.floats(0, 2))
    started = cancelled + draw(st.floats(0, 2))
    opened = {(k, 0): started - draw(st.floats(0, 0.5)) + draw(st.floats(0, 3))
              for k in range(subtasks)}
    firsts = [min(opened.values()) + draw(st.floats(0, 3)) for _ in range(draw(st.integers(0, 3)))]
    events = [("deployed", cancelled, started)] + [("opened", k, at) for k, at in opened.items()]
    events += [("first", at) for at in firsts]
    return subtasks, cancelled, started, opened, firsts, draw(st.permutations(events))


@settings(max_examples=300, deadline=None)
@given(reports())
def test_stages_equal_the_model_whatever_the_order_of_the_reports(case):
    subtasks, cancelled, started, opened, firsts, events = case
    clock = RecoveryClock(Recovery.detected(attempt=3, failure="sum[1] died", at=DETECTED_AT),
                          subtasks=subtasks)
    for event in events:
        match event:
            case ("deployed", c, s):
                clock.deployed(cancelled_at=c, deployed_at=s)
            case ("opened", key, at):
                clock.reached(RecoveryStage.RESTORED, key, at=at)
            case ("first", at):
                clock.reached(RecoveryStage.FIRST_RECORD, (0, 0), at=at)
    # the model: each stage when its last report came, never before the stage ahead of it;
    # the first record is the earliest one heard by the time every subtask had opened
    expected = [0.0, cancelled - DETECTED_AT, started - DETECTED_AT]
    expected.append(max(expected[-1], max(opened.values()) - DETECTED_AT))
    restored_by = max(i for i, e in enumerate(events) if e[0] in ("deployed", "opened"))
    heard = [e[1] for i, e in enumerate(events) if e[0] == "first"]
    if heard:
        first_heard = next(i for i, e in enumerate(events) if e[0] == "first")
        upto = max(restored_by, first_heard)
        earliest = min(e[1] for e in events[:upto + 1] if e[0] == "first")
        expected.append(max(expected[-1], earliest - DETECTED_AT))
    stages = clock.recovery.stages
    assert stages == pytest.approx(expected)
    assert list(stages) == sorted(stages)
    assert clock.recovery.complete == bool(firsts)


def test_a_stage_out_of_order_is_refused_naming_it():
    recovery = Recovery.detected(attempt=2, failure="x", at=0.0)
    with pytest.raises(ValueError, match="stage deployed reached before cancelled"):
        recovery.reached(RecoveryStage.DEPLOYED, 1.0)
    done = recovery
    for k, stage in enumerate(STAGES[1:], 1):
        done = done.reached(stage, float(k))
    with pytest.raises(ValueError, match="before none"):
        done.reached(RecoveryStage.FIRST_RECORD, 9.0)


def test_rows_round_trip_and_rows_of_older_masters_still_read():
    recovery = (Recovery.detected(attempt=4, failure="node lost", at=12.5)
                .restoring(7, ("node-a",))
                .reached(RecoveryStage.CANCELLED, 0.1).reached(RecoveryStage.DEPLOYED, 0.3)
                .restored("sum[0]", StateOrigin.LOCAL).restored("sum[1]", StateOrigin.STORAGE))
    row = recovery.as_dict()
    assert row["restored_from"] == {"sum[0]": "local", "sum[1]": "storage"}
    assert recovery.restored_locally == ("sum[0]",)
    assert row["restore_s"] == 0.3 and row["stages"] == {"detected": 0.0, "cancelled": 0.1,
                                                         "deployed": 0.3}
    assert Recovery.from_dict(row) == recovery
    older = Recovery.from_dict({"attempt": 1, "failure": "died", "checkpoint_id": 2,
                                "restore_s": 0.8, "lost_nodes": []})
    assert older.restore_s == 0.8 and older.next_stage is RecoveryStage.RESTORED
    assert describe(row) == ("attempt 4 from checkpoint 7: cancelled 0.10 s, deployed 0.30 s "
                             "(restored: not yet); 1 of 2 subtasks restored locally")
