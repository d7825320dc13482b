"""Broadcast state, against pandas.

There is no order between a broadcast input and the other input (as in Flink), so
every oracle relies only on what is guaranteed:

* keyed jobs apply rules by *event time*: a data row waits in keyed state for an
  event-time timer at its timestamp; the operator's watermark is the minimum over
  both inputs and the rules come in timestamp order, so when the timer fires every
  rule with a timestamp up to the row's is in the broadcast state. The rule a row
  gets is then exactly ``pd.merge_asof(..., direction="backward")``, whatever the
  interleaving, failures, savepoints and rescales;
* the non-keyed job checks that every subtask sees every broadcast row exactly once
  and that each data row was scaled by the newest rule its subtask had seen.

Operator-level tests drive the operators by hand (read-only vs writable state,
``apply_to_keyed_state``, snapshot and restore at other parallelisms).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.operators.broadcast import (BroadcastProcessOperator,
                                                  KeyedBroadcastProcessOperator)
from tests.support.jobs import wait_for_checkpoint
from tests.support.pacing import Throttle

BASE = 1_700_000_000_000
RULES = rs.MapStateDescriptor("rules")
N_EVENTS, N_RULES, KEYS = 8_000, 8, 13


def event(i: np.ndarray) -> dict:
    """Data rows: ids, 13 keys, values, timestamps with up to 300 ms of disorder."""
    jitter = (i * 7919) % 301
    return {"id": i, "k": i % KEYS, "v": (i % 97) + 1, "ts": BASE + i + jitter}


def rules() -> list[dict]:
    """Rule versions in timestamp order, spread over the events' time range: from
    ``ts`` on, values are multiplied by ``factor``."""
    return [{"version": j, "factor": j + 2, "ts": BASE + j * N_EVENTS // N_RULES}
            for j in range(N_RULES)]


def expected(n: int = N_EVENTS) -> pd.DataFrame:
    events = pd.DataFrame(event(np.arange(n))).sort_values("ts")
    table = pd.DataFrame(rules()).rename(columns={"ts": "rule_ts"}).sort_values("rule_ts")
    merged = pd.merge_asof(events, table, left_on="ts", right_on="rule_ts", direction="backward")
    merged["factor"] = merged["factor"].fillna(1).astype(int)
    merged["scaled"] = merged["v"] * merged["factor"]
    return merged.set_index("id")[["k", "scaled"]].sort_index()


class ScaleByRuleInForce(rs.KeyedBroadcastProcessFunction):
    """Buffers each row in keyed map state until the watermark passes its timestamp,
    then scales it by the newest rule whose timestamp is not after the row's."""

    def open(self, ctx):
        self.pending = ctx.map_state("pending")  # ts -> [[id, v], ...]

    def process_broadcast_element(self, rule, ctx):
        ctx.get_broadcast_state(RULES).put(rule["ts"], rule["factor"])

    def process_element(self, row, ctx):
        rows = self.pending.get(row["ts"]) or []
        rows.append([row["id"], row["v"]])
        self.pending.put(row["ts"], rows)
        ctx.register_event_time_timer(row["ts"])

    def on_timer(self, timestamp, ctx):
        in_force = [ts for ts in ctx.get_broadcast_state(RULES).keys() if ts <= timestamp]
        factor = ctx.get_broadcast_state(RULES).get(max(in_force)) if in_force else 1
        for id_, v in self.pending.get(timestamp) or []:
            yield {"id": id_, "k": ctx.current_key, "scaled": v * factor}
        self.pending.remove(timestamp)




def keyed_job(env: rs.StreamEnvironment, rule_pause_s: float):
    """Rules every ``rule_pause_s`` (0.3 s: interleaved with the data; 0.05 s: most likely
    all in before a savepoint), data over about 2.5 s."""
    data = env.from_sequence(N_EVENTS, event, batch_size=100, num_splits=2, name="events",
                             watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=100)) \
        .map_batches(Throttle(0.06), name="slow-events")
    rule_stream = env.from_collection(rules(), batch_size=1, name="rules", parallelism=1,
                                      watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0)) \
        .map_batches(Throttle(rule_pause_s), name="slow-rules", parallelism=1)
    scaled = data.key_by("k").connect(rule_stream.broadcast(RULES)) \
        .process(ScaleByRuleInForce(), name="scale")
    return scaled.collect()


def as_frame(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    assert frame["id"].is_unique, "a row was emitted twice"
    return frame.set_index("id")[["k", "scaled"]].sort_index()


def test_keyed_broadcast_job_through_a_failure_equals_pandas_exactly_once(ray_session, tmp_path):
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="scale", subtask=1, hit=15,
                                 action="exit")],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = keyed_job(env, 0.3)
    result = env.execute("broadcast-keyed")
    assert result.restarts == 1, result.failures
    pd.testing.assert_frame_equal(as_frame(result.table(sink)), expected())


