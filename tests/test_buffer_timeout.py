"""The output buffer timeout (``buffer_timeout_ms``): where it reaches, and that it
changes when rows are sent, never what is sent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from raystream.actors.record_writer import DEFAULT_BUFFER_TIMEOUT_MS
from raystream.actors.subtask import Subtask
from raystream.actors.subtask_spec import SubtaskSpec

N, KEYS = 60_000, 13


def columns(i: np.ndarray) -> dict:
    return {"k": i % KEYS, "ts": i // 7, "v": i}


def job(buffer_timeout_ms: float | None) -> tuple[rs.StreamEnvironment, dict]:
    """Two shuffles and an event-time window: flushes before watermarks matter."""
    env = (rs.StreamEnvironment(parallelism=2) if buffer_timeout_ms is None
           else rs.StreamEnvironment(parallelism=2, buffer_timeout_ms=buffer_timeout_ms))
    rows = env.from_sequence(N, columns, batch_size=1000, name="numbers",
                             watermarks=rs.BoundedOutOfOrderness("ts", 0))
    doubled = rows.key_by("k").map_batches(
        lambda b: {"k": b["k"], "ts": b["ts"], "v2": np.asarray(b["v"]) * 2}, name="double")
    counts = doubled.key_by("k").window(rs.TumblingEventTimeWindows(1000), timestamp="ts").count()
    return env, {"rows": doubled.rebalance().collect(name="rows"), "counts": counts.collect()}


def writers_by_sender(env: rs.StreamEnvironment) -> dict[str, list[float]]:
    """Each sending operator's record writers' timeouts, as subtask 0 wires them."""
    plan = env.plan()
    found: dict[str, list[float]] = {}
    for vertex in plan.vertices:
        if not vertex.outputs:
            continue
        subtask = Subtask(SubtaskSpec("job-id", "job", 0, vertex, 0, plan.max_parallelism,
                                      credits=8))
        # the handles are only called when a batch is sent, which this test never does
        downstream = {c: None for e in vertex.outputs for c in e.output_channels(0)}
        subtask.connect(downstream, {})
        for edge, writer in zip(vertex.outputs, subtask.writers):
            sender = vertex.nodes[edge.source_node].name
            found.setdefault(sender, []).append(writer.buffer_timeout_ms)
    return found


def test_option_reaches_the_record_writers_of_its_operator():
    stream = rs.StreamEnvironment(parallelism=2, buffer_timeout_ms=7)
    numbers = stream.from_sequence(100, columns, name="numbers")
    fast = numbers.key_by("k").map_batches(lambda b: b, name="fast").set_buffer_timeout(0)
    fast.key_by("k").map_batches(lambda b: b, name="full").set_buffer_timeout(-1) \
        .rebalance().discard()
    # the source has no timeout of its own: the job's
    assert writers_by_sender(stream) == {"numbers": [7.0], "fast": [0.0], "full": [-1.0]}
    default_env, _ = job(None)
    assert set(v for vs in writers_by_sender(default_env).values() for v in vs) == {
        DEFAULT_BUFFER_TIMEOUT_MS}


def test_buffer_timeout_is_checked():
    with pytest.raises(ValueError, match="buffer_timeout_ms"):
        rs.StreamEnvironment(buffer_timeout_ms=-2)
    with pytest.raises(ValueError, match="buffer_timeout_ms"):
        rs.StreamEnvironment().from_sequence(10).set_buffer_timeout(-0.5)


@pytest.mark.slow
@pytest.mark.parametrize("timeout_ms", [0, None], ids=["flush-every-batch", "default"])
def test_output_does_not_depend_on_the_timeout(ray_session, timeout_ms):
    i = np.arange(N)
    frame = pd.DataFrame(columns(i))
    expected_counts = (frame.groupby(["k", frame["ts"] // 1000 * 1000]).size()
                       .rename("count").sort_index())
    env, sinks = job(timeout_ms)
    result = env.execute(f"buffer-timeout-{timeout_ms}")
    rows = result.table(sinks["rows"]).to_pandas()
    assert rows.sort_values(["ts", "k"]).reset_index(drop=True).equals(
        frame.assign(v2=frame["v"] * 2)[["k", "ts", "v2"]].sort_values(["ts", "k"])
        .reset_index(drop=True))
    counts = result.table(sinks["counts"]).to_pandas()
    got = counts.set_index(["k", "window_start"])["count"].sort_index()
    assert got.equals(expected_counts.rename_axis(["k", "window_start"]))
