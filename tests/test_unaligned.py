"""Unaligned checkpoints (FLIP-76) and aligned checkpoints with a timeout.

Two parts:

* unit tests of the channel-state logic without Ray: a sender's output
  channel, a network that delivers data and barrier announcements in any
  order, and a receiver's input gate with its recorder. Oracle: per channel,
  what the receiver consumed before its snapshot, then its recorded input
  state, then the sender's captured output state, is exactly the sequence
  the sender emitted before the barrier — nothing lost, doubled or reordered
  — whatever the interleaving;
* jobs after Flink's ``UnalignedCheckpointITCase``: sequence sources with
  unique increasing numbers per split, a partitioner that shifts the
  split-to-subtask mapping (rebalance, then hash by key), a map that fails at
  placed points, a sink that sleeps (heavy backpressure), one credit per
  channel; the committed output is checked against numpy over the same input.
"""

from __future__ import annotations

import random
import shutil
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raystream as rs
from raystream.actors.barrier_forwarder import BarrierForwarder
from raystream.actors.channel_state import InputStateRecorder, OutputStateCapture
from raystream.actors.channels import InputGate, OutputChannel
from raystream.actors.messages import REPLAYED_SEQ, ChannelId, Envelope, Kind
from raystream.checkpoint.barrier import Barrier, SnapshotKind
from raystream.actors.channel_state_file import decode_channel_state, encode_channel_state
from raystream.checkpoint.snapshot_stats import SnapshotStats

CH = ChannelId(edge=0, upstream=0, downstream=0)
N_CHECKPOINT = 5


# ---------------------------------------------------------------------------
# Unit tests: sender -> network (any order) -> receiver, without Ray
# ---------------------------------------------------------------------------

# the barrier of the unit tests: aligned with a timeout (unless forwarded unaligned)
# that has passed once the test says so
BARRIER = Barrier(N_CHECKPOINT, attempt=0, trigger_ts_ms=0, aligned_timeout_ms=1_000)


class _Sender:
    """An output channel whose subtask's BarrierForwarder announces barrier N_CHECKPOINT."""

    def __init__(self, credits: int, net_data: list, net_control: list) -> None:
        self.out = OutputChannel(CH, attempt=0, credits=credits, transmit=net_data.append)
        self.forwarder = BarrierForwarder({CH: self.out}, self._announce)
        self.net_control = net_control
        self.emitted: list[int] = []  # message ids in channel order
        self.before_barrier: list[int] | None = None  # ids emitted before the barrier
        self.capture: OutputStateCapture | None = None  # output channel state

    def emit(self, kind: Kind) -> None:
        if self.out.ended:
            return
        if kind == Kind.END_OF_INPUT:
            self.emitted.append("END")
            self.out.send(Kind.END_OF_INPUT)
            return
        ident = len(self.emitted)
        self.emitted.append(ident)
        if kind == Kind.DATA:
            self.out.send(Kind.DATA, [ident], rows=1)
        else:
            self.out.send(Kind.WATERMARK, ident)

    def _announce(self, out: OutputChannel, barrier: Barrier, upto: int) -> None:
        self.net_control.append((barrier.unaligned, upto, out.announce()))

    def forward(self, unaligned: bool) -> None:
        self.before_barrier = [i for i in self.emitted if i != "END"]
        self.capture = self.forwarder.forward(BARRIER, unaligned)

    def settle(self) -> None:
        """The subtask's loop round: data sent since settles an awaited channel."""
        self.forwarder.settle(lambda: 0)

    def time_out(self) -> None:
        """The aligned barrier's timeout passed: turn it unaligned if still queued."""
        self.forwarder.settle(lambda: float("inf"))

    @property
    def awaiting(self) -> int | None:
        return None if self.capture is None else self.capture.awaiting.get(CH)

    @property
    def captured(self) -> list[int | str]:
        entries = [] if self.capture is None else self.capture.entries.get(CH, [])
        return [_ident(e) for e in entries]


def _ident(envelope: Envelope) -> int | str:
    if envelope.kind == Kind.END_OF_INPUT:
        return "END"
    return envelope.payload[0] if envelope.kind == Kind.DATA else envelope.payload


