"""Each output row keeps the value it had when it was emitted, on both state backends.

Operators collect a batch's output rows and convert them to Arrow at the end of the
batch. A user function that emits an object and then changes it within the same batch
(the dict it keeps in heap state, a dict it refills for every output, a list inside a
row) must not change what it emitted before: Flink copies every record as it is
emitted. Every input here has many rows per key in one batch; the oracles are pandas'
running sums over the same rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import raystream as rs

N = 3_000
KEYS = 7


def columns(index: np.ndarray) -> dict[str, np.ndarray]:
    return {"k": index % KEYS, "v": index % 5 + 1, "i": index}


def frame() -> pd.DataFrame:
    return pd.DataFrame(columns(np.arange(N, dtype=np.int64)))


def running_sums() -> dict[int, list[int]]:
    """Per key, its running sums in input order (strictly increasing: every v >= 1)."""
    df = frame()
    df["total"] = df.groupby("k")["v"].cumsum()
    return {int(k): g["total"].tolist() for k, g in df.groupby("k")}


def per_key(rows: list[dict], column: str = "total") -> dict[int, list[int]]:
    """Per key, the emitted values, sorted (output order across channels is free; the
    running sums are increasing, so sorted is input order)."""
    out: dict[int, list[int]] = {}
    for row in rows:
        out.setdefault(int(row["k"]), []).append(row[column])
    return {k: sorted(v) for k, v in out.items()}


def source(env: rs.StreamEnvironment, name: str = "numbers") -> rs.DataStream:
    return env.from_sequence(N, columns, batch_size=1_000, num_splits=1, name=name)


def environment(backend: str) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(parallelism=2,
                                checkpoints=rs.CheckpointConfig(state_backend=backend))


def add_in_place(acc: dict, row: dict) -> dict:
    acc["total"] += row["total"]
    return acc


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_reduce_that_changes_its_accumulator_in_place(ray_session, backend):
    env = environment(backend)
    totals = source(env).map(lambda r: {"k": r["k"], "total": r["v"]}) \
        .key_by("k").reduce(add_in_place, name="sum")
    sink = totals.collect()
    rows = env.execute(f"reduce-in-place-{backend}").table(sink).to_pylist()
    assert per_key(rows) == running_sums()


class StateDict(rs.KeyedProcessFunction):
    """Keeps one dict per key, changes it in place and emits it, on the main output
    and on side output "copy"; its "seen" list grows by one every row."""

    def open(self, ctx):
        self.state = ctx.value_state("state", default=None)

    def process_element(self, row, ctx):
        current = self.state.value()
        if current is None:
            current = {"k": row["k"], "total": 0, "seen": []}
        current["total"] += row["v"]
        current["seen"].append(row["i"])
        self.state.update(current)
        ctx.output("copy", current)
        yield current


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_process_function_that_emits_its_state_object(ray_session, backend):
    env = environment(backend)
    out = source(env).key_by("k").process(StateDict(), name="state-dict")
    sinks = out.collect(), out.side_output("copy").collect(name="copies")
    result = env.execute(f"process-state-{backend}")
    df = frame()
    expected_seen = {int(k): [g["i"].tolist()[:n] for n in range(1, len(g) + 1)]
                     for k, g in df.groupby("k")}
    for sink in sinks:
        rows = result.table(sink).to_pylist()
        assert per_key(rows) == running_sums()
        seen: dict[int, list[list[int]]] = {}
        for row in rows:  # the list as it was at each emission (a deep copy)
            seen.setdefault(int(row["k"]), []).append(row["seen"])
        assert {k: sorted(v, key=len) for k, v in seen.items()} == expected_seen


class SharedTotals(rs.KeyedCoProcessFunction):
    """Both inputs add to one state dict per key and emit it."""

    def open(self, ctx):
        self.state = ctx.value_state("state", default=None)

    def _add(self, row):
        current = self.state.value() or {"k": row["k"], "total": 0}
        current["total"] += row["v"]
        self.state.update(current)
        yield current

    def process_element1(self, row, ctx):
        yield from self._add(row)

    def process_element2(self, row, ctx):
        yield from self._add(row)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_co_process_function_that_emits_its_state_object(ray_session, backend):
    env = environment(backend)
    first = source(env, "first").filter_batches(lambda b: np.asarray(b.column("i")) % 2 == 0)
    second = source(env, "second").filter_batches(lambda b: np.asarray(b.column("i")) % 2 == 1)
    out = first.key_by("k").connect(second.key_by("k")).process(SharedTotals(), name="shared")
    sink = out.collect()
    rows = env.execute(f"co-process-state-{backend}").table(sink).to_pylist()
    # The two inputs interleave freely, so the oracle is the multiset of running sums
    # over any order: strictly increasing per key, ending at the key's total, with
    # one emission per row and no value twice.
    df = frame()
    for k, emitted in per_key(rows).items():
        values = df[df["k"] == k]["v"]
        assert len(emitted) == len(values) == len(set(emitted))
        assert emitted[-1] == values.sum()
        assert set(np.diff([0, *emitted])) <= set(values)


@pytest.mark.slow
def test_flat_map_and_map_that_reuse_one_dict(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    numbers = source(env)

    def twice(row):
        out = {"k": row["k"]}
        for j in range(2):
            out["total"] = row["i"] * 2 + j
            yield out

    counter = {"k": 0, "total": 0}

    def count(row):
        counter["total"] += 1
        return counter

    flat, counted = numbers.flat_map(twice).collect(), numbers.map(count).collect()
    result = env.execute("reused-dicts")
    assert sorted(r["total"] for r in result.table(flat).to_pylist()) == list(range(2 * N))
    assert sorted(r["total"] for r in result.table(counted).to_pylist()) == \
        list(range(1, N + 1))


class Numbered(rs.ProcessWindowFunction):
    """Emits one row per input row of the window, refilling a single dict."""

    def process(self, key, window, rows):
        out = {"k": key}
        for i in rows.column("i").to_pylist():
            out["total"] = i
            yield out


@pytest.mark.slow
def test_window_functions_that_reuse_one_dict(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    timed = source(env).map_batches(lambda b: b.append_column("ts", b.column("i")))
    windowed = timed.key_by("k").window(rs.TumblingEventTimeWindows(size_ms=100), timestamp="ts")
    numbered = windowed.process(Numbered(), name="numbered").collect()
    reused = {"k": 0, "total": 0}

    def pair(left, right):
        reused["k"], reused["total"] = left["k"], left["i"]
        return reused

    joined = timed.join(timed).where("k").equal_to("k").window(
        rs.TumblingEventTimeWindows(size_ms=100), timestamp="ts").apply(pair, name="pairs")
    pairs = joined.collect()
    result = env.execute("window-functions-reuse")
    assert sorted(r["total"] for r in result.table(numbered).to_pylist()) == list(range(N))
    # every left row meets each right row of its key and window: per left row i, as many
    # pairs as rows of its (key, window)
    df = frame()
    df["window"] = df["i"] // 100
    size = df.groupby(["k", "window"])["i"].transform("size")
    expected = sorted(np.repeat(df["i"].to_numpy(), size.to_numpy()).tolist())
    assert sorted(r["total"] for r in result.table(pairs).to_pylist()) == expected
