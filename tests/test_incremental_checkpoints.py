"""Incremental checkpoints of the disk (RocksDB) keyed state backend, and of the heap
backend (its chains of changes: tests/test_heap_changelog.py tests them on the backend).

Backend-level tests write real RocksDB files to real checkpoint storage and check
restores against a dict oracle built with pandas; the Ray tests run the keyed
running sum of tests/test_exactly_once.py on incremental checkpoints of either
backend (the heap's with changes in every checkpoint) through a SIGKILL of a
subtask's process, restore a cancelled run at another parallelism (the final
running sum per key against pandas), and check that retention leaves exactly the
shared files the retained checkpoints reference.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from raystream.checkpoint.disk_incremental import RestoredDb, db_handle_files
from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.heap_changelog import is_heap_chain
from raystream.checkpoint.keygroups import key_group_range
from raystream.checkpoint.metadata import CheckpointMetadata, OperatorFiles
from raystream.checkpoint.shared_state import SharedStateRegistry
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.storage import CheckpointStorage, CorruptCheckpointError
from tests.support.pacing import Throttle

MAXP = 128
JOB = "job"


@pytest.fixture
def backends():
    made = []

    def make(key_groups=range(MAXP), **options):
        b = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=key_groups,
                                  options=DiskStateOptions(incremental=True, **options))
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


def rows(n: int, keys: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, keys, n), "v": rng.integers(-1000, 1000, n)})


def add_rows(b: DiskKeyedStateBackend, frame: pd.DataFrame) -> None:
    """Sum of ``v`` and a list of every ``v`` per key, one update per row."""
    total, seen = b.value_state("sum", default=0), b.list_state("seen")
    for k, v in frame[["k", "v"]].itertuples(index=False):
        b.set_current_key(int(k))
        total.update(total.value() + int(v))
        seen.add(int(v))


def oracle(frame: pd.DataFrame, key_groups: range = range(MAXP)) -> dict:
    from raystream.checkpoint.keygroups import key_group_of

    sums = frame.groupby("k")["v"].sum()
    lists = frame.groupby("k")["v"].agg(list)
    return {int(k): (int(sums[k]), [int(v) for v in lists[k]]) for k in sums.index
            if key_group_of(int(k), MAXP) in key_groups}


def contents(b: DiskKeyedStateBackend) -> dict:
    total, seen = b.value_state("sum", default=0), b.list_state("seen")
    out = {}
    for key in list(b.keys("sum")):
        b.set_current_key(key)
        out[key] = (total.value(), seen.get())
    return out


def checkpoint(b: DiskKeyedStateBackend, storage: CheckpointStorage, n: int,
               stem: str = "sum-0") -> dict:
    """Checkpoint ``n`` of ``b``, completed: its keyed-database handle."""
    snapshot = b.snapshot()
    handle = snapshot.upload(storage, JOB, n, stem)
    assert snapshot() == {}  # uploaded: the backend's part of the sections is empty
    assert not os.path.exists(snapshot.local_dir)  # the local RocksDB checkpoint is gone
    b.notify_checkpoint_complete(n)
    return handle


def shared(handle: dict) -> dict[str, int]:
    return {h["path"]: h["size"] for h in db_handle_files(handle) if "/shared/" in h["path"]}


def test_a_second_checkpoint_uploads_only_new_files(backends, tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    b = backends()
    first = rows(20_000, 5_000, seed=1)
    add_rows(b, first)
    h1 = checkpoint(b, storage, 1)
    assert shared(h1) and h1["uploaded"] >= sum(shared(h1).values())

    second = rows(300, 5_000, seed=2)  # few changes: one small new SST file
    add_rows(b, second)
    h2 = checkpoint(b, storage, 2)
    new = {p: s for p, s in shared(h2).items() if p not in shared(h1)}
    assert set(shared(h1)) <= set(shared(h2))  # nothing compacted away: all reused
    assert new and all(CheckpointStorage.shared_file_checkpoint(p) == 2 for p in new)
    private = sum(h["size"] for h in db_handle_files(h2) if "/shared/" not in h["path"])
    assert h2["uploaded"] == sum(new.values()) + private + h2["size"]
    assert sum(new.values()) < sum(shared(h1).values()) / 5
    # every file on disk is one a checkpoint references
    assert set(storage.shared_files(JOB)) == set(shared(h2))


def test_restore_at_the_same_and_at_other_parallelisms_equals_the_oracle(backends, tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    frame = rows(6_000, 800, seed=3)
    one = backends()
    add_rows(one, frame[:3000])
    checkpoint(one, storage, 1)
    add_rows(one, frame[3000:])
    handle = checkpoint(one, storage, 2)
    dbs = [RestoredDb.read(storage, handle)]

    same = backends()  # adopts the downloaded database
    same.restore_db(dbs)
    assert contents(same) == oracle(frame)

    halves = [key_group_range(i, 2, MAXP) for i in range(2)]  # 1 -> 2
    parts = [backends(groups) for groups in halves]
    for part, groups in zip(parts, halves):
        part.restore_db(dbs)
        assert contents(part) == oracle(frame, groups)
        assert stored_groups(part) <= set(groups)  # the other half deleted by range

    more = rows(2_000, 800, seed=4)  # the two go on, then 2 -> 1 (and 2 -> 3)
    handles = []
    for i, part in enumerate(parts):
        add_rows(part, more[[g in halves[i] for g in _groups(more)]])
        handles.append(checkpoint(part, storage, 3, stem=f"sum-{i}"))
    both = pd.concat([frame, more])
    dbs = [RestoredDb.read(storage, h) for h in handles]
    merged = backends()
    merged.restore_db(dbs)
    assert contents(merged) == oracle(both)
    for i in range(3):
        groups = key_group_range(i, 3, MAXP)
        third = backends(groups)
        third.restore_db(dbs)
        assert contents(third) == oracle(both, groups)
        assert stored_groups(third) <= set(groups)


def stored_groups(b: DiskKeyedStateBackend) -> set[int]:
    """Key groups of every entry in the backend's database, unbounded (the backend's
    own reads never go outside its key groups)."""
    return {int.from_bytes(k[:2], "big") for k in b._db.keys()}


def test_after_a_failover_the_restored_files_are_referenced_again(backends, tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    frame = rows(6_000, 800, seed=8)
    b = backends()
    add_rows(b, frame)
    h1 = checkpoint(b, storage, 1)
    own = RestoredDb.read(storage, h1, storage.shared_dir(JOB))
    other = RestoredDb.read(storage, h1, str(tmp_path / "elsewhere" / "shared"))
    assert own.reusable and not other.reusable
    restored, elsewhere = backends(), backends()
    restored.restore_db([own])
    elsewhere.restore_db([other])
    more = rows(100, 800, seed=9)
    add_rows(restored, more)
    add_rows(elsewhere, more)
    h2 = checkpoint(restored, storage, 2)
    assert set(shared(h1)) <= set(shared(h2))  # the job's own files: reused
    assert sum(s for p, s in shared(h2).items() if p not in shared(h1)) < \
        sum(shared(h1).values()) / 5
    h3 = checkpoint(elsewhere, storage, 3, stem="sum-1")  # another job's: all uploaded once
    assert not set(shared(h1)) & set(shared(h3))
    assert contents(restored_from(backends, storage, h2)) == oracle(pd.concat([frame, more]))


def restored_from(backends, storage: CheckpointStorage, handle: dict) -> DiskKeyedStateBackend:
    b = backends()
    b.restore_db([RestoredDb.read(storage, handle)])
    return b


def test_the_registry_deletes_what_no_retained_checkpoint_references(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    local = tmp_path / "f.sst"
    local.write_bytes(b"x" * 10)

    def upload(n: int) -> dict:
        return storage.write_shared_file(JOB, n, f"{n}{os.urandom(4).hex()}.sst",
                                         str(local)).to_json()

    def metadata(n: int, files: list[dict]) -> CheckpointMetadata:
        db = {"path": "m", "size": 0, "sha256": "0" * 64, "key_groups": [0, 128],
              "files": files}
        return CheckpointMetadata(job="j", checkpoint_id=n, attempt=0, trigger_ts_ms=0,
                                  max_parallelism=128, hash_version=1,
                                  operators={"sum": OperatorFiles(keyed_db=(db,))})
    registry = SharedStateRegistry(storage, JOB)
    a, b = upload(1), upload(1)
    registry.register(1, metadata(1, [a, b]))
    aborted = upload(2)  # checkpoint 2 aborts after uploading
    c = upload(3)
    m3 = metadata(3, [a, c])
    assert registry.unknown(3, m3) == []
    registry.register(3, m3)
    registry.release(1)  # retention discards 1: b goes, a stays (3 uses it)
    registry.sweep(3)  # the aborted upload goes
    assert set(storage.shared_files(JOB)) == {a["path"], c["path"]} == registry.referenced()
    late = metadata(4, [b, upload(4)])  # reuses b, deleted meanwhile: must not complete
    assert registry.unknown(4, late) == [b["path"]]
    assert aborted["path"] not in storage.shared_files(JOB)


def _groups(frame: pd.DataFrame) -> list[int]:
    from raystream.checkpoint.keygroups import key_group_of

    return [key_group_of(int(k), MAXP) for k in frame["k"]]


def test_a_savepoint_is_full_sections_either_backend_restores(backends):
    frame = rows(3_000, 400, seed=5)
    b = backends()
    add_rows(b, frame)
    snapshot = b.snapshot()
    sections = snapshot()  # not uploaded: the full section format
    assert not os.path.exists(snapshot.local_dir)
    heap = HeapKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP))
    heap.restore(sections)
    total = heap.value_state("sum", default=0)
    got = {}
    for key in list(heap.keys("sum")):
        heap.set_current_key(key)
        got[key] = total.value()
    assert got == {k: s for k, (s, _) in oracle(frame).items()}
    disk = backends()
    disk.restore(sections)
    assert contents(disk) == oracle(frame)


def test_a_corrupt_or_missing_shared_file_is_named(backends, tmp_path):
    storage = CheckpointStorage(str(tmp_path / "chk"))
    b = backends()
    add_rows(b, rows(2_000, 300, seed=6))
    handle = checkpoint(b, storage, 1)
    victim = sorted(shared(handle))[0]
    with open(victim, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff")
    db = RestoredDb.read(storage, handle)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as err:
        backends().restore_db([db])
    assert err.value.path == victim
    os.remove(victim)
    with pytest.raises(CorruptCheckpointError, match="missing") as err:
        backends(range(0, 64)).restore_db([db])
    assert err.value.path == victim


# ---------------------------------------------------------------------------
# Real Ray jobs on incremental checkpoints
# ---------------------------------------------------------------------------

# the incremental checkpoints of each backend; the heap's chain never starts over, so
# every checkpoint after the first writes changes
INCREMENTAL = {"disk": DiskStateOptions(memory_mb=16, incremental=True),
               "heap": rs.HeapStateOptions(max_changes_ratio=1e9)}


def incremental_env(storage: str, parallelism: int = 2, interval_s: float = 0.25,
                    retained: int = 2, backend: str = "disk") -> rs.StreamEnvironment:
    return rs.StreamEnvironment(
        parallelism=parallelism,
        checkpoints=rs.CheckpointConfig(
            interval_s=interval_s, storage=storage, retained=retained,
            state_backend=INCREMENTAL[backend]),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))


def slow_throttle(batch):
    time.sleep(0.04)  # about 5 s a run: time for two checkpoints before a kill or a cancel
    return batch


def running_sum_job(env: rs.StreamEnvironment, slow: bool = False,
                    backend: str = "disk") -> rs.SinkHandle:
    from tests.support.functions import RunningSum
    from tests.support.inputs import N, SPLITS, numbers
    throttle = Throttle(0.02)

    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    return source.map_batches(slow_throttle if slow else throttle, name="throttle").key_by(
        "k").process(RunningSum(backend), name="sum").collect(name="out")


def only_job_dir(root) -> str:
    (job,) = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))]
    return os.path.join(root, job)


def longest_chain(job_dir: str) -> int:
    """Files in the longest heap chain of the job's newest completed checkpoint."""
    storage, job = CheckpointStorage(os.path.dirname(job_dir)), os.path.basename(job_dir)
    newest = max(storage.completed_checkpoint_ids(job))
    metadata = CheckpointMetadata.from_json(storage.read_metadata(job, newest))
    return max(len(db_handle_files(db)) for files in metadata.operators.values()
               for db in files.keyed_db if is_heap_chain(db))