class _Receiver:
    """An input gate that checkpoints like a subtask: aligned, or unaligned on an
    unaligned announcement or when told (its timeout, another channel's barrier)."""

    def __init__(self, sender: _Sender) -> None:
        self.gate = InputGate([(CH, 0)])
        self.sender = sender
        self.consumed: list[int] = []
        self.before_snapshot: list[int] | None = None
        self.recorder: InputStateRecorder | None = None
        self.recorded: list[int] | None = None  # the input state as of its completion
        self.ungranted = 0

    def note_completion(self) -> None:
        """Take the recorded input state the moment it is complete, as the snapshot
        thread does: nothing may change it afterwards."""
        if self.recorded is None and self.recorder is not None and self.recorder.done.is_set():
            self.recorded = [_ident(e) for e in self.recorder.entries()[CH]]

    @property
    def snapshotted(self) -> bool:
        return self.before_snapshot is not None

    def announcement(self, unaligned: bool, upto: int, index: int) -> None:
        """In the order of ``Subtask._on_barrier``: what the barrier handler makes of it
        (a bound of the recording, unless that is complete already; or the channel
        blocked at it), then the announcement counted; the snapshot in the next round."""
        if self.recorder is not None:
            if not self.recorder.done.is_set():
                self.recorder.on_barrier(CH, upto)
        elif not self.snapshotted:
            self.gate.add_barrier(CH, N_CHECKPOINT, upto)
        self.note_completion()
        self.gate.note_announcement(CH, index)
        self.note_completion()
        if self.recorder is None and not self.snapshotted:
            if unaligned:
                self.snapshot_unaligned()
            self.maybe_align()

    def maybe_align(self) -> None:
        if not self.snapshotted and self.gate.aligned_checkpoint() == N_CHECKPOINT:
            self.before_snapshot = list(self.consumed)  # aligned: no channel state
            self.gate.release_barrier(N_CHECKPOINT)

    def snapshot_unaligned(self) -> None:
        if self.snapshotted:
            return
        self.before_snapshot = list(self.consumed)
        self.recorder = InputStateRecorder(N_CHECKPOINT, self.gate)
        self.gate.recorders.append(self.recorder)
        self.gate.release_barrier(N_CHECKPOINT)

    def consume(self, grant_every: int) -> bool:
        envelope = self.gate.poll()
        if envelope is None:
            return False
        self.consumed.append(_ident(envelope))
        if envelope.kind == Kind.END_OF_INPUT:
            self.gate.channels[CH].finished = True
        if envelope.kind == Kind.DATA:
            self.ungranted += 1
            if self.ungranted >= grant_every:
                self.sender.out.add_credit(self.ungranted)
                self.ungranted = 0
        self.maybe_align()
        return True


@st.composite
def _channel_runs(draw):
    mode = draw(st.sampled_from(["unaligned", "aligned_timeout"]))
    credits = draw(st.integers(1, 3))
    actions = draw(st.lists(st.sampled_from(
        ["data", "data", "watermark", "deliver", "deliver", "announce", "consume", "consume",
         "forward", "snapshot", "time_out", "settle", "end"]), min_size=1, max_size=60))
    return mode, credits, actions, draw(st.integers(0, 2 ** 32 - 1)), draw(st.integers(1, 3))


