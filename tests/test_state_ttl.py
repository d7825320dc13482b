"""State TTL on both keyed-state backends (heap and disk), through the public API.

Unit tests drive a backend of each kind (the ``make_backend`` factory of
tests/conftest.py) with an injected TTL clock (``ttl_time_provider``), so which
values are expired is exact; model tests compare random interleavings of writes,
reads, clock advances and snapshots with plain dicts of ``(value, timestamp)``
(the ``Model`` of tests/support/ttl.py; tests/test_disk_state_ttl.py runs both
backends against it and restores snapshots across them, the heap one here also mutates
values read in place). Snapshots are restored at other key-group ranges and into the other
backend, and must keep the timestamps; expired entries must be absent from full
snapshot sections; the incremental cleanup must bound what keys never read again
keep; a state gaining or losing its TTL on restore is refused. The job test runs a
real Ray job with a 200 ms TTL and real waiting, stops it with a savepoint and
restores it, and checks every read against the wall-clock times the job itself
recorded around it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream as rs
from tests.conftest import BACKENDS, state_backends
from tests.support.jobs import wait_for_checkpoint
from tests.support.ttl import (CONFIGS, HEAP_OPS, PROBE_SCHEMA, TTL, Clock, boxed, dump, handles,
                               pause, restore_split, run_model, same, stored_values)


def write_keys(b, h: dict, keys: Iterable, **writes: Callable[[Any], Any]) -> None:
    """For every key of ``keys``, in the order of ``writes``: update value state ``v``
    to ``writes["v"](key)``, put the ``(user key, value)`` of ``writes["m"](key)`` into
    map state ``m``, add ``writes[name](key)`` to the other states."""
    for k in keys:
        b.set_current_key(k)
        for name, value_of in writes.items():
            v = value_of(k)
            if name == "v":
                h["v"].update(v)
            elif name == "m":
                h["m"].put(*v)
            else:
                h[name].add(v)


def negated(k):
    return -k


# -- configuration ----------------------------------------------------------------------

def test_config_accepts_enums_and_strings_and_rejects_bad_input(make_backend):
    a = rs.StateTtlConfig(5, update_on="read_and_write",
                          visibility="return_expired_if_not_cleaned_up")
    b = rs.StateTtlConfig(5, update_on=rs.TtlUpdate.READ_AND_WRITE,
                          visibility=rs.TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)
    assert a == b and a.renew_on_read and a.return_expired
    for ttl_ms in (0, -1, True, "5", None):
        with pytest.raises(ValueError, match="ttl_ms must be a positive number"):
            rs.StateTtlConfig(ttl_ms)
    with pytest.raises(ValueError, match="update_on must be one of 'create_and_write', "
                                         "'read_and_write'.*got 'on_read'"):
        rs.StateTtlConfig(5, update_on="on_read")
    with pytest.raises(ValueError, match="visibility must be one of.*got 'never'"):
        rs.StateTtlConfig(5, visibility="never")
    with pytest.raises(ValueError, match="cleanup_per_access"):
        rs.StateTtlConfig(5, cleanup_per_access=-1)
    b = make_backend("heap", Clock())
    with pytest.raises(TypeError, match="state 'x': ttl must be a rs.StateTtlConfig, got int"):
        b.value_state("x", ttl=100)
    b.value_state("y", ttl=rs.StateTtlConfig(5))
    with pytest.raises(ValueError, match="state 'y' is declared with two TTLs"):
        b.value_state("y", ttl=rs.StateTtlConfig(6))
    with pytest.raises(ValueError, match="state 'y' has a TTL .* and is now declared "
                                         "without one"):
        b.value_state("y")


# -- expiry, per kind, both backends --------------------------------------------------------

@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("update_on", ["create_and_write", "read_and_write"])
def test_every_kind_expires_and_reads_renew_only_when_asked(make_backend, kind, update_on):
    clock = Clock()
    b = make_backend(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, update_on=update_on))
    b.set_current_key("k")
    h["v"].update("x")
    h["l"].add(1)
    h["m"].put("a", 1)
    h["r"].add(1)
    h["a"].add(1)
    clock.now += TTL - 1

    def read():
        return (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get(), h["a"].get())
    assert read() == ("x", [1], [("a", 1)], 1, (1, 1))
    clock.now += 1
    if update_on == "read_and_write":  # renewed one ms ago
        assert read() == ("x", [1], [("a", 1)], 1, (1, 1))
        clock.now += TTL
    assert read() == (None, [], [], None, None)
    assert all(list(b.keys(name)) == [] for name in h)  # the reads deleted what expired


@pytest.mark.parametrize("kind", BACKENDS)
def test_list_elements_and_map_entries_expire_one_by_one(make_backend, kind):
    clock = Clock()
    b = make_backend(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL))
    b.set_current_key(7)
    h["l"].add_all([1, 2])
    h["m"].put_all({"a": 1, "b": 2})
    h["r"].add(10)
    h["a"].add(10)
    clock.now += 60
    h["l"].add(3)
    h["m"].put("b", 20)
    clock.now += 60
    assert h["l"].get() == [3]
    assert h["m"].items() == [("b", 20)] and h["m"].keys() == ["b"] and h["m"].values() == [20]
    assert not h["m"].contains("a") and h["m"].get("a", "gone") == "gone"
    h["r"].add(5)  # the expired 10 counts as unset
    h["a"].add(5)
    assert (h["r"].get(), h["a"].get()) == (5, (5, 1))
    h["m"].remove("b")
    assert h["m"].is_empty() and list(b.keys("m")) == []
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        h["l"].merge_namespaces("a", ["b"])


@pytest.mark.parametrize("kind", BACKENDS)
def test_return_expired_if_not_cleaned_up_returns_it_once(make_backend, kind):
    clock = Clock()
    b = make_backend(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                                     cleanup_per_access=0))
    b.set_current_key(1)
    h["v"].update("old")
    h["l"].add_all([1, 2])
    h["m"].put("a", 1)
    h["r"].add(4)
    clock.now += TTL
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get()) == \
        ("old", [1, 2], [("a", 1)], 4)
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get()) == \
        (None, [], [], None)


# -- snapshots, restore, cleanup -----------------------------------------------------------

@pytest.mark.parametrize("source", BACKENDS)
def test_snapshot_leaves_expired_out_and_restores_keep_timestamps_across_backends(make_backend, source):
    clock = Clock()
    b = make_backend(source, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=0))
    write_keys(b, h, range(40), v=same, l=same, m=lambda k: ("x", k))
    clock.now += 60
    # written again: they outlive the others by 60 ms
    write_keys(b, h, range(20), v=negated, l=negated, m=lambda k: ("y", -k))
    clock.now += 50  # the first writes expired (the list's and map's first parts too)
    sections = b.snapshot()()
    assert len(set(b.keys("v"))) == 40  # nothing was cleaned up in the live backend
    assert stored_values(sections) == {"v": 20, "l": 20, "m": 20}  # but the snapshot ...
    for target in BACKENDS:  # ... holds only live values, restored anywhere
        for parts in (1, 3):
            shown = {}
            for r in restore_split(make_backend, target, sections, clock.now, parts):
                rh = handles(r, rs.StateTtlConfig(
                    TTL, visibility="return_expired_if_not_cleaned_up", cleanup_per_access=0))
                for k in r.keys("v"):
                    r.set_current_key(k)
                    shown[k] = (rh["v"].value(), rh["l"].get(), rh["m"].items())
            assert shown == {k: (-k, [-k], [("y", -k)]) for k in range(20)}, (target, parts)
        # the timestamps came through: values written at +60 expire at +60 + TTL
        (r,) = restore_split(make_backend, target, sections, clock.now + TTL - 51, 1)
        (gone,) = restore_split(make_backend, target, sections, clock.now + TTL - 50, 1)
        assert dump(r, TTL) == {**{("v", k): -k for k in range(20)},
                                **{("l", k): [-k] for k in range(20)},
                                **{("m", k): {"y": -k} for k in range(20)}}
        assert dump(gone, TTL) == {}


@pytest.mark.parametrize("kind", BACKENDS)
def test_incremental_cleanup_bounds_what_keys_never_read_again_keep(make_backend, kind):
    clock = Clock()
    b = make_backend(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=5))
    write_keys(b, h, range(500), v=same, l=same, m=lambda k: (k, k), r=same)
    assert all(len(set(b.keys(name))) == 500 for name in ("v", "l", "m", "r"))
    clock.now += TTL
    b.set_current_key("reader")  # one live key, touched over and over
    for _ in range(300):  # 5 entries per access: 1,500 slots for 500 entries and 16 groups
        h["v"].update(1)
        h["l"].get()
        h["m"].contains(0)
        h["r"].get()
    assert [sorted(map(str, b.keys(name))) for name in ("v", "l", "m", "r")] == \
        [["reader"], [], [], []]
    assert stored_values(b.snapshot()()) == {"v": 1}


@pytest.mark.parametrize("kind", BACKENDS)
def test_cleanup_removes_only_the_expired_elements_and_entries(make_backend, kind):
    clock = Clock()
    b = make_backend(kind, clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=3))
    write_keys(b, h, range(50), l=same, m=lambda k: ("old", k))
    clock.now += 60
    write_keys(b, h, range(50), l=negated, m=lambda k: ("new", -k))
    clock.now += 50
    b.set_current_key("reader")
    for _ in range(200):
        h["l"].get()
        h["m"].get("x")
    clock.now = 0  # a snapshot at time 0 leaves nothing out: the stored values as they are
    stored = make_backend(kind, Clock(0))
    stored.restore(b.snapshot()())
    rh = handles(stored, rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                                          cleanup_per_access=0))
    for k in range(50):
        stored.set_current_key(k)
        assert rh["l"].get() == [-k] and rh["m"].items() == [("new", -k)]


@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("target", BACKENDS)
def test_a_state_cannot_gain_or_lose_its_ttl_across_a_restore(make_backend, source, target):
    clock = Clock()
    b = make_backend(source, clock)
    b.set_current_key(1)
    b.value_state("plain").update(1)
    b.list_state("timed", ttl=rs.StateTtlConfig(TTL)).add(2)
    sections = b.snapshot()()
    r = make_backend(target, clock)
    r.restore(sections)
    with pytest.raises(ValueError, match="state 'plain' has no TTL .*restored from a "
                                         "checkpoint.* now declared with one"):
        r.value_state("plain", ttl=rs.StateTtlConfig(TTL))
    with pytest.raises(ValueError, match="state 'timed' has a TTL .* now declared without "
                                         "one: a state cannot gain or lose its TTL"):
        r.list_state("timed")
    with pytest.raises(ValueError, match="state 'timed' is list\\+ttl state, not map\\+ttl"):
        r.map_state("timed", ttl=rs.StateTtlConfig(TTL))
    r.list_state("timed", ttl=rs.StateTtlConfig(2 * TTL))  # another ttl_ms is fine
    with pytest.raises(ValueError, match="state 'timed' is declared with two TTLs"):
        r.list_state("timed", ttl=rs.StateTtlConfig(TTL))
    with pytest.raises(TypeError, match="state 'x': ttl must be a rs.StateTtlConfig, got int"):
        r.value_state("x", ttl=100)


# -- model: random interleavings against dicts of (value, timestamp) ----------------------

@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
@given(ops=st.lists(HEAP_OPS, max_size=80))
def test_model_on_the_heap_with_reads_mutated_in_place(cfg, ops):
    """The heap backend against the model, with value and map values that are lists:
    a read returns the live value, so mutating it changes state; snapshots are
    restored into the disk backend, or released unread."""
    with state_backends() as make:
        run_model(make, cfg, ops, ["heap"], box=boxed)


# -- a real job: 200 ms TTL, real waiting, a savepoint and a restore ----------------------

JOB_TTL_MS = 200
LONG_TTL_MS = 120_000


class Probe(rs.KeyedProcessFunction):
    """``put`` writes three states of the row's key: ``value`` and ``seen`` (200 ms TTL)
    and ``kept`` (a long TTL); ``get`` reads ``value``; ``audit`` reads ``seen`` and
    ``kept``. ``seen`` is never cleaned up nor read before the audit, so an expired
    entry stays in memory until a snapshot leaves it out; ``seen_visibility`` lets the
    restored job show an expired entry that is still there. Every row reports the wall
    clock just before and after its state access, so the oracle can tell whether a
    value had to be live or expired whatever the scheduling."""

    def __init__(self, seen_visibility: str) -> None:
        self.seen_visibility = seen_visibility

    def open(self, ctx):
        self.value = ctx.value_state("value", ttl=rs.StateTtlConfig(JOB_TTL_MS))
        self.seen = ctx.map_state("seen", ttl=rs.StateTtlConfig(
            JOB_TTL_MS, visibility=self.seen_visibility, cleanup_per_access=0))
        self.kept = ctx.value_state("kept", ttl=rs.StateTtlConfig(LONG_TTL_MS))

    def process_element(self, row, ctx):
        got = got_kept = None
        before = time.time() * 1000
        if row["op"] == "put":
            self.value.update(row["id"])
            self.seen.put("last", row["id"])
            self.kept.update(row["id"])
        elif row["op"] == "get":
            got = self.value.value()
        else:
            got, got_kept = self.seen.get("last"), self.kept.value()
        after = time.time() * 1000
        yield {"id": row["id"], "k": ctx.current_key, "op": row["op"], "got": got,
               "got_kept": got_kept, "before": before, "after": after}


def probe_input() -> list[dict]:
    """Keys 0-5: a put, a get right away and one 3 * TTL later; then a slow tail of
    puts to other keys (the job is stopped with a savepoint in there); then, per key
    0-5, a get and an audit (in the restored job)."""
    rows = []
    for k in range(6):
        rows += [{"k": k, "op": "put", "pause_ms": 0}, {"k": k, "op": "get", "pause_ms": 0},
                 {"k": k, "op": "get", "pause_ms": 3 * JOB_TTL_MS}]
    rows += [{"k": 100 + i, "op": "put", "pause_ms": 40} for i in range(300)]
    for k in range(6):
        rows += [{"k": k, "op": "get", "pause_ms": 0}, {"k": k, "op": "audit", "pause_ms": 0}]
    return [{"id": i, **row} for i, row in enumerate(rows)]


def pause_but_the_tail(batch: pa.RecordBatch) -> pa.RecordBatch:
    """:func:`pause` for the rows of keys 0-5 only: the slow tail only keeps the first run
    going until its stop, the restored run need not crawl through the rest of it."""
    time.sleep(sum(p for k, p in zip(batch["k"].to_pylist(), batch["pause_ms"].to_pylist())
                   if k < 100) / 1000)
    return batch


def probe_job(env: rs.StreamEnvironment, seen_visibility: str, *,
              slow_tail: bool = True) -> rs.SinkHandle:
    src = env.from_collection(probe_input(), schema=PROBE_SCHEMA, batch_size=1, name="rows",
                              parallelism=1).map_batches(
        pause if slow_tail else pause_but_the_tail, name="pause", parallelism=1)
    return src.key_by("k").process(Probe(seen_visibility), name="probe").collect()


@pytest.mark.slow
def test_ttl_in_a_real_job_expires_and_survives_a_savepoint(ray_session, tmp_path):
    def env_at(parallelism: int, name: str) -> rs.StreamEnvironment:
        return rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.2, storage=str(tmp_path / name)))

    env = env_at(2, "first")
    sink = probe_job(env, "never_return_expired")
    client = env.execute_async("ttl-first")
    wait_for_checkpoint(client, after=3, timeout_s=120)  # early in the slow tail
    savepoint_requested = time.time() * 1000
    first = client.stop_with_savepoint(str(tmp_path / "savepoint"))
    rows = [{**r, "run": 1} for r in first.table(sink).to_pylist()]
    # restored at parallelism 1; now an expired entry of "seen" would be shown if present
    env = env_at(1, "second")
    sink = probe_job(env, "return_expired_if_not_cleaned_up", slow_tail=False)
    second = env.execute("ttl-second", restore_from=str(tmp_path / "savepoint"))
    rows += [{**r, "run": 2} for r in second.table(sink).to_pylist()]
    out = pd.DataFrame(rows).sort_values("id")
    assert sorted(out["id"]) == [row["id"] for row in probe_input()]  # each row once

    surely_live = surely_expired = dropped_by_snapshot = 0
    for _, rows in out[out["k"] < 100].groupby("k"):
        put = None
        for r in rows.itertuples():  # one key's rows are processed in input order
            if r.op == "put":
                put = r
                continue
            assert put is not None
            if r.op == "get":
                if r.after - put.before < JOB_TTL_MS - 1:
                    assert r.got == put.id, r
                    surely_live += 1
                elif r.before - put.after > JOB_TTL_MS + 1:
                    assert r.got is None or pd.isna(r.got), r
                    surely_expired += 1
                continue
            # audit: the long-TTL value came through the savepoint with the key ...
            assert r.got_kept == put.id, r
            if r.run == 2 and put.run == 1 and put.after + JOB_TTL_MS + 1 < savepoint_requested:
                # ... the short-TTL one had expired when the savepoint was taken: the
                # snapshot left it out (it was never read nor cleaned up before)
                assert r.got is None or pd.isna(r.got), r
                dropped_by_snapshot += 1
    assert surely_expired >= 6  # at least the reads 3 * TTL after the put
    assert surely_live >= 1 and dropped_by_snapshot >= 1, (surely_live, dropped_by_snapshot)
