"""State TTL's model: Flink's TTL semantics over plain dicts of ``(value, timestamp)``,
the random operations that tests run on backends and on the model side by side (with
snapshots restored into the other backend), and readers of what a backend or a full
snapshot holds. The backends come from ``state_backends`` of tests/conftest.py, with a
:class:`Clock` as their TTL time provider."""

from __future__ import annotations

import copy
import time
from typing import Any, Callable

import pyarrow as pa
from hypothesis import strategies as st

import raystream as rs
from raystream.checkpoint.disk_sections import section_entries
from raystream.checkpoint.envelope import KEYED_STATE, SectionKind, read
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from tests.support.functions import Avg

MAXP = 16  # the max parallelism of the make_backend fixture's backends
TTL = 100
_MISSING = object()  # the model holds no live value


class Clock:
    """A TTL time provider the test moves by hand."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def handles(b, ttl: rs.StateTtlConfig) -> dict:
    """A state of each kind in backend ``b`` with ``ttl``, by the model's names: value
    ``v``, list ``l``, map ``m``, reducing ``r`` (a sum), aggregating ``a`` (:class:`Avg`)."""
    return {"v": b.value_state("v", ttl=ttl), "l": b.list_state("l", ttl=ttl),
            "m": b.map_state("m", ttl=ttl),
            "r": b.reducing_state("r", lambda a, c: a + c, ttl=ttl),
            "a": b.aggregating_state("a", Avg(), ttl=ttl)}


def same(k: Any) -> Any:
    """The identity: values as they are (``step``'s default ``box``)."""
    return k


def dump(b, ttl_ms: int) -> dict:
    """Everything visible in ``b`` at its clock, as ``{(state, key): value}`` (the
    ``Model.live_at`` shape), read through the public API with a plain TTL config."""
    h = handles(b, rs.StateTtlConfig(ttl_ms, cleanup_per_access=0))
    out = {}
    for name, handle in h.items():
        for key in list(b.keys(name)):
            b.set_current_key(key)
            if name == "v":
                got = handle.value()
            elif name == "l":
                got = handle.get() or None
            elif name == "m":
                got = dict(handle.items()) or None
            else:
                got = handle.get()
            if got is not None:
                out[(name, key)] = got
    return out


def stored_values(sections: dict[int, bytes]) -> dict[str, int]:
    """How many stored values (values, lists, maps) each state has in full snapshot
    sections of either backend."""
    counts: dict[str, int] = {}
    for kg, data in sections.items():
        envelope, body = read(data, key_group=kg, max_parallelism=MAXP, kinds=KEYED_STATE)
        if envelope.kind is SectionKind.DISK_STATE:
            for name, *_ in section_entries(kg, body):
                counts[name] = counts.get(name, 0) + 1
        else:
            heap = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(kg, kg + 1))
            heap.restore([(kg, data)])
            for name in heap.state_names():
                counts[name] = counts.get(name, 0) + len(list(heap.keys(name)))
    return counts


def restore_split(make, kind: str, sections: dict[int, bytes], now: int, parts: int) -> list:
    """Backends of ``kind`` restored from ``sections`` at ``parts`` key-group ranges."""
    out = []
    for i in range(parts):
        r = make(kind, Clock(now), rs.key_group_range(i, parts, MAXP))
        r.restore(sections)
        out.append(r)
    return out


# -- the model: random interleavings against dicts of (value, timestamp) ----------------

_KEYS = [0, 1, "a", ("t", 2), 5.5]
_small = st.integers(-3, 9)
# (operation, *args) as step and run_model apply them
OPS = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(_KEYS)),
    st.tuples(st.just("tick"), st.integers(0, 70)),
    st.tuples(st.just("v_set"), _small),
    st.tuples(st.just("v_get")),
    st.tuples(st.just("l_add"), _small),
    st.tuples(st.just("l_update"), st.lists(_small, max_size=3)),
    st.tuples(st.just("l_get")),
    st.tuples(st.just("m_put"), st.integers(0, 3), _small),
    st.tuples(st.just("m_get"), st.integers(0, 3)),
    st.tuples(st.just("m_contains"), st.integers(0, 3)),
    st.tuples(st.just("m_items")),
    st.tuples(st.just("m_remove"), st.integers(0, 3)),
    st.tuples(st.just("r_add"), _small),
    st.tuples(st.just("r_get")),
    st.tuples(st.just("a_add"), _small),
    st.tuples(st.just("a_get")),
    st.tuples(st.just("clear"), st.sampled_from("vlmra")),
    st.tuples(st.just("snap")),
    st.tuples(st.just("run"), st.integers(0, 5), st.integers(0, 150)),
)

CONFIGS = [rs.StateTtlConfig(TTL, cleanup_per_access=2),
           rs.StateTtlConfig(TTL, update_on="read_and_write"),
           rs.StateTtlConfig(TTL, update_on="read_and_write",
                             visibility="return_expired_if_not_cleaned_up",
                             cleanup_per_access=0)]


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
            return _MISSING
        value, ts = d[key]
        if self.expired(ts, now):
            del d[key]
            return value if self.cfg.return_expired else _MISSING
        if self.cfg.renew_on_read:
            d[key] = (value, now)
        return value

    def live_single(self, name: str, key, now: int):
        e = self.single[name].get(key)
        return _MISSING if e is None or self.expired(e[1], now) else e[0]

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
            return _MISSING
        v, ts = d[k]
        if self.expired(ts, now):
            del d[k]
            if not d:
                self.maps.pop(key, None)
            return v if self.cfg.return_expired else _MISSING
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


