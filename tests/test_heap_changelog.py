"""Incremental checkpoints of the heap backend (checkpoint/heap_changelog.py), on the backend.

Hypothesis draws a run: updates of value, list and map state (also changes made in
place to a value read from state, which the backend never sees written), snapshots,
and for each snapshot whether and when its checkpoint is uploaded and completed or
aborted, overlapping others. Every completed checkpoint's chain is read back from
real checkpoint storage by backends of other key-group ranges, and must hold exactly
what a plain dict model of the same run held at that snapshot. The run also checks
the bound on what a restore reads: a chain's changes never add up to more than
``max_changes_ratio`` times its full snapshot. The job-level tests (a SIGKILL, a
restore at another parallelism, retention) are tests/test_incremental_checkpoints.py's,
on both backends.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raystream.checkpoint.heap_changelog import HeapStateOptions, restored_chain
from raystream.checkpoint.sections import decode_sections
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.storage import CheckpointStorage, StateHandle
from raystream.checkpoint.keygroups import key_group_range

MAXP = 32
KEYS = 60

# one step of a run
writes = st.tuples(st.sampled_from(["add", "clear", "append", "mutate", "put", "remove"]),
                   st.integers(0, KEYS - 1), st.integers(0, 3))
steps = st.one_of(
    st.tuples(st.just("writes"), st.lists(writes, min_size=1, max_size=12)),
    # True: leave it pending for a while (it and others still pending then overlap)
    st.tuples(st.just("snapshot"), st.sampled_from([False, False, True])),
    st.tuples(st.just("finish"), st.sampled_from(["complete", "abort", "savepoint"])))


class Model:
    """What the backend must hold: value (int), list (of lists) and map state per key."""

    def __init__(self) -> None:
        self.value: dict[int, int] = {}
        self.lists: dict[int, list[list[int]]] = {}
        self.maps: dict[int, dict[int, int]] = {}

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def apply(self, op: str, key: int, x: int, states) -> None:
        backend, value, lists, maps = states
        backend.set_current_key(key)
        if op == "add":
            value.update(value.value() + x + 1)
            self.value[key] = self.value.get(key, 0) + x + 1
        elif op == "clear":
            value.clear()
            self.value.pop(key, None)
        elif op == "append":
            lists.add([x])
            self.lists.setdefault(key, []).append([x])
        elif op == "mutate":  # in place, through a list element read from state
            got = lists.get()
            if got:
                got[0].append(x)
                self.lists[key][0].append(x)
        elif op == "put":
            maps.put(x, key)
            self.maps.setdefault(key, {})[x] = key
        elif op == "remove":
            maps.remove(x)
            if key in self.maps:
                self.maps[key].pop(x, None)
                if not self.maps[key]:
                    del self.maps[key]


def read_back(storage: CheckpointStorage, handle: dict) -> Model:
    """The chain of ``handle`` restored at parallelism 3, read into a model."""
    got = Model()
    for index in range(3):
        groups = key_group_range(index, 3, MAXP)
        backend = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=groups)
        sections = [s for f in handle["files"] for s in decode_sections(
            storage.read_state(StateHandle.from_json(f)), groups)]
        backend.restore(sections)
        value, lists, maps = (backend.value_state("v", default=0), backend.list_state("l"),
                              backend.map_state("m"))
        for key in backend.keys("v"):
            backend.set_current_key(key)
            got.value[key] = value.value()
        for key in backend.keys("l"):
            backend.set_current_key(key)
            got.lists[key] = lists.get()
        for key in backend.keys("m"):
            backend.set_current_key(key)
            got.maps[key] = dict(maps.items())
    return got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=st.lists(steps, min_size=6, max_size=40), ratio=st.sampled_from([0.0, 0.5, 3.0]))
def test_every_completed_chain_restores_the_state_of_its_snapshot(run, ratio):
    with tempfile.TemporaryDirectory(prefix="heap-chain-") as directory:
        check_chain_restores(CheckpointStorage(directory), run, ratio)


def check_chain_restores(storage: CheckpointStorage, run, ratio) -> None:
    backend = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP),
                                    options=HeapStateOptions(max_changes_ratio=ratio))
    states = (backend, backend.value_state("v", default=0), backend.list_state("l"),
              backend.map_state("m"))
    model = Model()
    pending: list[tuple[int, object, Model]] = []  # snapshots not finished, oldest first
    n = 0
    for step in run:
        if step[0] == "writes":
            for op, key, x in step[1]:
                model.apply(op, key, x, states)
        elif step[0] == "snapshot":
            n += 1
            pending.append((n, backend.snapshot(), model.copy()))
            if not step[1]:  # finish it (and every older one) now
                step = ("finish", "complete")
        if step[0] == "finish" and pending:
            checkpoint_id, snapshot, expected = pending.pop(0)
            if step[1] == "savepoint":  # full sections, never uploaded
                assert snapshot() is not None
                continue
            handle = snapshot.upload(storage, "job", checkpoint_id, "op-0")
            assert snapshot() == {}  # uploaded: nothing left for the state file
            if step[1] == "abort":
                continue
            backend.notify_checkpoint_complete(checkpoint_id)
            got = read_back(storage, handle)
            assert got.value == expected.value
            assert got.lists == expected.lists
            assert got.maps == expected.maps
            base = backend._chains.base()
            if base is not None and base.files == tuple(handle["files"]):
                assert base.changed_entries <= ratio * max(base.full_entries, 1) + 1e-9


def test_a_chain_writes_changes_only_and_starts_over_past_its_ratio(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    backend = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP),
                                    options=HeapStateOptions(max_changes_ratio=0.5))
    count = backend.value_state("count", default=0)

    def touch(keys):
        for key in keys:
            backend.set_current_key(key)
            count.update(count.value() + 1)

    def checkpoint(n):
        snapshot = backend.snapshot()
        handle = snapshot.upload(storage, "job", n, "op-0")
        backend.notify_checkpoint_complete(n)
        return snapshot.base is not None, handle

    touch(range(10_000))
    assert checkpoint(1)[0] is False  # the first is full
    sizes = []
    for n, start in enumerate([0, 2000, 4000], start=2):
        touch(range(start, start + 2000))
        changes, handle = checkpoint(n)
        sizes.append((changes, len(handle["files"]), handle["uploaded"]))
    # 2,000 and 4,000 changed entries fit in half of 10,000; 6,000 do not: a full snapshot
    assert [s[:2] for s in sizes] == [(True, 2), (True, 3), (False, 1)]
    assert sizes[0][2] < sizes[2][2] / 3  # changes of a fifth of the keys, against all
    changes, handle = checkpoint(5)  # nothing changed: the same files again
    assert changes and handle["files"] == [handle["files"][0]] and handle["uploaded"] == 0


def test_after_a_failover_the_next_checkpoint_extends_the_restored_chain(tmp_path):
    """A backend that restored its own job's chain at the same key groups writes only the
    changes since the restore; restoring the longer chain gives the state of its snapshot.
    Another job's chain, or other key groups, start a new one (a full snapshot)."""
    storage = CheckpointStorage(str(tmp_path))
    options = HeapStateOptions(max_changes_ratio=0.5)
    expected: dict[int, int] = {}

    def touch(backend, keys, remove=()):
        count = backend.value_state("count", default=0)
        for key in keys:
            backend.set_current_key(key)
            count.update(count.value() + 1)
            expected[key] = expected.get(key, 0) + 1
        for key in remove:
            backend.set_current_key(key)
            count.clear()
            expected.pop(key, None)

    def checkpoint(backend, n):
        snapshot = backend.snapshot()
        handle = snapshot.upload(storage, "job", n, "op-0")
        backend.notify_checkpoint_complete(n)
        return snapshot.base is not None, handle

    def restored(handle, own_shared_dir):
        backend = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP),
                                        options=options)
        backend.restore([s for f in handle["files"] for s in decode_sections(
            storage.read_state(StateHandle.from_json(f)), range(MAXP))])
        chain = restored_chain(handle, key_groups=range(MAXP), own_shared_dir=own_shared_dir)
        if chain is not None:
            backend.extend_restored(chain)
        return backend

    first = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP), options=options)
    touch(first, range(1000))
    checkpoint(first, 1)
    touch(first, range(100))
    _, handle = checkpoint(first, 2)
    assert len(handle["files"]) == 2
    at_restore = dict(expected)

    after = restored(handle, storage.shared_dir("job"))  # the failover
    touch(after, range(100, 150), remove=[7])
    changes, longer = checkpoint(after, 3)
    assert changes and longer["files"][:2] == handle["files"] and len(longer["files"]) == 3
    assert longer["uploaded"] < handle["files"][0]["size"] / 2  # 51 entries, not 1,000
    assert longer["entries"] == [1000, 100 + 51]
    counts = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP))
    counts.restore([s for f in longer["files"] for s in decode_sections(
        storage.read_state(StateHandle.from_json(f)), range(MAXP))])
    count = counts.value_state("count", default=0)
    got = {}
    for key in counts.keys("count"):
        counts.set_current_key(key)
        got[key] = count.value()
    assert got == expected

    expected.clear()
    expected.update(at_restore)
    elsewhere = restored(handle, str(tmp_path / "another-job" / "shared"))
    touch(elsewhere, [1])
    assert checkpoint(elsewhere, 4)[0] is False  # another job's files: a full snapshot