@settings(max_examples=400)
@given(_channel_runs())
def test_consumed_then_input_state_then_output_state_is_what_preceded_the_barrier(run):
    mode, credits, actions, seed, grant_every = run
    rng = random.Random(seed)
    net_data: list[Envelope] = []
    net_control: list[tuple] = []
    sender = _Sender(credits, net_data, net_control)
    receiver = _Receiver(sender)

    def deliver_one() -> bool:
        if not net_data and not net_control:
            return False
        pool = rng.choice([p for p in (net_data, net_control) if p])
        item = pool.pop(rng.randrange(len(pool)))
        if pool is net_data:
            receiver.gate.add(item)
        else:
            receiver.announcement(*item)
        receiver.note_completion()
        return True

    for action in actions:
        if action in ("data", "watermark", "end"):
            sender.emit({"data": Kind.DATA, "watermark": Kind.WATERMARK,
                         "end": Kind.END_OF_INPUT}[action])
        elif action == "deliver":
            deliver_one()
        elif action == "announce" and net_control:
            receiver.announcement(*net_control.pop(rng.randrange(len(net_control))))
        elif action == "consume":
            receiver.consume(grant_every)
        elif action == "forward" and sender.before_barrier is None:
            sender.forward(unaligned=mode == "unaligned")
        elif action == "snapshot":  # another channel's barrier, or the alignment timeout
            receiver.snapshot_unaligned()
        elif action == "time_out" and mode == "aligned_timeout":
            sender.time_out()
        elif action == "settle":
            sender.settle()
        receiver.note_completion()
    if sender.before_barrier is None:
        sender.forward(unaligned=mode == "unaligned")
    for _ in range(3):
        sender.emit(Kind.DATA)  # after the barrier: must be in no part of the checkpoint
    # Run to the end: the sender's timeout fires, everything is delivered and consumed.
    sender.time_out()
    while deliver_one() or receiver.consume(grant_every):
        pass
    if receiver.ungranted:
        sender.out.add_credit(receiver.ungranted)
    while deliver_one() or receiver.consume(1):
        pass
    if not receiver.snapshotted:  # no barrier came (the sender ended first): a trigger
        assert sender.out.ended
        receiver.snapshot_unaligned()

    assert receiver.consumed == sender.emitted  # the channel itself: in order, complete
    assert receiver.snapshotted
    receiver.note_completion()
    recorded = []
    if receiver.recorder is not None:
        assert receiver.recorded is not None, "the input state never completed"
        recorded = receiver.recorded
    consumed_before = [i for i in receiver.before_snapshot if i != "END"]
    assert consumed_before + recorded + sender.captured == sender.before_barrier


def test_receiver_switched_to_unaligned_waits_for_its_sender_turning_the_barrier():
    """Aligned barrier with a timeout, queued behind data at the sender. The receiver
    times out first and records up to the aligned position; then the sender times
    out and announces the barrier again, ahead of its queue. The data it sends
    afterwards must not complete the receiver's input state before that second
    announcement is seen: it is the sender's output state now."""
    net_data: list[Envelope] = []
    net_control: list[tuple] = []
    sender = _Sender(1, net_data, net_control)
    receiver = _Receiver(sender)
    for _ in range(3):
        sender.emit(Kind.DATA)  # 0 is sent (one credit); 1 and 2 wait for credit
    sender.forward(unaligned=False)
    assert sender.awaiting == 2
    receiver.announcement(*net_control.pop())  # aligned, after seq 2
    receiver.snapshot_unaligned()  # the receiver's timeout
    receiver.gate.add(net_data.pop())
    receiver.consume(grant_every=1)  # seq 0, processed after the snapshot: recorded
    sender.time_out()  # seq 1 was sent on the returned credit; seq 2 is output state now
    assert sender.captured == [2]
    receiver.gate.add(net_data.pop())  # seq 1
    receiver.consume(grant_every=1)
    receiver.gate.add(net_data.pop())  # seq 2, sent after the second announcement
    assert not receiver.recorder.done.is_set()  # it waits for that announcement
    receiver.announcement(*net_control.pop())
    assert receiver.recorder.done.is_set()
    assert receiver.recorded == [0, 1]  # as the snapshot thread read it once complete


def test_a_message_sent_after_an_announcement_waits_for_it():
    """Data transmitted after a barrier announcement is held until the announcement
    is seen, whatever order the two arrive in."""
    net: list[Envelope] = []
    out = OutputChannel(CH, attempt=0, credits=4, transmit=net.append)
    gate = InputGate([(CH, 0)])
    out.send(Kind.DATA, ["before"], rows=1)
    index = out.announce()
    out.send(Kind.DATA, ["after"], rows=1)
    gate.add(net[0])
    gate.add(net[1])
    assert gate.poll().payload == ["before"]
    assert gate.poll() is None  # "after" waits for announcement 1
    gate.note_announcement(CH, index)
    assert gate.poll().payload == ["after"]


def test_announcements_seen_out_of_order_count_only_when_contiguous():
    gate = InputGate([(CH, 0)])
    gate.note_announcement(CH, 2)
    assert gate.channels[CH].announced == 0
    gate.note_announcement(CH, 1)
    assert gate.channels[CH].announced == 2