@pytest.fixture(scope="module")
def stopped_keyed_job(ray_session, tmp_path_factory):
    """The keyed job at parallelism 2, stopped with a savepoint midway."""
    base = tmp_path_factory.mktemp("broadcast-savepoint")
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=0.2, storage=str(base / "chk")))
    sink = keyed_job(env, 0.05)
    client = env.execute_async("broadcast-before")
    wait_for_checkpoint(client, after=4)
    first = client.stop_with_savepoint(str(base / "savepoint"))
    return base, first.table(sink)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 3])
def test_broadcast_state_survives_a_savepoint_and_a_rescale(stopped_keyed_job, parallelism):
    """The rules source may well have finished before the savepoint: the restored
    subtasks (at 1 or 3) then only have the broadcast state they restored."""
    base, before = stopped_keyed_job
    assert 0 < before.num_rows < N_EVENTS  # stopped midway
    env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
        interval_s=0.2, storage=str(base / f"chk-{parallelism}")))
    sink = keyed_job(env, 0.05)
    after = env.execute(f"broadcast-after-{parallelism}", restore_from=str(base / "savepoint"))
    both = pa.concat_tables([before, after.table(sink)])
    pd.testing.assert_frame_equal(as_frame(both), expected())


class ScaleByNewest(rs.BroadcastProcessFunction):
    """Non-keyed: scales each row by the newest rule version this subtask has seen, and
    reports every broadcast row it receives."""

    def process_broadcast_element(self, rule, ctx):
        state = ctx.get_broadcast_state(RULES)
        state.put(rule["version"], rule["factor"])
        ctx.output("seen", {"subtask": ctx.subtask_index, "version": rule["version"]})

    def process_element(self, row, ctx):
        state = ctx.get_broadcast_state(RULES)
        newest = max(state.keys(), default=None)
        factor = 1 if newest is None else state.get(newest)
        yield {"id": row["id"], "v": row["v"], "versions": len(state), "factor": factor}


@pytest.mark.slow
def test_non_keyed_broadcast_every_subtask_sees_every_rule_once(ray_session, tmp_path):
    n = 3_000
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="newest", subtask=0, hit=10,
                                 action="exit")],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    data = env.from_sequence(n, event, batch_size=50, num_splits=2, name="events") \
        .map_batches(Throttle(0.02), name="slow-events").rebalance()
    rule_stream = env.from_collection(rules(), batch_size=1, name="rules", parallelism=1) \
        .map_batches(Throttle(0.2), name="slow-rules", parallelism=1)
    out = data.connect(rule_stream.broadcast(RULES)).process(ScaleByNewest(), name="newest")
    main, seen = out.collect(name="main"), out.side_output("seen").collect(name="seen")
    result = env.execute("broadcast-non-keyed")
    assert result.restarts == 1, result.failures

    seen_rows = sorted((r["subtask"], r["version"]) for r in result.table(seen).to_pylist())
    assert seen_rows == list(itertools.product(range(2), range(N_RULES)))  # each once
    got = result.table(main).to_pandas().sort_values("id")
    assert got["id"].tolist() == list(range(n))  # each row once
    assert got["v"].tolist() == event(np.arange(n))["v"].tolist()
    # rules arrive in version order: with c versions seen, the newest is version c - 1
    factors = np.array([1] + [r["factor"] for r in rules()])
    assert got["factor"].tolist() == factors[got["versions"].to_numpy()].tolist()


# -- the operators by hand ------------------------------------------------------------------

