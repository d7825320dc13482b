"""Unit tests (no Ray) of the input gate and the output channel's credit-based flow control.

Oracles are small models computed here: per-channel sequence order (the
contiguous prefix of delivered sequence numbers), a FIFO with a credit
budget, and a bounded-waiting property of round-robin polling.
"""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raystream.actors.channels import InputGate, OutputChannel
from raystream.actors.credit_limit import MIN_CREDITS, PERIOD_S, CreditLimit, initial_credits
from raystream.actors.messages import ChannelId, Envelope, Kind

pytestmark = pytest.mark.timeout(120)


def _channels(n: int, edge: int = 0) -> list[ChannelId]:
    return [ChannelId(edge=edge, upstream=u, downstream=0) for u in range(n)]


def _envelope(ch: ChannelId, seq: int, kind: Kind = Kind.DATA, payload=None) -> Envelope:
    if payload is None:
        payload = (ch.upstream, seq)  # identifies the message
    return Envelope(ch, seq, 0, kind, payload)


# ---------------------------------------------------------------------------
# InputGate: ordering
# ---------------------------------------------------------------------------

@st.composite
def _arrivals(draw):
    """Per channel a message count, and one interleaving of all messages in a random order,
    with a random number of polls after each arrival."""
    counts = draw(st.lists(st.integers(0, 12), min_size=1, max_size=4))
    messages = [(c, s) for c, n in enumerate(counts) for s in range(n)]
    order = draw(st.permutations(messages))
    polls = draw(st.lists(st.integers(0, 3), min_size=len(order), max_size=len(order)))
    return counts, order, polls


@given(_arrivals())
def test_gate_outputs_each_channel_in_sequence_order(case):
    counts, order, polls = case
    channels = _channels(len(counts))
    gate = InputGate([(ch, 0) for ch in channels])
    delivered: list[set[int]] = [set() for _ in counts]
    out: list[list[int]] = [[] for _ in counts]

    def model_ready() -> int:
        """Messages the model says can be handed out now: per channel, the contiguous
        prefix of delivered sequence numbers minus what has already come out."""
        total = 0
        for c in range(len(counts)):
            k = 0
            while k in delivered[c]:
                k += 1
            total += k - len(out[c])
        return total

    def poll_once() -> bool:
        ready = model_ready()
        assert gate.has_ready() == (ready > 0)
        env = gate.poll()
        if ready == 0:
            assert env is None
            return False
        assert env is not None
        c = env.channel.upstream
        assert env.channel == channels[c]
        assert env.payload == (c, env.seq)
        # the next message of a channel is always the next sequence number
        assert env.seq == len(out[c])
        out[c].append(env.seq)
        return True

    for (c, seq), n_polls in zip(order, polls):
        gate.add(_envelope(channels[c], seq))
        delivered[c].add(seq)
        for _ in range(n_polls):
            poll_once()
    while poll_once():
        pass
    assert out == [list(range(n)) for n in counts]
    assert gate.poll() is None and not gate.has_ready()


@given(st.permutations(list(range(10))))
def test_gate_waits_for_gaps_with_mixed_kinds(order):
    """Data, watermarks and end-of-input share one sequence space: whatever the kind,
    nothing after a gap comes out before the gap is filled."""
    ch = _channels(1)[0]
    kinds = [Kind.DATA, Kind.WATERMARK] * 4 + [Kind.DATA, Kind.END_OF_INPUT]
    gate = InputGate([(ch, 0)])
    got = []
    for seq in order:
        gate.add(_envelope(ch, seq, kinds[seq], payload=seq))
        while (env := gate.poll()) is not None:
            got.append((env.seq, env.kind))
        assert [s for s, _ in got] == list(range(len(got)))
    assert got == list(enumerate(kinds))


def test_gate_duplicates_raise_and_leave_state_intact():
    a, b = _channels(2)
    gate = InputGate([(a, 0), (b, 1)])
    gate.add(_envelope(a, 1, payload="first a1"))
    # a duplicate of a pending (out-of-order) message
    with pytest.raises(RuntimeError, match="duplicate"):
        gate.add(_envelope(a, 1, payload="second a1"))
    gate.add(_envelope(a, 0, payload="a0"))
    assert gate.poll().payload == "a0"
    assert gate.poll().payload == "first a1"  # the duplicate did not replace the original
    # a duplicate of a message already handed out
    for seq in (0, 1):
        with pytest.raises(RuntimeError, match="duplicate"):
            gate.add(_envelope(a, seq))
    # same sequence number on another channel is not a duplicate
    gate.add(_envelope(b, 0, payload="b0"))
    env = gate.poll()
    assert (env.channel, env.payload) == (b, "b0")
    assert gate.poll() is None