def oldest_chain_start(job_dir: str) -> int:
    """The checkpoint that uploaded the first file of the oldest heap chain of the job's
    newest completed checkpoint."""
    storage, job = CheckpointStorage(os.path.dirname(job_dir)), os.path.basename(job_dir)
    newest = max(storage.completed_checkpoint_ids(job))
    metadata = CheckpointMetadata.from_json(storage.read_metadata(job, newest))
    starts = [CheckpointStorage.shared_file_checkpoint(db_handle_files(db)[0]["path"])
              for files in metadata.operators.values() for db in files.keyed_db
              if is_heap_chain(db)]
    return min(n for n in starts if n is not None)


def retained_references(job_dir: str) -> set[str]:
    storage, job = CheckpointStorage(os.path.dirname(job_dir)), os.path.basename(job_dir)
    out = set()
    for n in storage.completed_checkpoint_ids(job):
        metadata = CheckpointMetadata.from_json(storage.read_metadata(job, n))
        out |= {h["path"] for files in metadata.operators.values() for db in files.keyed_db
                for h in db_handle_files(db) if "/shared/" in h["path"]}
    return out


@pytest.mark.parametrize("backend", [pytest.param("disk", marks=pytest.mark.slow), "heap"])
def test_a_sigkilled_subtask_restores_from_incremental_checkpoints(ray_session, tmp_path,
                                                                   backend):
    import ray

    from tests.support.oracles import assert_exactly_once
    from tests.support.jobs import wait_for_checkpoint

    env = incremental_env(str(tmp_path / "chk"), backend=backend)
    sink = running_sum_job(env, slow=True, backend=backend)
    client = env.execute_async("incremental-kill")
    completed = wait_for_checkpoint(client)
    completed = wait_for_checkpoint(client, after=completed)  # a second one: an increment
    pid = ray.get(client.subtask_actor("sum", 1).metrics.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    result = client.wait(timeout_s=240)
    assert result.restarts == 1
    assert result.restores[0]["checkpoint_id"] >= completed > 0
    assert_exactly_once(result.table(sink))
    job_dir = only_job_dir(tmp_path / "chk")
    referenced = retained_references(job_dir)
    present = set(CheckpointStorage(str(tmp_path / "chk")).shared_files(
        os.path.basename(job_dir)))
    assert referenced and referenced <= present
    if backend == "heap":  # the second checkpoint on wrote changes: the restore read a chain
        assert longest_chain(job_dir) > 1
        # and the restored subtasks extended it: the newest chains begin at or before the
        # restored checkpoint (a chain started over after the restore would begin after it)
        assert oldest_chain_start(job_dir) <= result.restores[0]["checkpoint_id"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["disk", "heap"])
def test_a_cancelled_run_restores_at_another_parallelism(ray_session, tmp_path, backend):
    from tests.support.inputs import KEYS, N, numbers
    from tests.support.jobs import wait_for_checkpoint

    env = incremental_env(str(tmp_path / "chk"), backend=backend)
    running_sum_job(env, slow=True, backend=backend)
    client = env.execute_async("incremental-p2")
    wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    client.cancel()
    client.wait(timeout_s=120)
    job_dir = only_job_dir(tmp_path / "chk")
    if backend == "heap":
        assert longest_chain(job_dir) > 1
    env = incremental_env(str(tmp_path / "chk-p3"), parallelism=3, backend=backend)
    sink = running_sum_job(env, backend=backend)
    result = env.execute("incremental-p3", restore_from=job_dir)
    out = result.table(sink).to_pandas()
    assert len(out) > 0 and len(out) < N  # restored midway
    # each key's last running sum (count and total of v) equals pandas over all input
    frame = pd.DataFrame(numbers(np.arange(N)))
    expected = frame.groupby("k").agg(n=("n", "sum"), v=("v", "sum"))
    last = out.sort_values("n").groupby("k").last()
    assert set(last.index) <= set(range(KEYS))
    pd.testing.assert_frame_equal(last[["n", "v"]].astype("int64"),
                                  expected.loc[last.index, ["n", "v"]].astype("int64"),
                                  check_names=False)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["disk", "heap"])