def step(h: dict, model: Model, key, now: int, kind: str, args: list,  # noqa: C901
         box: Callable[[Any], Any] = same) -> None:
    """Apply one operation to the state handles and the model, checking every read; the
    values written to value and map states are ``box(value)`` (one for the state, one
    for the model)."""
    def want(v):
        return None if v is _MISSING else v
    if kind == "v_set":
        h["v"].update(box(args[0]))
        model.single["v"][key] = (box(args[0]), now)
    elif kind == "v_get":
        assert h["v"].value() == want(model.read_single("v", key, now))
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
        h["m"].put(args[0], box(args[1]))
        model.maps.setdefault(key, {})[args[0]] = (box(args[1]), now)
    elif kind == "m_get":
        assert h["m"].get(args[0]) == want(model.read_map_key(key, args[0], now))
    elif kind == "m_contains":
        assert h["m"].contains(args[0]) == \
            (model.read_map_key(key, args[0], now) is not _MISSING)
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
        model.single["r"][key] = (args[0] if cur is _MISSING else cur + args[0], now)
    elif kind == "r_get":
        assert h["r"].get() == want(model.read_single("r", key, now))
    elif kind == "a_add":
        h["a"].add(args[0])
        cur = model.live_single("a", key, now)
        acc = [0, 0] if cur is _MISSING else list(cur)
        model.single["a"][key] = ([acc[0] + args[0], acc[1] + 1], now)
    elif kind == "a_get":
        got = model.read_single("a", key, now)
        assert h["a"].get() == (None if got is _MISSING else tuple(got))
    elif kind == "clear":
        h[args[0]].clear()
        stores = {"l": model.lists, "m": model.maps, **model.single}
        stores[args[0]].pop(key, None)
    elif kind == "v_get_mutate":  # heap only: the value read is live, mutating it changes state
        got = h["v"].value()
        assert got == want(model.read_single("v", key, now))
        if got is not None and key in model.single["v"]:
            got.append(args[0])
            model.single["v"][key][0].append(args[0])
    elif kind == "m_get_mutate":  # heap only, likewise
        got = h["m"].get(args[0])
        assert got == want(model.read_map_key(key, args[0], now))
        if got is not None and args[0] in model.maps.get(key, {}):
            got.append(args[1])
            model.maps[key][args[0]][0].append(args[1])


# OPS and what the heap alone can do: mutate a value read in place, release a snapshot
HEAP_OPS = st.one_of(
    OPS,
    st.tuples(st.just("v_get_mutate"), _small),
    st.tuples(st.just("m_get_mutate"), st.integers(0, 3), _small),
    st.tuples(st.just("release"), st.integers(0, 5)),
)


def boxed(v: Any) -> list:
    """A new one-element list of ``v``: a value the heap model test can mutate in place."""
    return [v]


def run_model(make, cfg: rs.StateTtlConfig, ops: list, kinds: list[str],
              box: Callable[[Any], Any] = same) -> None:
    """Run ``ops`` on a backend of each of ``kinds`` and on a model of each, with
    :func:`step` (``box`` as there); ``run`` restores a snapshot into the other kind of
    backend at two key-group ranges, read some time later; ``release`` releases one."""
    clock = Clock()
    backends = {kind: make(kind, clock) for kind in kinds}
    hs = {kind: handles(b, cfg) for kind, b in backends.items()}
    models = {kind: Model(cfg) for kind in kinds}
    key = _KEYS[0]
    for b in backends.values():
        b.set_current_key(key)
    pending: list = []
    for op, *args in ops:
        now = clock.now
        if op == "key":
            key = args[0]
            for b in backends.values():
                b.set_current_key(key)
        elif op == "tick":
            clock.now += args[0]
        elif op == "snap":
            pending.append((now, {k: b.snapshot() for k, b in backends.items()},
                            copy.deepcopy(models[kinds[0]])))
        elif op in ("run", "release"):
            if not pending:
                continue
            at, snaps, model = pending.pop(args[0] % len(pending))
            if op == "release":
                for snap in snaps.values():
                    snap.release()
                continue
            later = at + args[1]
            for source, snap in snaps.items():
                sections = snap()
                target = "heap" if source == "disk" else "disk"
                got = {}
                for r in restore_split(make, target, sections, later, 2):
                    got.update(dump(r, cfg.ttl_ms))
                assert got == model.live_at(later), (source, at, later)
        else:
            for kind in kinds:
                step(hs[kind], models[kind], key, now, op, args, box)
    for kind, b in backends.items():
        r = make(kind, Clock(clock.now))
        r.restore(b.snapshot()())
        assert dump(r, cfg.ttl_ms) == models[kind].live_at(clock.now)
    for snap in (s for _, snaps, _ in pending for s in snaps.values()):
        snap.release()


# -- the probe jobs' rows: an operation per row, and a pause before it -------------------------

PROBE_SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("op", pa.string()),
                          ("pause_ms", pa.int64())])


def pause(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Wait ``pause_ms`` before handing a row on (in the source's subtask, so barriers
    are not stuck behind a backlog of waiting rows)."""
    time.sleep(sum(batch["pause_ms"].to_pylist()) / 1000)
    return batch