class Counts(rs.KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process_broadcast_element(self, row, ctx):
        state = ctx.get_broadcast_state(RULES)
        if row.get("reset") is not None:  # a broadcast row may change every key's state
            ctx.apply_to_keyed_state(self.count, lambda key, s: s.update(row["reset"]))
        else:
            state.put(row["name"], row["limit"])
        yield {"k": None, "count": len(state)}

    def process_element(self, row, ctx):
        state = ctx.get_broadcast_state(RULES)
        assert not hasattr(state, "put")  # read-only here
        self.count.update(self.count.value() + 1)
        yield {"k": ctx.current_key, "count": self.count.value()}


def keyed_operator(index: int, parallelism: int, restored: RestoredState | None = None):
    op = KeyedBroadcastProcessOperator("counts", Counts(), KeySelector.of("k"), (RULES,))
    op.setup(RuntimeContext("job", "counts", index, parallelism, 128, 0), CollectingOutput())
    op.initialize_state(restored)
    op.open()
    return op


def rows_of(op) -> list[dict]:
    return [r for b in op.output.batches for r in b.to_pylist()]


def test_keyed_operator_state_access_apply_to_keyed_state_and_rescale():
    op = keyed_operator(0, 1)
    op.process_batch(pa.RecordBatch.from_pylist([{"name": "a", "limit": 1},
                                                 {"name": "b", "limit": 2}]), 1)
    op.process_batch(pa.RecordBatch.from_pylist([{"k": k} for k in [1, 2, 2, 3, 3, 3]]), 0)
    op.process_batch(pa.RecordBatch.from_pylist([{"name": None, "limit": None, "reset": 10}]), 1)
    op.process_batch(pa.RecordBatch.from_pylist([{"k": 3}, {"k": 4}]), 0)
    assert rows_of(op)[-2:] == [{"k": 3, "count": 11}, {"k": 4, "count": 1}]
    snapshot = op.snapshot_state(1)
    blob, sections = snapshot.operator_state(), snapshot.keyed_state()
    # restored at 3 from two equal copies (as two old subtasks would have written)
    counts = {}
    for index in range(3):
        restored = RestoredState(1, operator_states=[blob, blob],
                                 keyed_sections=list(sections.items()))
        new = keyed_operator(index, 3, restored)
        assert sorted(new.broadcast.view(RULES, writable=False).items()) == [("a", 1), ("b", 2)]
        keys = [k for k in [1, 2, 3, 4]
                if rs.key_group_of(k, 128) in rs.key_group_range(index, 3, 128)]
        if keys:
            new.process_batch(pa.RecordBatch.from_pylist([{"k": k} for k in keys]), 0)
            counts.update({r["k"]: r["count"] for r in rows_of(new)})
    assert counts == {1: 11, 2: 11, 3: 12, 4: 2}


def test_non_keyed_operator_restores_a_copy_at_any_parallelism():
    def operator(index, parallelism, restored=None):
        op = BroadcastProcessOperator("newest", ScaleByNewest(), (RULES,))
        op.setup(RuntimeContext("job", "newest", index, parallelism, 128, 0), CollectingOutput())
        op.initialize_state(restored)
        op.open()
        return op

    op = operator(0, 2)
    op.process_batch(pa.RecordBatch.from_pylist(rules()[:3]), 1)
    op.process_batch(pa.RecordBatch.from_pylist([{"id": 1, "v": 5}]), 0)
    assert rows_of(op) == [{"id": 1, "v": 5, "versions": 3, "factor": 4}]
    assert [r for b in op.output.side_batches["seen"] for r in b.to_pylist()] == \
        [{"subtask": 0, "version": j} for j in range(3)]
    blob = op.snapshot_state(1).operator_state()
    op.process_batch(pa.RecordBatch.from_pylist(rules()[3:]), 1)  # after the snapshot
    for index in range(3):
        new = operator(index, 3, RestoredState(1, operator_states=[blob, blob]))
        new.process_batch(pa.RecordBatch.from_pylist([{"id": 2, "v": 1}]), 0)
        assert rows_of(new) == [{"id": 2, "v": 1, "versions": 3, "factor": 4}]


def test_bad_use_is_refused_with_clear_errors(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    data = env.from_collection([{"k": 1}])
    rule_stream = env.from_collection([{"name": "a", "limit": 1}])
    with pytest.raises(ValueError, match="MapStateDescriptor: name must be a non-empty string"):
        rs.MapStateDescriptor("")
    with pytest.raises(TypeError, match="broadcast\\(...\\) takes rs.MapStateDescriptor"):
        rule_stream.broadcast("rules")
    with pytest.raises(ValueError, match="descriptor names repeat"):
        rule_stream.broadcast(RULES, rs.MapStateDescriptor("rules"))
    with pytest.raises(TypeError, match="on a keyed stream needs a "
                                        "rs.KeyedBroadcastProcessFunction, got ScaleByNewest"):
        data.key_by("k").connect(rule_stream.broadcast(RULES)).process(ScaleByNewest())
    with pytest.raises(TypeError, match="on a non-keyed stream needs a "
                                        "rs.BroadcastProcessFunction, got Counts"):
        data.connect(rule_stream.broadcast(RULES)).process(Counts())
    op = keyed_operator(0, 1)
    with pytest.raises(KeyError, match="operator 'counts': no broadcast state.*'other'.*"
                                       "declare it in broadcast"):
        op.keyed_ctx.get_broadcast_state(rs.MapStateDescriptor("other"))