def test_sender_ended_before_the_barrier_is_recorded_up_to_end_of_input():
    gate = InputGate([(CH, 0)])
    gate.add(Envelope(CH, 0, 0, Kind.DATA, ["a"], 1))
    gate.poll()
    recorder = InputStateRecorder(3, gate)
    gate.recorders.append(recorder)
    gate.add(Envelope(CH, 2, 0, Kind.WATERMARK, 7))
    gate.add(Envelope(CH, 3, 0, Kind.END_OF_INPUT, announced=1))  # after an announcement
    gate.add(Envelope(CH, 1, 0, Kind.DATA, ["b"], 1))
    assert not recorder.done.is_set()  # announcement 1 (another checkpoint) not seen yet
    gate.note_announcement(CH, 1)
    assert recorder.done.is_set()
    assert [e.kind for e in recorder.entries()[CH]] == [Kind.DATA, Kind.WATERMARK]


def test_the_rest_of_a_half_processed_batch_leads_the_input_state():
    gate = InputGate([(CH, 0)])
    gate.restore_channel_state(CH, [Envelope(CH, REPLAYED_SEQ, 0, Kind.DATA, ["r0"], 1),
                                    Envelope(CH, REPLAYED_SEQ, 0, Kind.DATA, ["r1"], 1)])
    in_progress = gate.poll()  # r0, being processed in slices when the snapshot comes
    gate.add(Envelope(CH, 0, 0, Kind.DATA, ["a"], 1))
    rest = Envelope(CH, REPLAYED_SEQ, 0, Kind.DATA, ["rest of r0"], 1)
    recorder = InputStateRecorder(2, gate, partial={CH: rest})
    recorder.on_barrier(CH, 1)
    assert in_progress.payload == ["r0"] and not recorder.done.is_set()
    gate.recorders.append(recorder)
    gate.add(Envelope(CH, 1, 0, Kind.DATA, ["b"], 1))
    assert recorder.done.is_set()
    assert [e.payload for e in recorder.entries()[CH]] == [["rest of r0"], ["r1"], ["a"], ["b"]]


def test_restored_input_state_is_consumed_first_and_counts_before_a_new_barrier():
    gate = InputGate([(CH, 0)])
    replayed = [Envelope(CH, REPLAYED_SEQ, 0, Kind.DATA, [f"r{i}"], 1) for i in range(2)]
    gate.restore_channel_state(CH, replayed)
    gate.add_barrier(CH, 9, -1)  # a barrier before any message of this attempt
    assert gate.aligned_checkpoint() is None  # the replayed messages come before it
    gate.add(Envelope(CH, 0, 0, Kind.DATA, ["new"], 1))
    assert gate.poll().payload == ["r0"]
    recorder = InputStateRecorder(9, gate)  # unaligned now: the rest of the replay is state
    assert recorder.done.is_set()
    assert [e.payload for e in recorder.entries()[CH]] == [["r1"]]
    assert gate.poll().payload == ["r1"]
    assert gate.aligned_checkpoint() == 9 and gate.poll() is None


def test_channel_state_file_round_trip_keeps_order_kinds_and_rows():
    a, b = ChannelId(0, 0, 1), ChannelId(2, 1, 0)
    batches = [pa.record_batch({"x": np.arange(i, i + 3), "s": ["u", None, "w"]})
               for i in range(3)]
    inputs = {a: [(Kind.DATA, batches[0], 3), (Kind.WATERMARK, -(1 << 63), 0),
                  (Kind.DATA, batches[1], 3)]}
    outputs = {b: [(Kind.WATERMARK, 5, 0), (Kind.DATA, batches[2], 3)]}
    state = decode_channel_state(encode_channel_state(inputs, outputs), attempt=4)
    for decoded, original in ((state.inputs, inputs), (state.outputs, outputs)):
        assert list(decoded) == list(original)
        for channel, envelopes in decoded.items():
            assert all(e.seq == REPLAYED_SEQ and e.attempt == 4 and e.channel == channel
                       for e in envelopes)
            assert [e.kind for e in envelopes] == [k for k, _, _ in original[channel]]
            for e, (kind, value, rows) in zip(envelopes, original[channel]):
                if kind == Kind.DATA:
                    assert e.payload[0].equals(value) and e.rows == rows
                else:
                    assert e.payload == value