def test_gate_rejects_unknown_channel():
    a, b = _channels(2)
    gate = InputGate([(a, 0)])
    with pytest.raises(KeyError):
        gate.add(_envelope(b, 0))
    with pytest.raises(KeyError):
        gate.add(_envelope(ChannelId(edge=1, upstream=0, downstream=0), 0))


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30)), max_size=40))
def test_gate_duplicate_detection_matches_model(adds):
    """Adding (channel, seq) raises iff that pair was added before (model: a set)."""
    channels = _channels(6)
    gate = InputGate([(ch, 0) for ch in channels])
    seen = set()
    for c, seq in adds:
        if (c, seq) in seen:
            with pytest.raises(RuntimeError):
                gate.add(_envelope(channels[c], seq))
        else:
            gate.add(_envelope(channels[c], seq))
            seen.add((c, seq))
        # poll sometimes so that some duplicates hit already-consumed numbers
        if seq % 3 == 0:
            gate.poll()


def test_gate_input_index_is_kept_per_channel():
    a, b = _channels(2)
    gate = InputGate([(a, 0), (b, 1)])
    assert {ch.channel: ch.input_index for ch in gate} == {a: 0, b: 1}
    assert len(gate) == 2 and not gate.all_finished()


# ---------------------------------------------------------------------------
# InputGate: round-robin fairness
# ---------------------------------------------------------------------------

def test_gate_round_robin_when_all_channels_are_busy():
    n, per_channel = 4, 25
    channels = _channels(n)
    gate = InputGate([(ch, 0) for ch in channels])
    for ch in channels:
        for seq in range(per_channel):
            gate.add(_envelope(ch, seq))
    served = [gate.poll().channel.upstream for _ in range(n * per_channel)]
    # in every window of n consecutive polls each channel is served exactly once
    for start in range(0, n * per_channel - n + 1):
        assert sorted(served[start:start + n]) == list(range(n)), served[start:start + n]
    assert gate.poll() is None


def test_gate_flooded_channel_does_not_starve_a_slow_one():
    fast, slow = _channels(2)
    gate = InputGate([(fast, 0), (slow, 0)])
    for seq in range(1000):
        gate.add(_envelope(fast, seq))
    served = []
    for seq in range(5):
        gate.add(_envelope(slow, seq))
        # the slow channel's message comes out within two polls
        first_two = [gate.poll().channel for _ in range(2)]
        assert slow in first_two
        served += first_two
    assert served.count(slow) == 5


@st.composite
def _fairness_case(draw):
    n = draw(st.integers(2, 5))
    steps = draw(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, n - 1),
                                              st.integers(1, 4)),
                                    st.tuples(st.just("poll"), st.integers(1, 6))),
                          min_size=1, max_size=60))
    return n, steps


@given(_fairness_case())
def test_gate_bounded_waiting(case):
    """A channel that has a message ready is served within n polls (n = number of
    channels), however the other channels are loaded."""
    n, steps = case
    channels = _channels(n)
    gate = InputGate([(ch, 0) for ch in channels])
    next_seq = [0] * n
    backlog = [0] * n  # model: messages ready per channel (all added in order)
    waited = [0] * n  # polls a ready channel has waited without being served
    for step in steps:
        if step[0] == "add":
            _, c, k = step
            for _ in range(k):
                gate.add(_envelope(channels[c], next_seq[c]))
                next_seq[c] += 1
            backlog[c] += k
            continue
        for _ in range(step[1]):
            env = gate.poll()
            if not any(backlog):
                assert env is None
                continue
            c = env.channel.upstream
            assert backlog[c] > 0
            backlog[c] -= 1
            for other in range(n):
                if other == c or backlog[other] == 0:
                    waited[other] = 0
                else:
                    waited[other] += 1
                    assert waited[other] < n, f"channel {other} starved for {waited[other]} polls"
            waited[c] = 0


# ---------------------------------------------------------------------------
# OutputChannel: credits
# ---------------------------------------------------------------------------

