"""Operator coordinators in running jobs: events exactly once across failures (after
Flink's ``CoordinatorEventsExactlyOnceITCase``), events from subtasks, bad coordinators.

Two sources, each with a coordinator that sends the integers 0..n-1 to every
subtask of its source at its own pace (n = 200 every 10 ms, n = 10 every
200 ms). A source emits one row per event it accepts (the value, and whether
it was the next one expected) and ends once it has accepted all n; its state
is the next value it expects, the coordinator's state is the next value it
sends. Checkpoints run all along and failures are placed; the committed
output must hold, per (source, subtask), exactly 0..n-1, once, each accepted
in order.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.actors.operator import OperatorSnapshot
from tests.support.jobs import wait_for_checkpoint

PARALLELISM = 2


class Numbers(rs.OperatorCoordinator):
    """Sends 0..n-1 to every ready subtask, one each ``every_s``; its state is the next
    value per subtask."""

    def __init__(self, context: rs.OperatorCoordinatorContext, n: int, every_s: float) -> None:
        self.context, self.n, self.every_s = context, n, every_s
        self.next = [0] * context.parallelism
        self.gateways: dict[int, rs.SubtaskEventGateway] = {}

    def start(self) -> None:
        self.context.call_later(self.every_s, self.send)

    def send(self) -> None:
        for subtask, gateway in self.gateways.items():
            if self.next[subtask] < self.n:
                gateway.send_event(self.next[subtask])
                self.next[subtask] += 1
        self.context.call_later(self.every_s, self.send)

    def subtask_ready(self, subtask: int, gateway: rs.SubtaskEventGateway) -> None:
        self.gateways[subtask] = gateway

    def checkpoint_coordinator(self, checkpoint_id: int) -> bytes:
        return json.dumps(self.next).encode()

    def reset_to_checkpoint(self, checkpoint_id: int | None, state: bytes | None) -> None:
        self.next = json.loads(state) if state else [0] * self.context.parallelism
        self.gateways.clear()
        self.context.call_later(self.every_s, self.send)  # timers of the old attempt are gone


class Receiver(rs.SourceOperator):
    """Emits a row per event; ends once it accepted 0..n-1."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name)
        self.n, self.expected = n, 0

    def initialize_state(self, restored) -> None:
        for blob in restored.operator_states if restored else ():
            state = json.loads(blob)
            if state["subtask"] == self.ctx.subtask_index:
                self.expected = state["expected"]

    def handle_operator_event(self, event: int) -> None:
        in_order = event == self.expected
        self.expected = max(self.expected, event + 1)
        self.output.emit(pa.record_batch({
            "source": [self.name], "subtask": [self.ctx.subtask_index],
            "value": pa.array([event], pa.int64()), "in_order": [in_order]}))

    def is_available(self) -> bool:
        return self.expected >= self.n  # only to end: events arrive as control messages

    def emit_next(self) -> bool:
        return self.expected < self.n

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        state = json.dumps({"subtask": self.ctx.subtask_index, "expected": self.expected}).encode()
        return OperatorSnapshot(operator_state=lambda: state)


SOURCES = {"fast": (200, 0.01), "slow": (10, 0.2)}


def build(env: rs.StreamEnvironment) -> rs.SinkHandle:
    streams = [env.add_source(lambda name, n=n: Receiver(name, n), name=name,
                              coordinator=lambda ctx, n=n, every=every: Numbers(ctx, n, every))
               for name, (n, every) in SOURCES.items()]
    return streams[0].union(streams[1]).collect(parallelism=1)


def assert_every_subtask_got_every_number_once_in_order(table: pa.Table) -> None:
    assert table.num_rows == sum(n for n, _ in SOURCES.values()) * PARALLELISM
    assert all(table.column("in_order").to_pylist())
    for name, (n, _) in SOURCES.items():
        for subtask in range(PARALLELISM):
            mask = np.array([s == name and i == subtask for s, i in zip(
                table.column("source").to_pylist(), table.column("subtask").to_pylist())])
            values = np.sort(table.column("value").to_numpy()[mask])
            np.testing.assert_array_equal(values, np.arange(n), err_msg=f"{name}/{subtask}")


