"""Timer heaps and the timer service (pure numpy, no Ray).

Oracles: a ``heapq`` list + ``set`` model of the heap, ``np.lexsort``/``np.unique``
over the same input, ``keygroups.key_group_of`` for key groups, and plain Python
sets of (timestamp, key, namespace) for the service.
"""

from __future__ import annotations

import doctest
import heapq
import pickle
import struct
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream.timers.heap as heap_module
import raystream.timers.service as service_module
from raystream.checkpoint.envelope import SectionKind
from raystream.checkpoint.keygroups import HASH_VERSION, key_group_of, key_group_range
from raystream.timers import TimerHeap, TimerService

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class VectorizedHeap(TimerHeap):
    """Takes the vectorized add_many / pop_until paths even for tiny inputs, and
    inserts into the index in chunks of 7 (duplicates across chunks)."""

    small_batch = 0
    small_pop = 0
    small_pop_rest = 0
    insert_chunk = 7


class MixedHeap(TimerHeap):
    """Pops one timer in Python, then vectorizes; batches above 2 go vectorized."""

    small_batch = 2
    small_pop = 1
    small_pop_rest = 1


HEAP_CLASSES = [TimerHeap, VectorizedHeap, MixedHeap]


# ---------------------------------------------------------------------------
# Reference model: heapq + set (lazy deletion)
# ---------------------------------------------------------------------------

class ReferenceHeap:
    def __init__(self) -> None:
        self.live: set[tuple[int, int, int]] = set()
        self.heap: list[tuple[int, int, int]] = []

    def add(self, timer: tuple[int, int, int]) -> bool:
        if timer in self.live:
            return False
        self.live.add(timer)
        heapq.heappush(self.heap, timer)
        return True

    def remove(self, timer: tuple[int, int, int]) -> bool:
        if timer not in self.live:
            return False
        self.live.remove(timer)
        return True

    def pop_until(self, bound: int) -> list[tuple[int, int, int]]:
        out = []
        while self.heap and self.heap[0][0] <= bound:
            timer = heapq.heappop(self.heap)
            if timer in self.live:
                self.live.remove(timer)
                out.append(timer)
        return out

    def peek(self) -> tuple[int, int, int] | None:
        while self.heap and self.heap[0] not in self.live:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


def rows(arrays) -> list[tuple[int, int, int]]:
    return list(zip(*(a.tolist() for a in arrays)))


def assert_same(heap: TimerHeap, ref: ReferenceHeap) -> None:
    assert len(heap) == len(ref.live)
    assert heap.peek() == ref.peek()
    assert sorted(rows(heap.arrays())) == sorted(ref.live)


timestamps = st.one_of(st.integers(-3, 12), st.sampled_from([INT64_MIN, INT64_MAX]))
timers = st.tuples(timestamps, st.integers(0, 4), st.integers(-1, 1))
operations = st.lists(st.one_of(
    st.tuples(st.just("add"), timers),
    st.tuples(st.just("add_many"), st.lists(timers, max_size=40)),
    st.tuples(st.just("remove"), timers),
    st.tuples(st.just("pop_until"), st.one_of(st.integers(-4, 13),
                                              st.sampled_from([INT64_MIN, INT64_MAX]))),
), max_size=60)


@pytest.mark.parametrize("heap_class", HEAP_CLASSES, ids=lambda c: c.__name__)
@given(ops=operations)
def test_heap_matches_reference_model(heap_class, ops):
    heap, ref = heap_class(capacity=1), ReferenceHeap()
    for op, arg in ops:
        if op == "add":
            assert heap.add(*arg) == ref.add(arg)
        elif op == "add_many":
            expected = sum(ref.add(t) for t in arg)
            cols = np.array(arg, np.int64).reshape(-1, 3).T
            assert heap.add_many(cols[0], cols[1], cols[2]) == expected
        elif op == "remove":
            assert heap.remove(*arg) == ref.remove(arg)
            assert arg not in heap
        else:
            assert rows(heap.pop_until(arg)) == ref.pop_until(arg)
        assert_same(heap, ref)


