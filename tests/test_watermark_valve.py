"""The watermark valve of a subtask's input against a model written apart: per channel
the highest watermark seen (an ended channel: the end of time), combined as the lowest
of them, emitted only when it rises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK
from raystream.actors.stream_input import WatermarkValve

CHANNELS = ["a", "b", "c"]
events = st.lists(st.tuples(st.sampled_from(CHANNELS),
                            st.one_of(st.integers(-1_000, 1_000), st.just(None))),
                  max_size=60)


@given(events, st.one_of(st.none(), st.integers(-1_000, 1_000)))
def test_the_valve_emits_each_rise_of_the_lowest_channel_watermark_once(steps, restored):
    valve = WatermarkValve(CHANNELS)
    highest = {c: MIN_WATERMARK for c in CHANNELS}
    if restored is not None:
        valve.restore(restored)
        highest = {c: restored for c in CHANNELS}
    emitted_before = max(MIN_WATERMARK, restored if restored is not None else MIN_WATERMARK)
    for channel, watermark in steps:
        if watermark is None:  # the channel ended
            got = valve.channel_ended(channel)
            highest[channel] = MAX_WATERMARK
        else:
            got = valve.input_watermark(channel, watermark)
            highest[channel] = max(highest[channel], watermark)
        low = min(highest.values())
        assert got == (low if low > emitted_before else None)
        emitted_before = max(emitted_before, low)
        assert valve.current == emitted_before
        assert valve.of(channel) == highest[channel]