def test_off_or_without_checkpoints_every_snapshot_is_full():
    from raystream.checkpoint.heap_backend import StateSnapshot
    from raystream.checkpoint.state_backend import create_keyed_state_backend

    off = create_keyed_state_backend(HeapStateOptions(incremental=False), max_parallelism=MAXP,
                                     key_groups=range(MAXP), checkpointing=True)
    plain = create_keyed_state_backend("heap", max_parallelism=MAXP, key_groups=range(MAXP))
    for backend in (off, plain):
        backend.set_current_key(1)
        backend.value_state("v").update(1)
        assert isinstance(backend.snapshot(), StateSnapshot)


def test_the_disk_backend_refuses_a_heap_chain_naming_the_way_out(tmp_path):
    from raystream.checkpoint.disk_state import DiskKeyedStateBackend

    storage = CheckpointStorage(str(tmp_path))
    backend = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP),
                                    options=HeapStateOptions())
    value = backend.value_state("v", default=0)
    for n in (1, 2):
        for key in range(100) if n == 1 else range(100, 110):  # the second: changes
            backend.set_current_key(key)
            value.update(key)
        snapshot = backend.snapshot()
        handle = snapshot.upload(storage, "job", n, "op-0")
        backend.notify_checkpoint_complete(n)
    assert len(handle["files"]) == 2
    sections = [s for f in handle["files"] for s in decode_sections(
        storage.read_state(StateHandle.from_json(f)), range(MAXP))]
    disk = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP))
    try:
        with pytest.raises(ValueError, match="state_backend='heap'.*savepoint"):
            disk.restore(sections)
    finally:
        disk.close()