@pytest.mark.parametrize("heap_class", HEAP_CLASSES, ids=lambda c: c.__name__)
def test_heap_churn_with_index_rebuilds(heap_class):
    """Many adds/removes around a small live size: deleted index slots pile up and the
    index is rebuilt repeatedly; the heap grows and shrinks."""
    rng = np.random.default_rng(7)
    heap, ref = heap_class(), ReferenceHeap()
    for step in range(60):
        batch = rng.integers(0, 400, size=(int(rng.integers(1, 600)), 3))
        batch[:, 2] %= 3
        expected = sum(ref.add(tuple(t)) for t in batch.tolist())
        assert heap.add_many(batch[:, 0], batch[:, 1], batch[:, 2]) == expected
        live = sorted(ref.live)
        for i in rng.choice(len(live), size=len(live) // 2, replace=False).tolist():
            assert heap.remove(*live[i]) == ref.remove(live[i])
        bound = int(rng.integers(0, 80))
        assert rows(heap.pop_until(bound)) == ref.pop_until(bound)
        assert_same(heap, ref)


def unique_sorted(ts, kid, ns):
    order = np.lexsort((ns, kid, ts))
    ts, kid, ns = ts[order], kid[order], ns[order]
    first = np.ones(len(ts), bool)
    first[1:] = (np.diff(ts) != 0) | (np.diff(kid) != 0) | (np.diff(ns) != 0)
    return ts[first], kid[first], ns[first]


def test_large_add_many_against_lexsort():
    rng = np.random.default_rng(3)
    n = 200_000
    ts = rng.integers(-50_000, 50_000, n)
    kid = rng.integers(0, 60, n)
    ns = rng.integers(0, 3, n)  # ~5% duplicates within the batch
    heap = TimerHeap()
    head = 30_000  # part of the batch is already present: dedup against the heap too
    assert heap.add_many(ts[:head], kid[:head], ns[:head]) == len(unique_sorted(
        ts[:head], kid[:head], ns[:head])[0])
    oracle = unique_sorted(ts, kid, ns)
    before = len(heap)
    assert heap.add_many(ts, kid, ns) == len(oracle[0]) - before
    assert len(heap) == len(oracle[0])
    # round trip through flat arrays
    copy = TimerHeap.from_arrays(*heap.arrays())
    assert len(copy) == len(heap)
    # drain in steps, vectorized and one by one, against the sorted oracle
    start = 0
    for bound in (-50_001, -40_000, -39_990, 0, 10, 12_345, 49_999):
        end = int(np.searchsorted(oracle[0], bound, side="right"))
        for h in (heap, copy):
            got = h.pop_until(bound)
            for g, o in zip(got, oracle):
                np.testing.assert_array_equal(g, o[start:end])
        start = end
    assert len(heap) == len(copy) == 0


class ChunkedHeap(TimerHeap):
    insert_chunk = 30_000


@pytest.mark.parametrize("heap_class", [TimerHeap, ChunkedHeap], ids=lambda c: c.__name__)
def test_large_add_many_count_and_removal(heap_class):
    rng = np.random.default_rng(4)
    n = 200_000
    ts, kid, ns = rng.integers(0, 20_000, n), rng.integers(0, 40, n), np.zeros(n, np.int64)
    oracle = unique_sorted(ts, kid, ns)
    heap = heap_class()
    assert heap.add_many(ts, kid, ns) == len(oracle[0])
    assert heap.add_many(ts, kid, ns) == 0  # all duplicates now
    # remove a random tenth one by one, then everything must still come out sorted
    gone = rng.choice(len(oracle[0]), size=len(oracle[0]) // 10, replace=False)
    for i in gone.tolist():
        assert heap.remove(int(oracle[0][i]), int(oracle[1][i]), 0)
    keep = np.ones(len(oracle[0]), bool)
    keep[gone] = False
    got = heap.pop_until(INT64_MAX)
    for g, o in zip(got, oracle):
        np.testing.assert_array_equal(g, o[keep])


def test_heap_rejects_bad_input():
    heap = TimerHeap()
    with pytest.raises(TypeError):
        heap.add(1.5, 0, 0)
    with pytest.raises(OverflowError):
        heap.add(2**63, 0, 0)
    with pytest.raises(ValueError, match="differ in length"):
        heap.add_many(np.arange(3), np.arange(2), np.arange(3))
    with pytest.raises(TypeError, match="integers"):
        heap.add_many(np.ones(300), np.arange(300), np.arange(300))
    with pytest.raises(ValueError, match="one-dimensional"):
        heap.add_many(np.zeros((2, 2), np.int64), np.zeros(2), np.zeros(2))
    with pytest.raises(OverflowError, match="above the int64 range"):
        heap.add_many(np.full(3, 2**63, np.uint64), np.arange(3), np.arange(3))
    assert len(heap) == 0
    assert heap.pop_until(float("inf"))[0].size == 0
    assert heap.pop_until(float("-inf"))[0].size == 0


@pytest.mark.parametrize("heap_class", HEAP_CLASSES, ids=lambda c: c.__name__)
def test_heap_takes_any_integer_input(heap_class):
    """int32 / uint64 arrays and Python lists are converted, numpy scalars accepted."""
    heap = heap_class()
    assert heap.add_many(np.array([5, 3, 5], np.int32), np.array([1, 1, 1], np.uint64), [0, 0, 0]) == 2
    assert heap.add(np.int64(4), np.int32(1), 0)
    assert (np.int16(3), 1, 0) in heap
    assert repr(heap) == "TimerHeap(len=3, next=(3, 1, 0))"
    assert rows(heap.pop_until(np.int64(10))) == [(3, 1, 0), (4, 1, 0), (5, 1, 0)]


# ---------------------------------------------------------------------------
# Timer service
# ---------------------------------------------------------------------------

MAXP = 16


def make_keys(n: int, offset: int = 0) -> list:
    """ints, strings and tuples, in turn."""
    out = []
    for i in range(offset, offset + n):
        out.append(i if i % 3 == 0 else f"user-{i}" if i % 3 == 1 else ("t", i, float(i)))
    return out


class ServiceModel:
    """Expected timers as sets of (timestamp, key, namespace)."""

    def __init__(self) -> None:
        self.event: set = set()
        self.processing: set = set()

    def copy(self) -> "ServiceModel":
        m = ServiceModel()
        m.event, m.processing = set(self.event), set(self.processing)
        return m


def fired(service: TimerService, arrays) -> list:
    ts, kid, ns = arrays
    assert (np.diff(ts) >= 0).all()
    return list(zip(ts.tolist(), service.keys(kid), ns.tolist()))


def drain(service: TimerService) -> tuple[list, list]:
    return (fired(service, service.advance_watermark(INT64_MAX)),
            fired(service, service.fire_processing_time(INT64_MAX)))


def register_random(service: TimerService, model: ServiceModel, keys: list, rng, n: int) -> None:
    """Bulk and single registrations over ``keys`` (repeats included)."""
    ids = service.key_ids(keys, np.array([key_group_of(k, MAXP) for k in keys]))
    pick = rng.integers(0, len(keys), n)
    ts = rng.integers(0, 1_000, n)
    ns = rng.integers(0, 3, n) * 1_000
    service.register_event_time_timers(ids[pick], ns, ts)
    model.event |= {(int(t), keys[p], int(s)) for t, p, s in zip(ts, pick, ns)}
    for t, p, s in zip(ts[: n // 10].tolist(), pick[: n // 10].tolist(), ns.tolist()):
        service.register_processing_time_timer(int(ids[p]), s, t + 5_000)
        model.processing.add((t + 5_000, keys[p], s))


def delete_some(service: TimerService, model: ServiceModel, rng, fraction: float) -> None:
    for timers, delete in ((model.event, service.delete_event_time_timer),
                           (model.processing, service.delete_processing_time_timer)):
        chosen = sorted(timers, key=repr)
        for i in rng.choice(len(chosen), size=int(len(chosen) * fraction), replace=False):
            t, key, ns = chosen[i]
            delete(service.key_id(key, key_group_of(key, MAXP)), ns, t)
            timers.remove(chosen[i])


def build_service(seed: int) -> tuple[TimerService, ServiceModel, list]:
    rng = np.random.default_rng(seed)
    service = TimerService(max_parallelism=MAXP, key_groups=range(MAXP))
    model = ServiceModel()
    keys = make_keys(900)
    register_random(service, model, keys, rng, 6_000)
    delete_some(service, model, rng, 0.1)
    return service, model, keys


def timer_order(service: TimerService, timers) -> list:
    return sorted(timers, key=lambda t: (t[0], service.key_id(t[1], key_group_of(t[1], MAXP)), t[2]))


def keep_changing(service: TimerService, model: ServiceModel, rng) -> None:
    """What the processing thread does after a snapshot: in-place deletions and fires
    first, then new keys (the key table and its key-group array grow past their
    capacity) and many more timers (the heaps reallocate), then more of both."""
    delete_some(service, model, rng, 0.2)
    for bound in (300, 5_200):
        event = fired(service, service.advance_watermark(bound))
        assert event == timer_order(service, (t for t in model.event if t[0] <= bound))
        model.event -= set(event)
        processing = fired(service, service.fire_processing_time(bound))
        assert processing == timer_order(service, (t for t in model.processing if t[0] <= bound))
        model.processing -= set(processing)
    register_random(service, model, make_keys(3_000, offset=900), rng, 40_000)
    delete_some(service, model, rng, 0.1)
    model.event -= set(fired(service, service.advance_watermark(450)))


def check_sections(sections: dict, expected: ServiceModel) -> None:
    restored = TimerService(max_parallelism=MAXP, key_groups=range(MAXP))
    restored.restore(sections.items())
    event, processing = drain(restored)
    assert len(event) == len(expected.event) and set(event) == expected.event
    assert len(processing) == len(expected.processing) and set(processing) == expected.processing
    groups = {key_group_of(k, MAXP) for _, k, _ in expected.event | expected.processing}
    assert set(sections) == groups  # one section per non-empty key group


@pytest.mark.parametrize("concurrently", [False, True], ids=["after", "background-thread"])
def test_snapshot_equals_state_at_snapshot_time_while_service_keeps_changing(concurrently):
    rng = np.random.default_rng(11)
    service, model, _ = build_service(11)
    write = service.snapshot()
    at_snapshot = model.copy()
    sections: dict = {}
    if concurrently:
        thread = threading.Thread(target=lambda: sections.update(write()))
        thread.start()
        keep_changing(service, model, rng)
        thread.join()
    else:
        keep_changing(service, model, rng)
        sections = write()
    check_sections(sections, at_snapshot)
    # and the live service holds exactly the model's current timers
    check_sections(service.snapshot()(), model)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_restore_at_any_parallelism_fires_the_same_timers(parallelism):
    service, model, _ = build_service(5)
    sections = service.snapshot()()
    all_event, all_processing = [], []
    for subtask in range(parallelism):
        owned = key_group_range(subtask, parallelism, MAXP)
        part = TimerService(max_parallelism=MAXP, key_groups=owned)
        part.restore((kg, data) for kg, data in sections.items() if kg in owned)
        assert part.num_keys > 0
        for key_id in range(part.num_keys):
            assert key_group_of(part.key(key_id), MAXP) == part.key_group(key_id)
            assert part.key_group(key_id) in owned
        assert part.next_processing_time() == min(
            (t for t, k, _ in model.processing if key_group_of(k, MAXP) in owned), default=None)
        event, processing = drain(part)
        all_event += event
        all_processing += processing
    assert sorted(all_event, key=repr) == sorted(model.event, key=repr)
    assert sorted(all_processing, key=repr) == sorted(model.processing, key=repr)


def test_key_lists_are_pickled_in_chunks():
    """A key group with more keys than CHUNK_ENTRIES round-trips (several pickles)."""
    service = TimerService(max_parallelism=1, key_groups=range(1))
    keys = make_keys(2 * service_module.CHUNK_ENTRIES + 5)
    ids = service.key_ids(keys, np.zeros(len(keys), np.int64))
    service.register_event_time_timers(ids, np.zeros(len(ids), np.int64), ids * 10)
    sections = service.snapshot()()
    assert sections[0].count(b"\x80\x05") >= 3  # three pickle protocol-5 frames at least
    restored = TimerService(max_parallelism=1, key_groups=range(1))
    restored.restore(sections)
    event, _ = drain(restored)
    assert event == [(10 * i, key, 0) for i, key in enumerate(keys)]


def test_restore_into_a_running_service_and_rescale_twice():
    """Sections written at parallelism 3 restore at 2, whose sections restore at 1."""
    service, model, _ = build_service(8)
    sections = service.snapshot()()
    second: dict = {}
    for subtask in range(3):
        owned = key_group_range(subtask, 3, MAXP)
        part = TimerService(max_parallelism=MAXP, key_groups=owned)
        part.restore({kg: d for kg, d in sections.items() if kg in owned})
        second.update(part.snapshot()())
    assert second.keys() == sections.keys()
    whole = TimerService(max_parallelism=MAXP, key_groups=range(MAXP))
    whole.key_id("already-here", key_group_of("already-here", MAXP))
    whole.restore(second)
    event, processing = drain(whole)
    assert set(event) == model.event and set(processing) == model.processing


# A timer section's first 40 bytes, as written since its format 1: the 16-byte envelope
# (magic, format version, hash version, max_parallelism, key group), then its three counts.
HEADER = struct.Struct(">4sHHIIQQQ")


def header_of(section: bytes) -> tuple:
    return HEADER.unpack_from(section)


def with_header(section: bytes, **changes) -> bytes:
    fields = list(header_of(section))
    names = ["magic", "version", "hash_version", "max_parallelism", "key_group"]
    for name, value in changes.items():
        fields[names.index(name)] = value
    return HEADER.pack(*fields) + section[HEADER.size:]


def test_section_header_checks():
    service, _, _ = build_service(2)
    sections = service.snapshot()()
    kg, section = next(iter(sections.items()))
    assert header_of(section)[:5] == (b"RSTM", SectionKind.TIMERS.format_version, HASH_VERSION,
                                      MAXP, kg)

    def restore(pairs, max_parallelism=MAXP, key_groups=range(MAXP)):
        TimerService(max_parallelism=max_parallelism, key_groups=key_groups).restore(pairs)

    restore([(kg, section)])  # the untouched section restores
    with pytest.raises(ValueError, match="not a timer section"):
        restore([(kg, with_header(section, magic=b"RSKS"))])
    with pytest.raises(ValueError, match="unsupported timer section format 99"):
        restore([(kg, with_header(section, version=99))])
    with pytest.raises(ValueError, match="hash version 7"):
        restore([(kg, with_header(section, hash_version=7))])
    with pytest.raises(ValueError, match="max_parallelism 16, restoring with 32"):
        restore([(kg, section)], max_parallelism=32, key_groups=range(32))
    other = (kg + 1) % MAXP
    with pytest.raises(ValueError, match=f"handed over as key group {other} holds key group {kg}"):
        restore([(other, section)])
    with pytest.raises(ValueError, match=f"key group {kg} handed to a subtask owning"):
        restore([(kg, section)], key_groups=range(kg + 1, MAXP) if kg + 1 < MAXP else range(0, kg))
    with pytest.raises(ValueError, match="restored twice"):
        restore([(kg, section), (kg, section)])
    with pytest.raises(ValueError, match="too short"):
        restore([(kg, section[:10])])
    with pytest.raises(ValueError, match="truncated in its counts"):
        restore([(kg, section[:20])])
    with pytest.raises(ValueError, match="truncated"):
        restore([(kg, section[:HEADER.size + 4])])
    with pytest.raises(ValueError, match="truncated in its keys"):
        restore([(kg, section[:-3])])


def test_key_table():
    service = TimerService(max_parallelism=MAXP, key_groups=range(4, 12))
    keys = [k for k in make_keys(200) if key_group_of(k, MAXP) in range(4, 12)]
    groups = np.array([key_group_of(k, MAXP) for k in keys])
    ids = service.key_ids(keys[:10] + keys[:3], np.concatenate([groups[:10], groups[:3]]))
    assert ids.tolist() == list(range(10)) + [0, 1, 2]
    ids = service.key_ids(keys, groups)  # old and new keys mixed
    assert ids.tolist() == list(range(len(keys)))
    assert service.keys(ids[::-1]) == keys[::-1]
    assert [service.key_group(i) for i in ids.tolist()] == groups.tolist()
    assert service.key_groups_of(ids[::-1]).tolist() == groups[::-1].tolist()
    assert service.num_keys == len(keys)
    assert service.key_id(keys[5], int(groups[5])) == 5
    assert service.key_ids([], np.array([], np.int64)).size == 0
    with pytest.raises(ValueError, match="was registered in key group"):
        service.key_id(keys[5], int(groups[5]) + 1 if groups[5] < 11 else 4)
    outside = next(k for k in make_keys(50, offset=1000) if key_group_of(k, MAXP) not in range(4, 12))
    with pytest.raises(ValueError, match="outside this subtask's key groups 4..11"):
        service.key_ids([outside], np.array([key_group_of(outside, MAXP)]))
    with pytest.raises(ValueError, match="unknown key id"):
        service.register_event_time_timer(len(keys), 0, 10)
    with pytest.raises(ValueError, match="unknown key id"):
        service.register_event_time_timers(np.array([0, -1]), np.zeros(2, np.int64), np.ones(2))


def test_service_rejects_bad_input():
    with pytest.raises(TypeError, match="contiguous range"):
        TimerService(max_parallelism=MAXP, key_groups=[0, 1])
    with pytest.raises(ValueError, match="must be positive"):
        TimerService(max_parallelism=0, key_groups=range(0))
    with pytest.raises(ValueError, match="non-empty range within"):
        TimerService(max_parallelism=MAXP, key_groups=range(8, 17))
    service = TimerService(max_parallelism=MAXP, key_groups=range(MAXP))
    with pytest.raises(ValueError, match="2 keys but 1 key groups"):
        service.key_ids(["a", "b"], np.array([1]))
    a = service.key_id("a", key_group_of("a", MAXP))
    wrong = (key_group_of("a", MAXP) + 1) % MAXP
    with pytest.raises(ValueError, match="key 'a' was registered in key group"):
        service.key_ids(["b", "a"], np.array([key_group_of("b", MAXP), wrong]))
    with pytest.raises(IndexError):
        service.key_group(5)
    with pytest.raises(IndexError):
        service.key_groups_of(np.array([a, 5]))
    assert "keys=1" in repr(service)  # a failed call appends nothing
    service.register_event_time_timer(a, 0, 10)
    section = service.snapshot()()[key_group_of("a", MAXP)]
    size = HEADER.size
    arrays_end = size + 3 * 8  # one event-time timer, no processing-time timer
    assert pickle.loads(section[arrays_end:]) == ["a"]
    bad_keys = section[:arrays_end] + pickle.dumps(["a", "extra"], protocol=5)
    with pytest.raises(ValueError, match="bad key list"):
        TimerService(max_parallelism=MAXP, key_groups=range(MAXP)).restore(
            [(key_group_of("a", MAXP), bad_keys)])
    header = list(HEADER.unpack_from(section))
    header[7] = 0  # no keys, yet a timer refers to key 0
    no_keys = HEADER.pack(*header) + section[size:arrays_end] + \
        pickle.dumps([], protocol=5)
    with pytest.raises(ValueError, match="refers to a missing key"):
        TimerService(max_parallelism=MAXP, key_groups=range(MAXP)).restore(
            [(key_group_of("a", MAXP), no_keys)])


def test_processing_time_timers():
    service = TimerService(max_parallelism=MAXP, key_groups=range(MAXP))
    a = service.key_id("a", key_group_of("a", MAXP))
    b = service.key_id("b", key_group_of("b", MAXP))
    assert service.next_processing_time() is None
    service.register_processing_time_timer(a, 0, 300)
    service.register_processing_time_timer(b, 0, 100)
    service.register_processing_time_timer(b, 0, 100)  # duplicate: no second timer
    service.register_processing_time_timers(np.array([a, b]), np.array([1, 1]), np.array([200, 400]))
    service.delete_processing_time_timer(a, 1, 200)
    service.delete_processing_time_timer(a, 1, 200)  # absent: no-op
    assert service.num_processing_time_timers == 3
    assert service.next_processing_time() == 100
    assert fired(service, service.fire_processing_time(350)) == [(100, "b", 0), (300, "a", 0)]
    assert service.next_processing_time() == 400
    assert service.num_event_time_timers == 0 and service.next_event_time() is None
    service.register_event_time_timer(a, 0, 77)
    assert service.next_event_time() == 77
    assert service.snapshot().num_timers == 2


def test_docstring_examples_run():
    for module in (heap_module, service_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
