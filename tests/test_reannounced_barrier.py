"""An aligned barrier with a timeout that both ends of a channel turn unaligned: the
receiver's input channel state and the sender's output channel state must not both hold
the same message.

The receiver here is a real :class:`~raystream.actors.subtask.Subtask` (its mailbox loop on
its own thread, its checkpointer writing to a temporary directory); what is around it
(the sender's output channel and barrier forwarder, the downstream receiver, the job
master) is played by the test, which orders every delivery, so the interleaving is exact,
not hoped for:

1. the sender has seq 0 sent and seq 1, 2 waiting for credit, and announces aligned
   barrier 1 after seq 2;
2. the receiver's alignment timeout has passed: it snapshots unaligned at once and
   records its input in flight up to seq 2;
3. the sender's timeout passes too: it announces the barrier again, unaligned, after
   seq 1 (the last it had sent), and seq 2 becomes its output channel state;
4. seq 1 and then seq 2 (sent after that announcement, on credit the receiver returned)
   reach the receiver's data lane *before* the announcement reaches its control lane
   (two lanes: Ray does not order them).

Oracle: per channel, what the receiver processed before its snapshot, then its input
state, then the sender's output state, is exactly what the sender emitted before the
barrier (restore replays them in that order, so a message in two parts is processed
twice after a failover).
"""

from __future__ import annotations

import queue
import time

import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.barrier_forwarder import BarrierForwarder
from raystream.actors.channel_state_file import decode_channel_state
from raystream.actors.channels import OutputChannel
from raystream.actors.mailbox import BarrierReceived, Cancel, Credit
from raystream.actors.messages import Envelope, Kind
from raystream.actors.subtask import Subtask
from raystream.actors.subtask_spec import SubtaskSpec
from raystream.actors.subtask_checkpoints import CheckpointingSpec
from raystream.checkpoint.barrier import Barrier
from raystream.checkpoint.storage import CheckpointStorage

WAIT_S = 20.0


class _Remote:
    """A Ray method's stand-in: ``handle.method.remote(...)`` calls ``fn``."""

    def __init__(self, fn) -> None:
        self.remote = fn


class _Master:
    """The job master as the subtask's gateway calls it."""

    def __init__(self) -> None:
        self.acknowledged: queue.Queue = queue.Queue()
        self.declined: queue.Queue = queue.Queue()
        self.acknowledge_checkpoint = _Remote(
            lambda attempt, n, vertex, index, written, stats: self.acknowledged.put((n, stats)))
        self.decline_checkpoint = _Remote(
            lambda attempt, n, vertex, index, reason: self.declined.put((n, reason)))
        for name in ("report_finished", "report_stage", "operator_event",
                     "acknowledge_coordinator_checkpoint"):
            setattr(self, name, _Remote(lambda *args: None))


class _Upstream:
    """The sender's actor as the receiver returns credit to it."""

    def __init__(self) -> None:
        self.credits: queue.Queue = queue.Queue()
        self.add_credit = _Remote(lambda channel, n, attempt: self.credits.put(n))


class _Downstream:
    """The next subtask: takes the receiver's output (returning its credit at once) and
    its barrier announcements."""

    def __init__(self) -> None:
        self.receiver: Subtask | None = None
        self.data: list[Envelope] = []
        self.barriers: queue.Queue = queue.Queue()
        self.deliver = _Remote(self._deliver)
        self.receive_barrier = _Remote(
            lambda channel, barrier, upto, index: self.barriers.put((barrier, upto)))

    def _deliver(self, envelope: Envelope) -> None:
        self.data.append(envelope)
        if envelope.kind == Kind.DATA and self.receiver is not None:
            self.receiver.post(Credit(envelope.channel, 1))


def _ids(envelopes) -> list[int]:
    out = []
    for envelope in envelopes:
        if envelope.kind == Kind.DATA:
            batch = envelope.payload[0]
            out += batch.column("id").to_pylist()
    return out


def _get(q: queue.Queue, what: str):
    try:
        return q.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError(f"no {what} within {WAIT_S} s") from None


def _start(tmp_path, vertex_name: str, build):
    """Subtask 0 of ``vertex_name`` of the job ``build(env)`` makes, started with the test's
    stand-ins around it: (subtask, its input channels, master, upstream, downstream)."""
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=3600, storage=str(tmp_path), aligned_timeout=0.05))
    build(env)
    plan = env.plan()
    vertex = next(v for v in plan.vertices if v.name == vertex_name)
    master, upstream, downstream = _Master(), _Upstream(), _Downstream()
    spec = SubtaskSpec("job-id", "job", 0, vertex, 0, plan.max_parallelism, credits=1,
                       master=master,
                       checkpointing=CheckpointingSpec(tmp_path.as_uri(), "job-id", 32 * 1024))
    subtask = Subtask(spec)
    downstream.receiver = subtask
    in_channels = [channel for channel, _ in vertex.input_channels(0)]
    out_channels = [c for e in vertex.outputs for c in e.output_channels(0)]
    subtask.connect({c: downstream for c in out_channels}, {c: upstream for c in in_channels})
    subtask.start()
    return subtask, in_channels, master, upstream, downstream


def _numbers(env, name: str):
    return env.from_sequence(10, lambda i: {"id": i}, batch_size=1, name=name)


@pytest.fixture
def started():
    subtasks = []

    def start(*args):
        result = _start(*args)
        subtasks.append(result[0])
        return result

    yield start
    for subtask in subtasks:
        subtask.post(Cancel())
        subtask.done.wait(WAIT_S)


