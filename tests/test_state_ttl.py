"""State TTL on the heap backend: every state kind, through the public API.

Unit tests drive a :class:`HeapKeyedStateBackend` with an injected TTL clock
(``ttl_time_provider``), so which values are expired is exact; a model test
compares random interleavings of writes, reads, in-place mutations, clock
advances and snapshots with plain dicts of ``(value, timestamp)``. The job test
runs a real Ray job with a 200 ms TTL and real waiting, stops it with a
savepoint and restores it, and checks every read against the wall-clock times
the job itself recorded around it.
"""

from __future__ import annotations

import copy
import time

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream as rs
from raystream.checkpoint.state import HeapKeyedStateBackend
from tests.test_exactly_once import wait_for_checkpoint

MAXP = 16
TTL = 100
MISSING = object()


class Clock:
    """A TTL time provider the test moves by hand."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def backend(clock: Clock, key_groups: range = range(MAXP)) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                 ttl_time_provider=clock)


class Sum:
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc):
        return tuple(acc)

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


def handles(b: HeapKeyedStateBackend, ttl: rs.StateTtlConfig) -> dict:
    return {"v": b.value_state("v", ttl=ttl), "l": b.list_state("l", ttl=ttl),
            "m": b.map_state("m", ttl=ttl),
            "r": b.reducing_state("r", lambda a, c: a + c, ttl=ttl),
            "a": b.aggregating_state("a", Sum(), ttl=ttl)}


# -- configuration ----------------------------------------------------------------------

def test_config_accepts_enums_and_strings_and_rejects_bad_input():
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
    b = backend(Clock())
    with pytest.raises(TypeError, match="state 'x': ttl must be a rs.StateTtlConfig, got int"):
        b.value_state("x", ttl=100)
    b.value_state("y", ttl=rs.StateTtlConfig(5))
    with pytest.raises(ValueError, match="state 'y' is declared with two TTLs"):
        b.value_state("y", ttl=rs.StateTtlConfig(6))
    with pytest.raises(ValueError, match="state 'y' has a TTL .* and is now declared "
                                         "without one"):
        b.value_state("y")


# -- expiry, per kind ---------------------------------------------------------------------

@pytest.mark.parametrize("update_on", ["create_and_write", "read_and_write"])
def test_every_kind_expires_after_ttl_and_reads_renew_only_when_asked(update_on):
    clock = Clock()
    b = backend(clock)
    h = handles(b, rs.StateTtlConfig(TTL, update_on=update_on))
    b.set_current_key("k")
    h["v"].update("x")
    h["l"].add(1)
    h["m"].put("a", 1)
    h["r"].add(1)
    h["a"].add(1)
    clock.now += TTL - 1  # still live; a read renews only with read_and_write
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get(), h["a"].get()) == \
        ("x", [1], [("a", 1)], 1, (1, 1))
    clock.now += 1  # TTL after the write
    got = (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get(), h["a"].get())
    if update_on == "read_and_write":  # renewed one ms ago
        assert got == ("x", [1], [("a", 1)], 1, (1, 1))
        clock.now += TTL
    else:
        assert got == (None, [], [], None, None)
    assert (h["v"].value(), h["l"].get(), h["m"].items(), h["r"].get(), h["a"].get()) == \
        (None, [], [], None, None)
    assert all(list(b.keys(name)) == [] for name in h)  # reads removed what expired


def test_list_elements_and_map_entries_expire_one_by_one_and_adds_restart_from_empty():
    clock = Clock()
    b = backend(clock)
    h = handles(b, rs.StateTtlConfig(TTL))
    b.set_current_key(7)
    h["l"].add_all([1, 2])
    h["m"].put_all({"a": 1, "b": 2})
    h["r"].add(10)
    h["a"].add(10)
    clock.now += 60
    h["l"].add(3)
    h["m"].put("b", 20)  # a write renews that entry only
    clock.now += 60  # 120 after the first writes, 60 after the second
    assert h["l"].get() == [3]
    assert h["m"].items() == [("b", 20)] and h["m"].keys() == ["b"]
    assert not h["m"].contains("a") and h["m"].get("a", "gone") == "gone"
    h["r"].add(5)  # the expired 10 counts as unset: folding starts over
    h["a"].add(5)
    assert (h["r"].get(), h["a"].get()) == (5, (5, 1))
    h["m"].remove("b")
    assert h["m"].is_empty() and list(b.keys("m")) == []


def test_return_expired_if_not_cleaned_up_returns_it_once_then_it_is_gone():
    clock = Clock()
    b = backend(clock)
    ttl = rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                            cleanup_per_access=0)
    h = handles(b, ttl)
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


def test_incremental_cleanup_reclaims_keys_that_are_never_read_again():
    clock = Clock()
    b = backend(clock)
    h = handles(b, rs.StateTtlConfig(TTL, cleanup_per_access=5))
    keys = list(range(500))
    for k in keys:
        b.set_current_key(k)
        h["v"].update(k)
        h["l"].add(k)
        h["m"].put(k, k)
    assert all(len(set(b.keys(name))) == 500 for name in ("v", "l", "m"))
    clock.now += TTL
    b.set_current_key("reader")  # one live key, touched over and over
    for _ in range(300):  # 5 entries per access: 300 accesses visit 1500 slots
        h["v"].update(1)
        h["l"].get()
        h["m"].contains(0)
    assert [sorted(map(str, b.keys(name))) for name in ("v", "l", "m")] == \
        [["reader"], [], []]


def test_snapshot_leaves_out_expired_values_and_restore_keeps_timestamps():
    clock = Clock()
    b = backend(clock)
    ttl = rs.StateTtlConfig(TTL, cleanup_per_access=0)
    h = handles(b, ttl)
    for k in range(40):
        b.set_current_key(k)
        h["v"].update(k)
        h["l"].add(k)
        h["m"].put("x", k)
    clock.now += 60
    for k in range(20):  # half are written again: they outlive the others by 60 ms
        b.set_current_key(k)
        h["v"].update(-k)
        h["l"].add(-k)
        h["m"].put("y", -k)
    clock.now += 50  # the first writes expired, the second ones did not
    sections = b.snapshot()()
    assert len(set(b.keys("v"))) == 40  # nothing cleaned up in the live backend ...

    later = Clock(clock.now)
    # ... but a restore finds only live values, even when expired ones would be shown
    for subtask in range(2):
        r = backend(later, rs.key_group_range(subtask, 2, MAXP))
        r.restore(sections)
        rh = handles(r, rs.StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up",
                                          cleanup_per_access=0))
        mine = [k for k in range(40) if rs.key_group_of(k, MAXP) in r.key_groups]
        assert sorted(r.keys("v")) == sorted(r.keys("l")) == sorted(r.keys("m")) == \
            [k for k in mine if k < 20]
        for k in [k for k in mine if k < 20]:
            r.set_current_key(k)
            assert (h_read(rh)) == (-k, [-k], [("y", -k)])
    # timestamps survived the restore: the renewed values expire TTL after their write
    r = backend(later)
    r.restore(sections)
    rh = handles(r, rs.StateTtlConfig(TTL))
    r.set_current_key(3)
    later.now += 60 + TTL - 110 - 1  # written at +60, now at +110
    assert h_read(rh) == (-3, [-3], [("y", -3)])
    later.now += 1
    assert h_read(rh) == (None, [], [])


def h_read(h: dict) -> tuple:
    return h["v"].value(), h["l"].get(), h["m"].items()


def test_a_state_cannot_gain_or_lose_its_ttl_across_a_restore():
    clock = Clock()
    b = backend(clock)
    b.set_current_key(1)
    b.value_state("plain").update(1)
    b.value_state("timed", ttl=rs.StateTtlConfig(TTL)).update(2)
    sections = b.snapshot()()
    r = backend(clock)
    r.restore(sections)
    with pytest.raises(ValueError, match="state 'plain' has no TTL .*restored from a "
                                         "checkpoint.* now declared with one"):
        r.value_state("plain", ttl=rs.StateTtlConfig(TTL))
    with pytest.raises(ValueError, match="state 'timed' has a TTL"):
        r.value_state("timed")
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        r.list_state("l", ttl=rs.StateTtlConfig(TTL)).merge_namespaces("a", ["b"])


# -- model: random interleavings against dicts of (value, timestamp) ----------------------

KEYS = [0, 1, "a", ("t", 2)]
small = st.integers(-3, 9)
OPS = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(KEYS)),
    st.tuples(st.just("tick"), st.integers(0, 70)),
    st.tuples(st.just("v_set"), small),
    st.tuples(st.just("v_get_mutate"), small),
    st.tuples(st.just("l_add"), small),
    st.tuples(st.just("l_update"), st.lists(small, max_size=3)),
    st.tuples(st.just("l_get")),
    st.tuples(st.just("m_put"), st.integers(0, 3), small),
    st.tuples(st.just("m_get_mutate"), st.integers(0, 3), small),
    st.tuples(st.just("m_items")),
    st.tuples(st.just("m_remove"), st.integers(0, 3)),
    st.tuples(st.just("r_add"), small),
    st.tuples(st.just("r_get")),
    st.tuples(st.just("a_add"), small),
    st.tuples(st.just("a_get")),
    st.tuples(st.just("clear"), st.sampled_from("vlmra")),
    st.tuples(st.just("snap")),
    st.tuples(st.just("run"), st.integers(0, 5)),
    st.tuples(st.just("release"), st.integers(0, 5)),
)


class Model:
    """Flink's TTL semantics over plain dicts: ``single[name][key] = (value, ts)``,
    ``lists[key] = [(element, ts)]``, ``maps[key] = {k: (value, ts)}``."""

    def __init__(self, cfg: rs.StateTtlConfig) -> None:
        self.cfg = cfg
        self.single: dict = {"v": {}, "r": {}, "a": {}}
        self.lists: dict = {}
        self.maps: dict = {}

    def expired(self, ts: int, now: int) -> bool:
        return ts + self.cfg.ttl_ms <= now

    def read_single(self, name: str, key, now: int):
        d = self.single[name]
        if key not in d:
            return MISSING
        value, ts = d[key]
        if self.expired(ts, now):
            del d[key]
            return value if self.cfg.return_expired else MISSING
        if self.cfg.renew_on_read:
            d[key] = (value, now)
        return value

    def live_single(self, name: str, key, now: int):
        e = self.single[name].get(key)
        return MISSING if e is None or self.expired(e[1], now) else e[0]

    def read_list(self, key, now: int) -> list:
        lst = self.lists.get(key, [])
        live = [e for e in lst if not self.expired(e[1], now)]
        shown = lst if self.cfg.return_expired else live
        if self.cfg.renew_on_read:
            live = [(v, now) for v, _ in live]
        if live:
            self.lists[key] = live
        else:
            self.lists.pop(key, None)
        return [v for v, _ in shown]

    def read_map(self, key, now: int) -> list:
        d = self.maps.get(key, {})
        out = []
        for k, (v, ts) in list(d.items()):
            if self.expired(ts, now):
                del d[k]
                if self.cfg.return_expired:
                    out.append((k, v))
            else:
                if self.cfg.renew_on_read:
                    d[k] = (v, now)
                out.append((k, v))
        if not d:
            self.maps.pop(key, None)
        return out

    def read_map_key(self, key, k, now: int):
        d = self.maps.get(key, {})
        if k not in d:
            return MISSING
        v, ts = d[k]
        if self.expired(ts, now):
            del d[k]
            if not d:
                self.maps.pop(key, None)
            return v if self.cfg.return_expired else MISSING
        if self.cfg.renew_on_read:
            d[k] = (v, now)
        return v

    def live_at(self, now: int) -> dict:
        """What a snapshot taken at ``now`` holds, as {(kind, key): value}."""
        out = {}
        for name, d in self.single.items():
            for key, (v, ts) in d.items():
                if not self.expired(ts, now):
                    out[(name, key)] = tuple(v) if name == "a" else v
        for key, lst in self.lists.items():
            if live := [v for v, ts in lst if not self.expired(ts, now)]:
                out[("l", key)] = live
        for key, d in self.maps.items():
            if live := {k: v for k, (v, ts) in d.items() if not self.expired(ts, now)}:
                out[("m", key)] = live
        return copy.deepcopy(out)


def dump_live(b: HeapKeyedStateBackend, ttl: rs.StateTtlConfig) -> dict:
    """Everything in ``b`` (its clock frozen at the snapshot time: nothing expired)."""
    h = handles(b, ttl)
    out = {}
    for key in KEYS:
        b.set_current_key(key)
        if (v := h["v"].value()) is not None:
            out[("v", key)] = v
        if (r := h["r"].get()) is not None:
            out[("r", key)] = r
        if (a := h["a"].get()) is not None:
            out[("a", key)] = a
        if lst := h["l"].get():
            out[("l", key)] = lst
        if items := h["m"].items():
            out[("m", key)] = dict(items)
    return out


CONFIGS = [rs.StateTtlConfig(TTL), rs.StateTtlConfig(TTL, update_on="read_and_write"),
           rs.StateTtlConfig(TTL, update_on="read_and_write",
                             visibility="return_expired_if_not_cleaned_up",
                             cleanup_per_access=0)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["write", "read_and_write", "return_expired"])
@given(ops=st.lists(OPS, max_size=80))
def test_model_with_clock_and_interleaved_snapshots(cfg, ops):  # noqa: C901 - one branch per op
    clock = Clock()
    b = backend(clock)
    h = handles(b, cfg)
    model = Model(cfg)
    key = KEYS[0]
    b.set_current_key(key)
    pending: list = []
    for kind, *args in ops:
        now = clock.now
        if kind == "key":
            key = args[0]
            b.set_current_key(key)
        elif kind == "tick":
            clock.now += args[0]
        elif kind == "v_set":
            h["v"].update([args[0]])
            model.single["v"][key] = ([args[0]], now)
        elif kind == "v_get_mutate":  # the value read is live: mutating it changes state
            got = h["v"].value()
            want = model.read_single("v", key, now)
            assert got == (None if want is MISSING else want)
            if got is not None and key in model.single["v"]:
                got.append(args[0])
                model.single["v"][key][0].append(args[0])
        elif kind == "l_add":
            h["l"].add(args[0])
            model.lists.setdefault(key, []).append((args[0], now))
        elif kind == "l_update":
            h["l"].update(args[0])
            if args[0]:
                model.lists[key] = [(v, now) for v in args[0]]
            else:
                model.lists.pop(key, None)
        elif kind == "l_get":
            assert h["l"].get() == model.read_list(key, now)
        elif kind == "m_put":
            h["m"].put(args[0], [args[1]])
            model.maps.setdefault(key, {})[args[0]] = ([args[1]], now)
        elif kind == "m_get_mutate":
            got = h["m"].get(args[0])
            want = model.read_map_key(key, args[0], now)
            assert got == (None if want is MISSING else want)
            if got is not None and args[0] in model.maps.get(key, {}):
                got.append(args[1])
                model.maps[key][args[0]][0].append(args[1])
        elif kind == "m_items":
            assert h["m"].items() == model.read_map(key, now)
        elif kind == "m_remove":
            h["m"].remove(args[0])
            d = model.maps.get(key, {})
            d.pop(args[0], None)
            if not d:
                model.maps.pop(key, None)
        elif kind == "r_add":
            h["r"].add(args[0])
            cur = model.live_single("r", key, now)
            model.single["r"][key] = (args[0] if cur is MISSING else cur + args[0], now)
        elif kind == "r_get":
            want = model.read_single("r", key, now)
            assert h["r"].get() == (None if want is MISSING else want)
        elif kind == "a_add":
            h["a"].add(args[0])
            cur = model.live_single("a", key, now)
            acc = [0, 0] if cur is MISSING else list(cur)
            model.single["a"][key] = ([acc[0] + args[0], acc[1] + 1], now)
        elif kind == "a_get":
            want = model.read_single("a", key, now)
            assert h["a"].get() == (None if want is MISSING else tuple(want))
        elif kind == "clear":
            h[args[0]].clear()
            stores = {"l": model.lists, "m": model.maps, **model.single}
            stores[args[0]].pop(key, None)
        elif kind == "snap":
            pending.append((b.snapshot(), now, model.live_at(now)))
        elif kind in ("run", "release") and pending:
            snap, at, want = pending.pop(args[0] % len(pending))
            if kind == "release":
                snap.release()
                continue
            r = backend(Clock(at))
            r.restore(snap())
            assert dump_live(r, cfg) == want
    r = backend(Clock(clock.now))
    r.restore(b.snapshot()())
    assert dump_live(r, cfg) == model.live_at(clock.now)


# -- a real job: 200 ms TTL, real waiting, a savepoint and a restore ----------------------

JOB_TTL_MS = 200
LONG_TTL_MS = 120_000
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("op", pa.string()),
                    ("pause_ms", pa.int64())])


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


def pause(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Wait ``pause_ms`` before handing a row on (in the source's subtask, so barriers
    are not stuck behind a backlog of waiting rows)."""
    time.sleep(sum(batch["pause_ms"].to_pylist()) / 1000)
    return batch


def pause_but_the_tail(batch: pa.RecordBatch) -> pa.RecordBatch:
    """:func:`pause` for the rows of keys 0-5 only: the slow tail only keeps the first run
    going until its stop, the restored run need not crawl through the rest of it."""
    time.sleep(sum(p for k, p in zip(batch["k"].to_pylist(), batch["pause_ms"].to_pylist())
                   if k < 100) / 1000)
    return batch


def probe_job(env: rs.StreamEnvironment, seen_visibility: str, *,
              slow_tail: bool = True) -> rs.SinkHandle:
    src = env.from_collection(probe_input(), schema=SCHEMA, batch_size=1, name="rows",
                              parallelism=1).map_batches(
        pause if slow_tail else pause_but_the_tail, name="pause", parallelism=1)
    return src.key_by("k").process(Probe(seen_visibility), name="probe").collect()


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