def test_checkpoint_config_modes():
    assert rs.CheckpointConfig().alignment == "aligned"
    assert rs.CheckpointConfig(unaligned=True).alignment == "unaligned"
    assert rs.CheckpointConfig(mode="unaligned").unaligned
    assert rs.CheckpointConfig(aligned_timeout=0.2).alignment == "aligned_timeout"
    with pytest.raises(ValueError, match="max_concurrent must be 1"):
        rs.CheckpointConfig(unaligned=True, max_concurrent=2)
    with pytest.raises(ValueError, match="max_concurrent must be 1"):
        rs.CheckpointConfig(aligned_timeout=1.0, max_concurrent=3)
    with pytest.raises(ValueError, match="contradicts"):
        rs.CheckpointConfig(mode="aligned", unaligned=True)
    with pytest.raises(ValueError, match="mode must be"):
        rs.CheckpointConfig(mode="sometimes")
    assert rs.CheckpointConfig(max_concurrent=2).max_concurrent == 2  # aligned: as before


# ---------------------------------------------------------------------------
# The coordinator: barriers, statistics, metadata, restore (no Ray)
# ---------------------------------------------------------------------------

def _coordinator(tmp_path, topology: str = "#0 [a] x2", **config):
    from raystream.checkpoint.coordinator import CheckpointCoordinator
    from raystream.core.failpoints import Failpoints

    barriers: list = []
    coordinator = CheckpointCoordinator(
        config=rs.CheckpointConfig(storage=str(tmp_path), timeout_s=1e6, **config),
        job_key="job", job_name="job", subtasks=[(0, 0), (0, 1)], max_parallelism=128,
        topology=topology, send_trigger=barriers.append, notify_complete=lambda n: None,
        notify_aborted=lambda n: None, failpoints=Failpoints((), "coordinator", None, 0))
    return coordinator, barriers


def test_barriers_carry_the_mode_and_savepoints_stay_aligned(tmp_path):
    unaligned, barriers = _coordinator(tmp_path / "u", unaligned=True)
    unaligned.trigger()
    unaligned.trigger(SnapshotKind.SAVEPOINT, savepoint_target=str(tmp_path / "sp"))
    assert [(b.unaligned, b.aligned_timeout_ms) for b in barriers] == [(True, None),
                                                                       (False, None)]
    timeout, barriers = _coordinator(tmp_path / "t", aligned_timeout=0.25)
    timeout.trigger()
    assert (barriers[0].unaligned, barriers[0].aligned_timeout_ms) == (False, 250)
    assert barriers[0].timeout_at_ms == barriers[0].trigger_ts_ms + 250


def test_statistics_metadata_and_restore_of_channel_state(tmp_path):
    coordinator, _ = _coordinator(tmp_path, unaligned=True)
    n = coordinator.trigger()
    blob = encode_channel_state({CH: [(Kind.WATERMARK, 3, 0)]}, {})
    written = coordinator.storage.write_state("job", n, "a_1.channels", blob)
    handle = written.to_json()
    coordinator.acknowledge(0, n, (0, 0), {}, SnapshotStats(alignment_s=0.5))
    coordinator.acknowledge(0, n, (0, 1), {}, SnapshotStats(
        size=handle["size"], alignment_s=0.125, unaligned=True, channel_state=written,
        channel_state_key="a#1"))
    (stats,) = coordinator.stats()
    assert stats.status == "COMPLETED" and stats.unaligned
    assert (stats.alignment_s, stats.channel_state_bytes) == (0.5, handle["size"])
    metadata = coordinator.storage.read_metadata("job", n)
    assert metadata["channel_state"] == {"a#1": handle} and handle in metadata["handles"]
    assert coordinator.restore_spec().channel_state == {"a#1": written}

    path = str(tmp_path / "job")
    same, _ = _coordinator(tmp_path / "other", topology="#0 [a] x2")
    assert same.restore_from(path).channel_state == {"a#1": written}
    rescaled, _ = _coordinator(tmp_path / "other", topology="#0 [a] x3")
    with pytest.raises(ValueError, match="(?s)channel state.*same parallelism"):
        rescaled.restore_from(path)


# ---------------------------------------------------------------------------
# Jobs (after Flink's UnalignedCheckpointITCase)
# ---------------------------------------------------------------------------

N_NUMBERS, N_OTHERS, N_BROADCAST = 16_000, 1_500, 60
SPLITS = 4
KEYS = 11
OUT_SCHEMA = pa.schema([(c, pa.int64()) for c in ("src", "i", "k", "n", "t")])