@pytest.mark.slow
def test_coordinator_events_arrive_exactly_once_in_order_across_failures(ray_session, tmp_path):
    failpoints = [
        rs.Failpoint("in_snapshot", operator="fast", subtask=1, hit=3, attempt=1),
        rs.Failpoint("right_after_restore", operator="slow", subtask=0, attempt=2),
        rs.Failpoint("in_processing", operator="collect", subtask=0, hit=3, attempt=3,
                     action="raise"),
    ]
    env = rs.StreamEnvironment(
        parallelism=PARALLELISM, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=0.1, storage=str(tmp_path)),
        restart=rs.RestartStrategy.fixed_delay(attempts=6, delay_s=0.0))
    sink = build(env)
    client = env.execute_async("coordinator-events")
    completed = wait_for_checkpoint(client)  # then a kill; the failpoints follow it
    ray.kill(client.subtask_actor("fast", 0))
    result = client.wait(timeout_s=240)
    assert result.restarts == 4, result.failures
    assert result.restores[0]["checkpoint_id"] >= completed
    assert all("died" in failure for failure in result.failures[:3]), result.failures
    assert "failpoint in_processing" in result.failures[3], result.failures
    assert_every_subtask_got_every_number_once_in_order(result.table(sink))


def test_events_without_failures_and_events_from_subtasks(ray_session, tmp_path):
    class Echo(rs.OperatorCoordinator):
        """Answers every event from a subtask with the event plus one."""

        def __init__(self, context):
            self.context = context

        def handle_event_from_subtask(self, subtask, event):
            self.context.send_event(subtask, event + 1)

    class PingPong(rs.SourceOperator):
        """Sends 0 to its coordinator; emits each answer and sends it back, up to 20."""

        def open(self):
            self.last = None
            self.ctx.send_event_to_coordinator(0)

        def handle_operator_event(self, event):
            self.last = event
            self.output.emit(pa.record_batch({"subtask": [self.ctx.subtask_index],
                                              "value": pa.array([event], pa.int64())}))
            if event < 20:
                self.ctx.send_event_to_coordinator(event)

        def is_available(self):
            return self.last == 20

        def emit_next(self):
            return False

    env = rs.StreamEnvironment(parallelism=PARALLELISM, checkpoints=rs.CheckpointConfig(
        interval_s=0.05, storage=str(tmp_path)))
    sink = env.add_source(PingPong, name="ping", coordinator=Echo).collect()
    result = env.execute("ping-pong")
    table = result.table(sink)
    for subtask in range(PARALLELISM):
        values = [v for s, v in zip(table["subtask"].to_pylist(), table["value"].to_pylist())
                  if s == subtask]
        assert sorted(values) == list(range(1, 21))
    assert result.restarts == 0 and sum(c.status == "COMPLETED" for c in result.checkpoints) >= 1


@pytest.mark.slow
def test_a_coordinator_that_raises_fails_the_job_naming_it(ray_session):
    class Broken(rs.OperatorCoordinator):
        def __init__(self, context):
            pass

        def subtask_ready(self, subtask, gateway):
            raise ValueError("cannot list the files")

    class Idle(rs.SourceOperator):
        def emit_next(self):
            return False

    env = rs.StreamEnvironment(parallelism=1)
    env.add_source(Idle, name="files", coordinator=Broken).collect()
    with pytest.raises(rs.JobFailedError, match="operator coordinator of 'files': subtask_ready "
                                                "raised ValueError: cannot list the files"):
        env.execute("broken-coordinator")


def test_an_event_for_an_operator_without_handler_names_it(ray_session):
    class Chatty(rs.OperatorCoordinator):
        def __init__(self, context):
            pass

        def subtask_ready(self, subtask, gateway):
            gateway.send_event("hello")

    class Deaf(rs.SourceOperator):
        def emit_next(self):
            return True  # never ends by itself: the event must fail it

    env = rs.StreamEnvironment(parallelism=1)
    env.add_source(Deaf, name="deaf", coordinator=Chatty).discard()
    with pytest.raises(rs.JobFailedError, match="operator 'deaf' got an operator event but does "
                                                "not implement handle_operator_event"):
        env.execute("deaf")
