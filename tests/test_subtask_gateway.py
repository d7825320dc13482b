"""Subtask gateways and the coordinators' part in checkpoints (FLINK-26029 / FLINK-28606).

Units with an in-memory transport (the Ray transport is exercised by the job
tests in test_operator_coordinators.py), and a model check: under any
interleaving of events, coordinator snapshots, subtask snapshots, aborts and
deliveries, what a coordinator had sent at its snapshot of ``n`` is exactly
what the subtask had received at its snapshot of ``n``.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raystream.checkpoint.coordinator_holder import (CoordinatedOperator, CoordinatorFailure,
                                                     OperatorCoordinators)
from raystream.checkpoint.operator_coordinator import OperatorCoordinator
from raystream.checkpoint.subtask_gateway import (EventDeliveryError, GatewayProtocolError,
                                                  SubtaskGateway)


class Pending:
    """A delivery that completes when the test says so."""

    def __init__(self) -> None:
        self.finished, self.failure = False, None

    def done(self) -> bool:
        return self.finished

    def error(self):
        return self.failure


class Link:
    """One subtask's end of a gateway: what it received, deliveries the test completes."""

    def __init__(self, instant: bool = True) -> None:
        self.instant = instant
        self.received: list = []
        self.deliveries: list[Pending] = []

    def send(self, event) -> Pending:
        self.received.append(event)
        delivery = Pending()
        delivery.finished = self.instant
        self.deliveries.append(delivery)
        return delivery


def coordinator_snapshot(gateway: SubtaskGateway, n: int) -> None:
    """What the holder does to each gateway around a coordinator's snapshot of ``n``."""
    gateway.mark_for_checkpoint(n)
    gateway.close_for_checkpoint(n)


def test_events_pass_until_the_coordinator_snapshot_then_wait_for_the_acknowledgement():
    link = Link()
    gateway = SubtaskGateway(0, link.send)
    gateway.send_event(1)
    gateway.mark_for_checkpoint(5)
    gateway.send_event(2)  # during the coordinator's snapshot: still part of it
    assert gateway.close_for_checkpoint(5)
    gateway.send_event(3)
    gateway.send_event(4)
    assert link.received == [1, 2] and gateway.held == 2
    gateway.acknowledge_checkpoint(5)
    assert link.received == [1, 2, 3, 4] and gateway.held == 0


def test_abort_releases_what_the_checkpoint_held():
    link = Link()
    gateway = SubtaskGateway(0, link.send)
    coordinator_snapshot(gateway, 1)
    gateway.send_event("a")
    gateway.release(1)
    assert link.received == ["a"]
    gateway.acknowledge_checkpoint(1)  # a late acknowledgement of the aborted checkpoint
    gateway.send_event("b")
    assert link.received == ["a", "b"]


def test_with_several_pending_checkpoints_events_wait_for_every_earlier_one():
    link = Link()
    gateway = SubtaskGateway(0, link.send)
    coordinator_snapshot(gateway, 1)
    gateway.send_event("after-1")
    coordinator_snapshot(gateway, 2)
    gateway.send_event("after-2")
    gateway.acknowledge_checkpoint(2)  # 1 still holds the gateway: nothing goes out
    assert link.received == [] and gateway.held == 2
    gateway.acknowledge_checkpoint(1)
    assert link.received == ["after-1", "after-2"]


def test_acknowledging_the_earlier_checkpoint_first_keeps_the_later_ones_events_held():
    link = Link()
    gateway = SubtaskGateway(0, link.send)
    for n, event in ((1, "after-1"), (2, "after-2")):
        coordinator_snapshot(gateway, n)
        gateway.send_event(event)
    gateway.acknowledge_checkpoint(1)
    assert link.received == ["after-1"]  # sent before 2's snapshot: it belongs before it
    assert gateway.holds_before(3) and not gateway.holds_before(2)
    gateway.acknowledge_checkpoint(2)
    assert link.received == ["after-1", "after-2"]


def test_an_acknowledgement_above_the_highest_marked_checkpoint_is_an_error():
    gateway = SubtaskGateway(3, Link().send, operator="enumerator")
    gateway.mark_for_checkpoint(4)
    with pytest.raises(GatewayProtocolError, match="subtask 4 of 'enumerator' acknowledged "
                                                   "checkpoint 5, above the highest"):
        gateway.acknowledge_checkpoint(5)
    with pytest.raises(GatewayProtocolError, match="ids must increase"):
        gateway.mark_for_checkpoint(3)


def test_delivered_events_are_forgotten_as_new_ones_go_out():
    link = Link(instant=False)
    gateway = SubtaskGateway(0, link.send)
    for event in range(100):  # no checkpoint ever asks about deliveries here
        gateway.send_event(event)
    for delivery in link.deliveries[:60]:
        delivery.finished = True
    gateway.send_event(100)
    assert gateway.undelivered == 41
    link.deliveries[60].finished, link.deliveries[60].failure = True, ConnectionError("gone")
    for delivery in link.deliveries[61:]:
        delivery.finished = True
    gateway.send_event(101)  # a failed delivery is kept until someone asks
    assert gateway.undelivered > 0
    with pytest.raises(EventDeliveryError, match="ConnectionError: gone"):
        gateway.all_delivered()