def numbers(i: np.ndarray) -> dict:  # src 0: unique increasing numbers per split
    # wide rows (padding): a received batch is bigger than the slice an unaligned
    # checkpoint may be taken after, so snapshots also fall inside batches
    padding = {f"pad{j}": i for j in range(10)}
    return {"src": np.zeros(len(i), np.int64), "i": i, "k": (i * 7) % KEYS, "ts": i, **padding}


def others(i: np.ndarray) -> dict:  # src 1: through a rebalance
    return {"src": np.ones(len(i), np.int64), "i": i, "k": (i * 5) % KEYS, "ts": i * 4}


def broadcasts(i: np.ndarray) -> dict:  # src 2: broadcast to every subtask
    return {"src": np.full(len(i), 2, np.int64), "i": i, "k": i % KEYS, "ts": i * 100}


def window_end(ts):
    return (ts // 1000 + 1) * 1000


class Track(rs.KeyedProcessFunction):
    """Numbers each key's records (keyed state) and fires one timer per key and second."""

    def open(self, ctx):
        self.count = ctx.value_state("n", default=0)

    def process_element(self, row, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        ctx.register_event_time_timer(window_end(row["ts"]))
        yield {"src": row["src"], "i": row["i"], "k": row["k"], "n": n, "t": -1}

    def on_timer(self, timestamp, ctx):
        yield {"src": -1, "i": -1, "k": ctx.current_key, "n": -1, "t": timestamp}


def sleepy(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.01)  # a slow sink: every queue upstream stays full
    return batch


def build_itcase_job(env: rs.StreamEnvironment, parallelism: int) -> rs.SinkHandle:
    """others --rebalance--> union <--broadcast-- broadcasts; numbers --hash--> co (two
    inputs) <--hash-- union; co --hash--> track (keyed state, timers) -> slow sink."""
    wm = rs.BoundedOutOfOrderness("ts")
    a = env.from_sequence(N_NUMBERS, numbers, batch_size=800, num_splits=SPLITS,
                          name="numbers", watermarks=wm, parallelism=parallelism)
    b = env.from_sequence(N_OTHERS, others, batch_size=50, num_splits=2, name="others",
                          watermarks=wm, parallelism=1)
    c = env.from_sequence(N_BROADCAST, broadcasts, batch_size=10, num_splits=1,
                          name="broadcasts", watermarks=wm, parallelism=1)
    merged = b.rebalance().union(c.broadcast())
    co = a.key_by("k").connect(merged.key_by("k")).map_batches(lambda x: x, lambda x: x,
                                                               name="co")
    tracked = co.key_by("k").process(Track(), name="track", schema=OUT_SCHEMA)
    return tracked.map_batches(sleepy, name="slow").collect(name="out")


def assert_itcase_output(table: pa.Table, parallelism: int) -> None:
    """Zero lost, zero duplicates, zero out of order, against numpy over the same input."""
    out = {c: table.column(c).to_numpy() for c in OUT_SCHEMA.names}
    records = out["src"] >= 0
    src, i, k, n = (out[c][records] for c in ("src", "i", "k", "n"))
    # every input record exactly once (broadcast ones once per subtask of the union)
    for source, total, copies in ((0, N_NUMBERS, 1), (1, N_OTHERS, 1),
                                  (2, N_BROADCAST, parallelism)):
        got = np.sort(i[src == source])
        assert np.array_equal(got, np.repeat(np.arange(total), copies)), f"source {source}"
    # keyed state exactly once: each key's records are numbered 1..count
    expected_keys = np.concatenate([numbers(np.arange(N_NUMBERS))["k"],
                                    others(np.arange(N_OTHERS))["k"],
                                    np.repeat(broadcasts(np.arange(N_BROADCAST))["k"],
                                              parallelism)])
    for key in range(KEYS):
        assert np.array_equal(np.sort(n[k == key]),
                              np.arange(1, (expected_keys == key).sum() + 1)), f"key {key}"
    # per (split, key) the numbers went one path: they must come out in order
    a = src == 0
    order = np.lexsort((n[a], k[a]))  # by key, then by the key's record number
    a_i, a_k = i[a][order], k[a][order]
    split = a_i * SPLITS // N_NUMBERS
    for s in range(SPLITS):
        for key in range(KEYS):
            seq = a_i[(split == s) & (a_k == key)]
            assert np.all(np.diff(seq) > 0), f"split {s}, key {key}: out of order"
    # timers: one per key and second of event time, fired exactly once
    timers = np.sort(out["k"][~records] * 10**9 + out["t"][~records])
    ts = np.concatenate([numbers(np.arange(N_NUMBERS))["ts"], others(np.arange(N_OTHERS))["ts"],
                         broadcasts(np.arange(N_BROADCAST))["ts"]])
    keys = np.concatenate([numbers(np.arange(N_NUMBERS))["k"], others(np.arange(N_OTHERS))["k"],
                           broadcasts(np.arange(N_BROADCAST))["k"]])
    assert np.array_equal(timers, np.unique(keys * 10**9 + window_end(ts)))


@pytest.fixture
def storage(tmp_path):
    path = tmp_path / "checkpoints"
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


FAILURES = {
    "in_processing": lambda attempt: rs.Failpoint("in_processing", operator="co", subtask=0,
                                                  hit=12, attempt=attempt, action="raise"),
    "in_snapshot": lambda attempt: rs.Failpoint("in_snapshot", operator="co", subtask=0,
                                                hit=2, attempt=attempt),
    "right_after_restore": lambda attempt: rs.Failpoint("right_after_restore", operator="co",
                                                        subtask=0, attempt=attempt),
}
MODES = {"aligned": {}, "unaligned": {"unaligned": True},
         "aligned_timeout": {"aligned_timeout": 0.02}}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism, mode, failures", [
    (1, "aligned", ["in_processing"]),
    (2, "unaligned", ["in_processing", "in_snapshot", "right_after_restore"]),
    (3, "aligned_timeout", ["in_snapshot", "right_after_restore"]),
])
def test_exactly_once_under_backpressure_and_failures(ray_session, storage, parallelism, mode,
                                                      failures):
    env = rs.StreamEnvironment(
        parallelism=parallelism, credits=1,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=storage, **MODES[mode]),
        restart=rs.RestartStrategy.fixed_delay(len(failures), 0.0),
        failpoints=[FAILURES[f](attempt) for attempt, f in enumerate(failures)])
    sink = build_itcase_job(env, parallelism)
    result = env.execute(f"itcase-{mode}-{parallelism}")
    assert result.restarts == len(failures), result.failures
    for failure, reason in zip(failures, result.failures):
        assert (f"failpoint {failure}" in reason if failure == "in_processing"
                else "died" in reason), result.failures
    assert_itcase_output(result.table(sink), parallelism)
    completed = [c for c in result.checkpoints if c.status == "COMPLETED"]
    assert len(completed) >= len(failures) + 1, result.checkpoints
    if mode == "aligned":
        assert not any(c.unaligned or c.channel_state_bytes for c in completed)
    else:  # under this backpressure barriers overtake data, and a restore replays it
        assert any(c.unaligned and c.channel_state_bytes > 0 for c in completed)
        by_id = {c.checkpoint_id: c for c in completed}
        restored = [by_id[r["checkpoint_id"]] for r in result.restores if r["checkpoint_id"]]
        assert any(c.channel_state_bytes > 0 for c in restored), (result.restores, completed)


def test_exactly_once_parquet_sink_with_unaligned_checkpoints(ray_session, storage, tmp_path):
    """Sink V2 under unaligned checkpoints: committables may travel as channel state
    (committed a checkpoint later); a failure in the background write and one in the
    middle of a commit still leave every row committed exactly once."""
    from tests.support.oracles import assert_exactly_once
    from tests.support.pipelines import build_job

    failpoints = [rs.Failpoint("in_async_write", operator="sum", subtask=0, hit=2, attempt=0),
                  rs.Failpoint("mid_commit", operator="out-committer", hit=2, attempt=1)]
    env = rs.StreamEnvironment(
        parallelism=2, credits=1, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=0.25, storage=storage, unaligned=True),
        restart=rs.RestartStrategy.fixed_delay(2, 0.0))
    sink = build_job(env, str(tmp_path / "parquet"))
    result = env.execute("unaligned-parquet")
    assert result.restarts == 2 and all("died" in f for f in result.failures), result.failures
    assert "out-committer" in result.failures[1]
    assert any(c.channel_state_bytes > 0 for c in result.checkpoints if c.status == "COMPLETED")
    assert_exactly_once(result.table(sink))