def test_output_channel_control_messages_wait_behind_data_without_credit():
    sent: list[Envelope] = []
    out = OutputChannel(ChannelId(0, 0, 0), attempt=3, credits=1, transmit=sent.append)
    out.send(Kind.WATERMARK, 10)     # seq 0: free
    out.send(Kind.DATA, ["a"], rows=2)  # seq 1: takes the only credit
    out.send(Kind.WATERMARK, 20)     # seq 2: free, nothing waits before it
    out.send(Kind.DATA, ["b"], rows=5)  # seq 3: no credit -> waits
    out.send(Kind.WATERMARK, 30)     # seq 4: free, but must stay behind seq 3
    out.send(Kind.END_OF_INPUT)      # seq 5: idem
    assert [(e.seq, e.kind) for e in sent] == [(0, Kind.WATERMARK), (1, Kind.DATA),
                                               (2, Kind.WATERMARK)]
    assert out.backlogged()
    assert out.batches_sent == 1 and out.rows_sent == 2
    out.add_credit(1)
    assert [(e.seq, e.kind, e.payload) for e in sent[3:]] == [
        (3, Kind.DATA, ["b"]), (4, Kind.WATERMARK, 30), (5, Kind.END_OF_INPUT, None)]
    assert not out.backlogged()
    assert out.batches_sent == 2 and out.rows_sent == 7
    assert all(e.attempt == 3 and e.channel == ChannelId(0, 0, 0) for e in sent)


def test_output_channel_without_data_needs_no_credit():
    sent: list[Envelope] = []
    out = OutputChannel(ChannelId(0, 0, 0), attempt=0, credits=0, transmit=sent.append)
    for wm in range(5):
        out.send(Kind.WATERMARK, wm)
    out.send(Kind.END_OF_INPUT)
    assert [e.seq for e in sent] == list(range(6)) and not out.backlogged()


@st.composite
def _flow_case(draw):
    credits = draw(st.integers(1, 4))
    actions = draw(st.lists(st.sampled_from(["data", "data", "watermark", "deliver", "deliver",
                                             "consume", "consume"]),
                            max_size=80))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    grant_every = draw(st.integers(1, 3))  # credits go back in batches, as the subtask does
    return credits, actions, seed, grant_every


@given(_flow_case())
def test_credits_bound_unconsumed_data_end_to_end(case):
    """Sender -> (Ray: any delivery order) -> InputGate -> consumer that returns credit
    after processing. Model: the sender's messages as a FIFO; the transmitted ones are
    always its longest prefix whose DATA count fits the credit granted so far, and the
    data batches sent but not yet consumed never exceed the initial credit."""
    import random

    credits, actions, seed, grant_every = case
    rng = random.Random(seed)
    ch = ChannelId(0, 0, 0)
    in_flight: list[Envelope] = []
    transmitted: list[Envelope] = []

    def transmit(env: Envelope) -> None:
        transmitted.append(env)
        in_flight.append(env)

    out = OutputChannel(ch, attempt=0, credits=credits, transmit=transmit)
    gate = InputGate([(ch, 0)])
    produced: list[tuple[Kind, int]] = []  # model FIFO of what the sender was asked to send
    granted = credits
    consumed_data = 0
    ungranted = 0
    received: list[tuple[Kind, int]] = []

    def model_transmitted() -> int:
        budget, k = granted, 0
        for kind, _ in produced:
            if kind == Kind.DATA:
                if budget == 0:
                    break
                budget -= 1
            k += 1
        return k

    def check() -> None:
        assert [(e.kind, e.payload[0] if e.kind == Kind.DATA else e.payload)
                for e in transmitted] == produced[:model_transmitted()]
        assert [e.seq for e in transmitted] == list(range(len(transmitted)))
        sent_data = sum(1 for e in transmitted if e.kind == Kind.DATA)
        assert sent_data - consumed_data <= credits
        assert out.backlogged() == (len(transmitted) < len(produced))

    for i, action in enumerate(actions):
        if action == "data":
            produced.append((Kind.DATA, i))
            out.send(Kind.DATA, [i], rows=1)
        elif action == "watermark":
            produced.append((Kind.WATERMARK, i))
            out.send(Kind.WATERMARK, i)
        elif action == "deliver" and in_flight:
            gate.add(in_flight.pop(rng.randrange(len(in_flight))))
        elif action == "consume":
            env = gate.poll()
            if env is not None:
                received.append((env.kind, env.payload[0] if env.kind == Kind.DATA else env.payload))
                if env.kind == Kind.DATA:
                    consumed_data += 1
                    ungranted += 1
                    if ungranted >= grant_every:
                        granted += ungranted
                        out.add_credit(ungranted)
                        ungranted = 0
        check()

    # drain: return the credit still held back, deliver and consume everything
    if ungranted:
        granted += ungranted
        out.add_credit(ungranted)
        ungranted = 0
    out.send(Kind.END_OF_INPUT)
    produced.append((Kind.END_OF_INPUT, None))
    for _ in range(len(produced) + 1):
        while in_flight:
            gate.add(in_flight.pop(rng.randrange(len(in_flight))))
        while (env := gate.poll()) is not None:
            received.append((env.kind, env.payload[0] if env.kind == Kind.DATA else env.payload))
            if env.kind == Kind.DATA:
                consumed_data += 1
                granted += 1
                out.add_credit(1)
            check()
    assert received == produced
    assert not out.backlogged()
    assert out.batches_sent == sum(1 for k, _ in produced if k == Kind.DATA)