def test_retention_keeps_exactly_the_referenced_shared_files(ray_session, tmp_path, backend):
    from tests.support.oracles import assert_exactly_once

    env = incremental_env(str(tmp_path / "chk"), interval_s=0.1, retained=2, backend=backend)
    sink = running_sum_job(env, backend=backend)
    result = env.execute("incremental-retention")
    assert_exactly_once(result.table(sink))
    assert len(result.checkpoints) >= 5
    job_dir = only_job_dir(tmp_path / "chk")
    storage = CheckpointStorage(str(tmp_path / "chk"))
    job = os.path.basename(job_dir)
    assert len(storage.completed_checkpoint_ids(job)) <= 2
    referenced = retained_references(job_dir)
    assert referenced
    assert set(storage.shared_files(job)) == referenced


def test_the_coordinator_registers_releases_sweeps_and_refuses_deleted_files(tmp_path):
    from tests.support.coordinator import JOB as CJOB, ack_all, make, subtask_state

    coord, rec = make(tmp_path, retained=1, subtasks=[(0, 0)])
    storage = coord.storage
    local = tmp_path / "local.sst"
    local.write_bytes(b"sst" * 100)

    def upload(n: int) -> dict:
        return storage.write_shared_file(CJOB, n, f"{os.urandom(4).hex()}.sst",
                                         str(local)).to_json()

    def checkpoint_with(files: list[dict]) -> int:
        n = coord.trigger()
        manifest = storage.write_state(CJOB, n, "sum-0.keyed-db", b"{}").to_json()
        db = {**manifest, "key_groups": [0, 128], "files": files}
        ack_all(coord, n, {(0, 0): {"sum": subtask_state(keyed_db=db)}})
        return n

    def on_disk() -> set[str]:
        return set(storage.shared_files(CJOB))

    a, b = upload(1), upload(1)
    assert checkpoint_with([a, b]) == 1 and rec.completed == [1]
    c = upload(2)
    checkpoint_with([a, c])  # retention discards 1: b goes
    assert rec.completed == [1, 2] and on_disk() == {a["path"], c["path"]}
    aborted = coord.trigger()
    upload(aborted)  # uploaded, then the checkpoint aborts: swept at the next completion
    coord.abort(aborted, "declined")
    e = upload(4)
    checkpoint_with([a, c, e])
    assert rec.completed == [1, 2, 4] and on_disk() == {a["path"], c["path"], e["path"]}
    late = checkpoint_with([a, b])  # reuses b, deleted meanwhile: aborted, not completed
    assert late in rec.aborted and late not in rec.completed
    assert "shared state files" in coord.history[late].reason

    successor, _ = make(tmp_path, retained=1, subtasks=[(0, 0)])  # a new job master
    successor.take_over()
    assert successor.shared_state.referenced() == {a["path"], c["path"], e["path"]}

    with open(c["path"], "r+b") as f:  # a shared file is damaged: named, as any file
        f.write(b"XYZ")
    with pytest.raises(CorruptCheckpointError) as err:
        coord.verified_restore_spec()  # 4 committed output: no going back past it
    assert err.value.path == c["path"]


def effective_options(b: DiskKeyedStateBackend) -> dict[str, str]:
    """The table options RocksDB wrote to the newest OPTIONS file of ``b``'s database when
    it opened it (what it runs with, not what it was asked)."""
    newest = max((f for f in os.listdir(b.path) if f.startswith("OPTIONS-")),
                 key=lambda f: int(f.split("-")[1]))
    with open(os.path.join(b.path, newest)) as f:
        pairs = (line.strip().split("=", 1) for line in f if "=" in line)
        return {k: v for k, v in pairs if k in ("filter_policy", "no_block_cache")}


def test_a_restored_database_keeps_the_block_cache_and_bloom_filters(backends, tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    first = backends(memory_mb=96)
    add_rows(first, rows(2000, 300, seed=5))
    handle = checkpoint(first, storage, 1)
    restored = backends(memory_mb=96)
    restored.restore_db([RestoredDb.read(storage, handle)])
    for b in (first, restored):
        assert effective_options(b) == {"filter_policy": "bloomfilter", "no_block_cache": "false"}
        assert int(b._db.property_value("rocksdb.block-cache-capacity")) == \
            DiskStateOptions(memory_mb=96).block_cache_bytes
    assert contents(restored) == oracle(rows(2000, 300, seed=5))
