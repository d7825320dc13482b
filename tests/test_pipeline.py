"""Multi-operator pipelines at parallelism 1, 2 and 3 against numpy oracles."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import raystream as rs

N = 30_000


def columns(index: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": index, "k": (index * 7919) % 97, "v": index % 1000 - 400}


def oracle_columns() -> dict[str, np.ndarray]:
    return columns(np.arange(N, dtype=np.int64))


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_vectorized_then_keyed_reduce(ray_session, parallelism):
    env = rs.StreamEnvironment(parallelism=parallelism)
    source = env.from_sequence(N, columns, batch_size=1000, num_splits=5)
    doubled = source.map_batches(
        lambda b: b.append_column("w", pc.multiply(b.column("v"), 2)), name="double")
    positive = doubled.filter_batches(lambda b: pc.greater(b.column("w"), 0), name="positive")
    projected = positive.map_batches(
        lambda b: pa.record_batch({"k": b.column("k"), "total": b.column("w")}), name="project")
    running = projected.key_by("k").reduce(
        lambda acc, row: {"k": row["k"], "total": acc["total"] + row["total"]}, name="running-sum")
    sink = running.collect()
    out = env.execute(f"reduce-p{parallelism}").table(sink)

    data = oracle_columns()
    w = data["v"] * 2
    keep = w > 0
    keys, values = data["k"][keep], w[keep]
    emitted: dict[int, list[int]] = collections.defaultdict(list)
    for key, total in zip(out.column("k").to_pylist(), out.column("total").to_pylist()):
        emitted[key].append(total)
    assert sorted(emitted) == sorted(np.unique(keys).tolist())
    for key, totals in emitted.items():
        inputs = np.sort(values[keys == key])
        # One output per input; the running sums of positive numbers increase, so
        # the sorted outputs' differences are exactly the key's inputs.
        ordered = np.sort(np.array(totals))
        assert len(totals) == len(inputs)
        assert np.array_equal(np.sort(np.diff(ordered, prepend=0)), inputs)
        assert ordered[-1] == inputs.sum()


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_per_row_map_flat_map_filter_rebalance(ray_session, parallelism):
    env = rs.StreamEnvironment(parallelism=parallelism)
    source = env.from_sequence(N, columns, batch_size=700, num_splits=3)
    mapped = source.map(lambda r: {"id": r["id"], "sq": r["v"] * r["v"]}, name="square")
    copies = mapped.flat_map(lambda r: [{"id": r["id"], "sq": r["sq"], "copy": c}
                                        for c in range(r["id"] % 3)], name="copies")
    kept = copies.rebalance().filter(lambda r: r["sq"] % 2 == 0, name="even", parallelism=2)
    sink = kept.collect()
    out = env.execute(f"per-row-p{parallelism}").table(sink)

    data = oracle_columns()
    sq = data["v"] ** 2
    repeat = data["id"] % 3
    ids = np.repeat(data["id"], repeat)
    sqs = np.repeat(sq, repeat)
    copy = np.concatenate([np.arange(r) for r in repeat]) if len(repeat) else np.array([])
    mask = sqs % 2 == 0
    expected = sorted(zip(ids[mask].tolist(), sqs[mask].tolist(), copy[mask].tolist()))
    got = sorted(zip(out.column("id").to_pylist(), out.column("sq").to_pylist(),
                     out.column("copy").to_pylist()))
    assert got == expected


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 3])
def test_union_and_keyed_connect(ray_session, parallelism):
    env = rs.StreamEnvironment(parallelism=parallelism)
    left = env.from_sequence(5000, lambda i: {"k": i % 11, "x": i}, batch_size=512, name="left")
    right = env.from_sequence(3000, lambda i: {"k": i % 13, "x": -i}, batch_size=256,
                              name="right", parallelism=2)
    union = left.union(right).map_batches(lambda b: b, name="after-union")
    union_sink = union.collect(name="union-out")
    tagged = left.key_by("k").connect(right.key_by("k")).map(
        lambda r: {"k": r["k"], "x": r["x"], "side": "L"},
        lambda r: {"k": r["k"], "x": r["x"], "side": "R"}, name="tag")
    subtask_of = tagged.map_batches(_with_subtask, name="where").collect(name="tag-out")
    result = env.execute(f"union-connect-p{parallelism}")

    i_left, i_right = np.arange(5000), np.arange(3000)
    expected_union = sorted(list(zip((i_left % 11).tolist(), i_left.tolist()))
                            + list(zip((i_right % 13).tolist(), (-i_right).tolist())))
    u = result.table(union_sink)
    assert sorted(zip(u.column("k").to_pylist(), u.column("x").to_pylist())) == expected_union

    t = result.table(subtask_of)
    expected_tagged = sorted([(k, x, "L") for k, x in zip((i_left % 11).tolist(), i_left.tolist())]
                             + [(k, x, "R") for k, x in zip((i_right % 13).tolist(),
                                                            (-i_right).tolist())])
    got = sorted(zip(t.column("k").to_pylist(), t.column("x").to_pylist(),
                     t.column("side").to_pylist()))
    assert got == expected_tagged
    # keyed connect: both sides of a key meet in the subtask owning its key group
    for key, subtask in set(zip(t.column("k").to_pylist(), t.column("subtask").to_pylist())):
        assert subtask == rs.subtask_for_key_group(rs.key_group_of(key), parallelism, 128)


class _WithSubtask:
    """A rich batch function: learns its subtask index in open()."""

    def open(self, ctx: rs.RuntimeContext) -> None:
        self.subtask = ctx.subtask_index

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("subtask", pa.array([self.subtask] * batch.num_rows, pa.int64()))


_with_subtask = _WithSubtask()


def test_broadcast_reaches_every_subtask(ray_session):
    env = rs.StreamEnvironment(parallelism=3)
    source = env.from_sequence(1000, batch_size=100, parallelism=1)
    sink = source.broadcast().map_batches(_with_subtask, name="everywhere").collect()
    out = env.execute("broadcast").table(sink)
    pairs = collections.Counter(zip(out.column("id").to_pylist(), out.column("subtask").to_pylist()))
    assert pairs == collections.Counter({(i, s): 1 for i in range(1000) for s in range(3)})


def test_plan_chains_forward_edges_and_splits_at_shuffles():
    env = rs.StreamEnvironment(parallelism=2)
    s = env.from_sequence(10).map_batches(lambda b: b, name="a").filter_batches(
        lambda b: pc.greater_equal(b.column("id"), 0), name="b")
    s.key_by("id").map_batches(lambda b: b, name="c").collect(name="out")
    plan = env.plan()
    assert [v.name for v in plan.vertices] == ["sequence -> a -> b", "c -> out"]
    assert [str(e.partitioning) for e in plan.edges] == ["hash(id)"]