def _batch(i: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": [i]})]


def _input_state(master: _Master, tmp_path):
    """The channel state of the checkpoint the subtask acknowledged first."""
    n, stats = _get(master.acknowledged, "acknowledgement of checkpoint 1")
    assert n == 1 and master.declined.empty()
    if stats.channel_state is None:  # none was written: nothing was in flight
        return {}
    return decode_channel_state(CheckpointStorage(tmp_path.as_uri()).read_state(
        stats.channel_state)).inputs


def test_a_message_sent_after_the_reannouncement_is_in_one_part_only(started, tmp_path):
    subtask, (channel,), master, upstream, downstream = started(
        tmp_path, "m", lambda env: _numbers(env, "numbers").rebalance()
        .map_batches(lambda batch: batch, name="m").rebalance().discard(name="out"))
    net: list[Envelope] = []  # the receiver's data lane, in the order the test delivers
    announcements: list[BarrierReceived] = []  # its control lane
    out = OutputChannel(channel, attempt=0, credits=1, transmit=net.append)

    def announce(out_channel: OutputChannel, barrier: Barrier, upto: int) -> None:
        announcements.append(BarrierReceived(channel, barrier, upto, out_channel.announce()))

    forwarder = BarrierForwarder({channel: out}, announce)
    emitted = []
    for i in range(3):
        emitted.append(i)
        out.send(Kind.DATA, _batch(i), rows=1)
    assert [e.seq for e in net] == [0]  # seq 1 and 2 wait for credit
    # 1. aligned barrier 1 after seq 2, its timeout already over (the receiver's clock)
    barrier = Barrier(1, attempt=0, trigger_ts_ms=int(time.time() * 1000) - 60_000,
                      aligned_timeout_ms=50)
    capture = forwarder.forward(barrier, unaligned=False)
    assert capture.awaiting == {channel: 2}
    subtask.post(announcements.pop(0))
    # 2. the receiver snapshots unaligned: it announces the barrier downstream
    forwarded, _ = _get(downstream.barriers, "barrier from the receiver")
    assert forwarded.checkpoint_id == 1 and forwarded.unaligned
    processed_before = _ids(downstream.data)  # (its output before the barrier: none here)
    subtask.deliver(net.pop(0))  # seq 0, processed after the snapshot
    out.add_credit(_get(upstream.credits, "credit for seq 0"))  # seq 1 is sent
    # 3. the sender's timeout passes: barrier 1 again, unaligned, after seq 1
    forwarder.settle(lambda: float("inf"))
    assert capture.done.is_set()
    assert announcements[0].barrier.unaligned and announcements[0].upto == 1
    output_state = _ids(capture.entries.get(channel, []))
    assert output_state == [2]
    # 4. seq 1, then seq 2 (sent on the credit for seq 1) arrive before that announcement
    subtask.deliver(net.pop(0))
    out.add_credit(_get(upstream.credits, "credit for seq 1"))  # seq 2 is sent
    assert [e.seq for e in net] == [2]
    subtask.deliver(net.pop(0))
    subtask.post(announcements.pop(0))
    input_state = _ids(_input_state(master, tmp_path).get(channel, []))
    assert processed_before + input_state + output_state == emitted, (
        f"processed before the snapshot {processed_before}, input state {input_state}, "
        f"the sender's output state {output_state}")


def test_a_message_after_the_barrier_is_in_no_part_when_its_sender_ended_since(started,
                                                                            tmp_path):
    """Two inputs. Channel A's unaligned barrier makes the receiver snapshot and record
    what is in flight on B until B's barrier comes, or B's END_OF_INPUT. B's sender had
    announced barrier 1 aligned, with nothing before it, then sent seq 0 and ended (seq 1);
    both arrive before B's announcement. Seq 0 follows the barrier: it is no part of the
    checkpoint (B's sender emits it again after a restore)."""
    subtask, (a, b), master, upstream, downstream = started(
        tmp_path, "union", lambda env: _numbers(env, "a").union(_numbers(env, "b"))
        .rebalance().map_batches(lambda batch: batch, name="m").rebalance()
        .discard(name="out"))
    now = int(time.time() * 1000)
    announcements: list[BarrierReceived] = []
    net_b: list[Envelope] = []
    out_b = OutputChannel(b, attempt=0, credits=1, transmit=net_b.append)

    def announce_b(out_channel: OutputChannel, barrier: Barrier, upto: int) -> None:
        announcements.append(BarrierReceived(b, barrier, upto, out_channel.announce()))

    capture_b = BarrierForwarder({b: out_b}, announce_b).forward(
        Barrier(1, attempt=0, trigger_ts_ms=now, aligned_timeout_ms=600_000), unaligned=False)
    assert capture_b.done.is_set() and announcements[0].upto == -1  # nothing before it
    out_b.send(Kind.DATA, _batch(0), rows=1)  # after barrier 1
    out_b.send(Kind.END_OF_INPUT)
    subtask.post(BarrierReceived(a, Barrier(1, attempt=0, trigger_ts_ms=now, unaligned=True),
                                 -1, 1))
    forwarded, _ = _get(downstream.barriers, "barrier from the receiver")
    assert forwarded.checkpoint_id == 1 and forwarded.unaligned
    processed_before = _ids(downstream.data)
    for envelope in net_b:
        subtask.deliver(envelope)
    subtask.post(announcements.pop(0))
    inputs = _input_state(master, tmp_path)
    assert processed_before + _ids(inputs.get(b, [])) + _ids(capture_b.entries.get(b, [])) == []
    assert _ids(inputs.get(a, [])) == []