def test_credit_counter_counts_only_data():
    sent: list[Envelope] = []
    out = OutputChannel(ChannelId(0, 0, 0), attempt=0, credits=2, transmit=sent.append)
    kinds = collections.Counter()
    for i in range(6):
        out.send(Kind.DATA, [i], rows=1)
        out.send(Kind.WATERMARK, i)
    for e in sent:
        kinds[e.kind] += 1
    # two data batches and the watermarks between them; the rest waits
    assert [(e.seq, e.kind) for e in sent] == [(0, Kind.DATA), (1, Kind.WATERMARK),
                                               (2, Kind.DATA), (3, Kind.WATERMARK)]
    assert out.credits == 0
    out.add_credit(10)
    assert len(sent) == 12 and out.credits == 10 - 4


# ---------------------------------------------------------------------------
# RecordWriter: buffering per channel
# ---------------------------------------------------------------------------

def test_record_writer_keeps_every_row_when_the_schema_changes():
    """A batch of another schema flushes the pending rows first (one object holds one
    schema); the new batch must still be buffered and sent, in order."""
    import pyarrow as pa

    from raystream.actors.partitioners import ForwardPartitioner
    from raystream.actors.record_writer import RecordWriter

    sent: list[Envelope] = []
    out = OutputChannel(ChannelId(0, 0, 0), attempt=0, credits=100, transmit=sent.append)
    writer = RecordWriter(ForwardPartitioner(), [out], buffer_bytes=100)
    narrow = pa.record_batch({"x": [1, 2]})
    wide = pa.record_batch({"x": list(range(3, 20)), "y": list(range(17))})  # > buffer_bytes
    writer.emit(narrow)
    writer.emit(wide)
    writer.emit(narrow)
    writer.flush()
    rows = [x for e in sent for x in e.payload[0].column("x").to_pylist()]
    assert rows == [1, 2] + list(range(3, 20)) + [1, 2]


@given(per_period=st.floats(0.01, 200), message=st.integers(1_000, 4_000_000),
       channels=st.integers(1, 8), credits=st.integers(1, 16),
       target=st.sampled_from([0.01, 0.2, 1.0]), start=st.floats(0, 1e6))
def test_credit_limit_settles_at_the_credits_the_target_time_needs(per_period, message, channels,
                                                                  credits, target, start):
    """Fed a steady rate of equal messages, the limit settles at ceil(rate x target /
    (channels x message)) credits per sender, never below MIN_CREDITS nor above the job's
    credits, and it is within those bounds at every step; before it has seen a message
    it allows what a sender starts with (initial_credits)."""
    rate = per_period * message / PERIOD_S  # bytes per second
    limit = CreditLimit(target_s=target, channels=channels, credits=credits)
    floor = min(MIN_CREDITS, credits)
    now, owed, consumed = start, 0.0, 0
    limit.update(now)
    for _ in range(40):
        now += PERIOD_S
        owed += rate * PERIOD_S
        while owed >= message:
            limit.consumed(message)
            owed -= message
            consumed += 1
        limit.update(now)
        assert floor <= limit.allowed <= credits
    if consumed == 0:
        assert limit.allowed == initial_credits(credits, True)  # nothing measured yet
    elif rate * PERIOD_S >= message:  # a message or more every period: a steady rate
        # whole messages per period make the measured rate step by up to one message
        wanted = [k / PERIOD_S * target / channels for k in (math.floor(per_period),
                                                             math.ceil(per_period))]
        low, high = (min(credits, max(floor, math.ceil(w * f))) for w, f in zip(wanted, (0.9, 1.1)))
        assert low <= limit.allowed <= high


def test_credit_limit_refuses_a_target_that_is_not_positive():
    with pytest.raises(ValueError, match="must be > 0 s"):
        CreditLimit(target_s=0, channels=1, credits=8)