def test_reset_drops_held_and_undelivered_events_and_binds_the_new_subtask():
    old, new = Link(instant=False), Link()
    gateway = SubtaskGateway(0, old.send)
    gateway.send_event("in flight")
    coordinator_snapshot(gateway, 1)
    gateway.send_event("held")
    gateway.reset(new.send)
    assert gateway.all_delivered()
    gateway.send_event("fresh")
    assert old.received == ["in flight"] and new.received == ["fresh"]


class Recorder(OperatorCoordinator):
    """Keeps its state as the count of events it sent to each subtask."""

    def __init__(self, context):
        self.context = context
        self.sent = [0] * context.parallelism
        self.calls: list = []

    def send(self, subtask):
        self.context.send_event(subtask, self.sent[subtask])
        self.sent[subtask] += 1

    def checkpoint_coordinator(self, checkpoint_id):
        return ",".join(map(str, self.sent)).encode()

    def reset_to_checkpoint(self, checkpoint_id, state):
        self.calls.append(("reset", checkpoint_id))
        self.sent = [int(x) for x in state.decode().split(",")] if state else [0] * len(self.sent)

    def subtask_ready(self, subtask, gateway):
        self.calls.append(("ready", subtask))

    def notify_checkpoint_complete(self, checkpoint_id):
        self.calls.append(("complete", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id):
        self.calls.append(("aborted", checkpoint_id))


def coordinators(parallelism: int, instant: bool = True):
    links = [Link(instant) for _ in range(parallelism)]
    holders = OperatorCoordinators([CoordinatedOperator("op", parallelism, Recorder)])
    holders.start()
    holders.bind(lambda name, i: links[i].send)
    return holders, holders.coordinator("op"), links


def test_the_trigger_waits_until_events_sent_before_the_snapshot_are_delivered():
    holders, coordinator, links = coordinators(2, instant=False)
    coordinator.send(0)
    coordinator.send(1)
    states = holders.checkpoint(1)
    assert states == {"op": b"1,1"}
    coordinator.send(0)  # after the snapshot: held, not waited for
    assert not holders.ready_to_trigger(1)
    links[0].deliveries[0].finished = True
    assert not holders.ready_to_trigger(1)
    links[1].deliveries[0].finished = True
    assert holders.ready_to_trigger(1)
    assert links[0].received == [0]


def test_a_failed_delivery_fails_the_checkpoint():
    holders, coordinator, links = coordinators(1, instant=False)
    coordinator.send(0)
    holders.checkpoint(1)
    links[0].deliveries[0].finished = True
    links[0].deliveries[0].failure = ConnectionError("actor died")
    with pytest.raises(EventDeliveryError, match="subtask 1: ConnectionError: actor died"):
        holders.ready_to_trigger(1)


def test_a_later_checkpoint_waits_while_an_earlier_one_still_holds_events():
    holders, coordinator, links = coordinators(1)
    holders.checkpoint(1)
    coordinator.send(0)  # held by 1
    holders.checkpoint(2)
    assert not holders.ready_to_trigger(2)  # released later, it would pass barrier 2
    holders.acknowledge(["op"], 0, 1)
    assert holders.ready_to_trigger(2) and links[0].received == [0]


def test_failover_resets_coordinators_to_the_checkpoint_and_readies_the_new_subtasks():
    holders, coordinator, links = coordinators(2)
    for _ in range(3):
        coordinator.send(0)
    holders.checkpoint(1)
    holders.complete(1)
    coordinator.send(1)
    holders.reset(1, {"op": b"3,0"})
    assert coordinator.sent == [3, 0]
    fresh = [Link(), Link()]
    holders.bind(lambda name, i: fresh[i].send)
    coordinator.send(1)
    assert fresh[1].received == [0]
    assert coordinator.calls == [("ready", 0), ("ready", 1), ("complete", 1), ("reset", 1),
                                 ("ready", 0), ("ready", 1)]


def test_a_raising_coordinator_fails_the_job_naming_it():
    class Broken(OperatorCoordinator):
        def __init__(self, context):
            pass

        def checkpoint_coordinator(self, checkpoint_id):
            raise KeyError("no state")

    holders = OperatorCoordinators([CoordinatedOperator("enumerator", 1, Broken)])
    with pytest.raises(CoordinatorFailure, match="'enumerator': checkpoint_coordinator raised "
                                                 "KeyError"):
        holders.checkpoint(1)


def run_until(holders, condition, timeout_s: float = 10.0) -> None:
    """Step ``run_due`` as the job master's event loop does, until ``condition()``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "call_async did not finish in time"
        holders.run_due(time.monotonic())
        time.sleep(0.005)


def test_call_async_runs_work_on_a_worker_and_its_handler_on_the_event_thread():
    holders, coordinator, _ = coordinators(1)
    context = holders._holders["op"].context
    seen = []
    context.call_async(lambda: threading.get_ident(),
                       lambda worker, error: seen.append((worker, error, threading.get_ident())))
    run_until(holders, lambda: seen)
    worker, error, handler_thread = seen[0]
    assert error is None and worker != handler_thread == threading.get_ident()

    context.call_async(lambda: 1 / 0, lambda result, error: seen.append((result, error)))
    run_until(holders, lambda: len(seen) == 2)
    assert seen[1][0] is None and isinstance(seen[1][1], ZeroDivisionError)

    def broken_handler(result, error):
        raise ValueError("bad listing")
    context.call_async(lambda: None, broken_handler)
    with pytest.raises(CoordinatorFailure, match="'op': a call_async handler raised ValueError"):
        run_until(holders, lambda: False)
    holders.close()


def test_call_async_work_started_before_a_failover_is_dropped():
    holders, coordinator, _ = coordinators(1)
    context = holders._holders["op"].context
    started, release, seen = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(10)
        return "old attempt"
    context.call_async(slow, lambda result, error: seen.append(result))
    started.wait(10)
    holders.reset(None, {})  # failover while the work runs
    release.set()
    deadline = time.monotonic() + 10
    while holders._finished.qsize() < 1:  # done, its handler queued (not yet run)
        assert time.monotonic() < deadline
        time.sleep(0.005)
    holders.run_due(time.monotonic())
    assert seen == []  # dropped: it belonged to the attempt before the failover
    context.call_async(lambda: "new attempt", lambda result, error: seen.append(result))
    run_until(holders, lambda: seen)
    assert seen == ["new attempt"]
    holders.close()


# -- the model check --------------------------------------------------------------------------
steps = st.lists(st.sampled_from(["send", "send", "send", "coordinator_snapshot", "trigger",
                                  "subtask_snapshot", "acknowledgement", "abort", "deliver"]),
                 max_size=100)


@settings(max_examples=500)
@given(steps)
# Checkpoint 2 triggered while 1's acknowledgement is on its way: 1 still holds an event
# that is "sent" in 2's coordinator snapshot.
@example(["coordinator_snapshot", "send", "trigger", "coordinator_snapshot",
          "subtask_snapshot", "trigger", "subtask_snapshot"])
# An event sent before the snapshot, not delivered when the barrier is triggered.
@example(["send", "coordinator_snapshot", "trigger", "subtask_snapshot", "deliver"])
def test_an_event_is_in_both_snapshots_of_a_checkpoint_or_in_neither(script):
    """A checkpoint starts with the coordinators' snapshot; the master triggers the oldest
    started one once ``ready_to_trigger``; the subtask snapshots triggered checkpoints in
    order and its acknowledgements reach the master later, in order; an abort hits the
    oldest checkpoint the subtask has not snapshotted; deliveries complete in send order,
    at any time. Whatever the interleaving, the subtask's snapshot of ``n`` holds exactly
    the events the coordinator had sent at its snapshot of ``n``."""
    links = [Link(instant=False)]
    holders = OperatorCoordinators([CoordinatedOperator("op", 1, Recorder)])
    holders.bind(lambda name, i: links[0].send)
    coordinator = holders.coordinator("op")
    gateway = holders.gateway("op", 0)
    delivered: list[int] = []  # what the subtask has accepted, in order
    started: list[int] = []  # coordinator snapshot taken, not triggered
    triggered: list[int] = []  # barrier on its way, subtask snapshot not taken
    acknowledgements: list[int] = []  # on their way to the master
    coordinator_state: dict[int, int] = {}
    subtask_state: dict[int, list[int]] = {}
    next_id = 1
    for step in script:
        if step == "send":
            coordinator.send(0)
        elif step == "coordinator_snapshot":
            coordinator_state[next_id] = int(holders.checkpoint(next_id)["op"])
            started.append(next_id)
            next_id += 1
        elif step == "trigger" and started and holders.ready_to_trigger(started[0]):
            triggered.append(started.pop(0))
        elif step == "deliver" and len(delivered) < len(links[0].received):
            links[0].deliveries[len(delivered)].finished = True
            delivered.append(links[0].received[len(delivered)])
        elif step == "subtask_snapshot" and triggered:
            n = triggered.pop(0)
            subtask_state[n] = list(delivered)
            acknowledgements.append(n)
        elif step == "acknowledgement" and acknowledgements:
            holders.acknowledge(["op"], 0, acknowledgements.pop(0))
        elif step == "abort" and (started or triggered):
            holders.abort((started or triggered).pop(0))
    for n, received in subtask_state.items():
        assert received == list(range(coordinator_state[n])), (n, script)
    for n in acknowledgements:
        holders.acknowledge(["op"], 0, n)
    for n in triggered + started:  # what is still pending ends: all goes out, once, in order
        holders.abort(n)
    assert links[0].received == list(range(coordinator.sent[0]))
    assert gateway.held == 0
