"""Heap vs disk keyed state: a keyed running sum over many keys, rows/s and peak RSS.

The job, at parallelism 2, checkpointed every second::

    sequence -> key_by("key") -> sum -> count

* ``sequence``: ``from_sequence`` rows ``{"key", "value", "i"}`` in 4 splits; the key
  of row ``i`` is ``i * MULTIPLIER mod keys`` (a bijection on the first ``keys``
  rows), so every key gets state and every later row updates an existing key.
* ``sum``: the running sum of ``value`` per key, either
  ``key_by("key").reduce(...)`` (``--op reduce``, the default: on the disk backend
  one multi-get and one write batch per batch) or a
  :class:`raystream.KeyedProcessFunction` with ``ctx.value_state`` (``--op process``:
  one read and one write per row).
* ``count``: a sink that counts rows (the job's output is not kept).

The same job runs twice in one Ray session, with
``CheckpointConfig(state_backend="heap")`` and ``state_backend="disk"``; the rate is
``rows / JobResult.run_s`` (start-up apart). Peak RSS is the largest sum, over the
``sum`` subtasks' processes, of their resident set size, sampled every 0.1 s
with psutil while the job runs (the disk backend's RocksDB block cache and
write buffers count; its files do not). Each run checks that the sink saw every
row and that at least one checkpoint completed.

Run from the repo root (the default size takes about a minute; the issue's
50,000,000-key figure is a much longer run)::

    ./dev bench bench/large_state.py                         # 200,000 keys, 1,000,000 rows
    ./dev bench bench/large_state.py --keys 2000000 --rows 6000000 --op process

The last line is machine-readable: the disk run's rate over the heap run's, and
both peak RSS figures in MB::

    RESULT disk_over_heap=<ratio> heap_rss_mb=<MB> disk_rss_mb=<MB>

With ``--incremental`` the disk run takes incremental checkpoints
(``DiskStateOptions(incremental=True)``, every checkpoint retained), and the
bench prints each checkpoint's bytes written and duration and appends
``incremental_bytes_over_changed=<ratio>`` to the RESULT line: the bytes the
checkpoints after the first wrote, over the bytes of the entries that changed
between each of them and the previous completed one. Those are counted
exactly after the run: both checkpoints' databases are downloaded and scanned
side by side in key order, and every entry that is new or holds another value
counts its key and value bytes (as RocksDB stores them, uncompressed)::

    ./dev bench bench/large_state.py --incremental --keys 1000000 --rows 3000000
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil
import pyarrow as pa
import ray

import raystream as rs
from raystream.core.ray_start import ensure_ray
from raystream.actors.operator import SinkOperator

RAY_INIT_KWARGS = {"num_cpus": 2, "include_dashboard": False}
PARALLELISM = 2
NUM_SPLITS = 4
INTERVAL_S = 1.0
MULTIPLIER = 2654435761  # coprime to the key count: a bijection mod keys
SAMPLE_S = 0.1


class Rows:
    def __init__(self, keys: int) -> None:
        if math.gcd(MULTIPLIER, keys) != 1:
            raise ValueError(f"{keys} keys: must be coprime to {MULTIPLIER}")
        self.keys = keys

    def __call__(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {"key": index * MULTIPLIER % self.keys, "value": index % 7 + 1, "i": index}


def add(acc: dict, row: dict) -> dict:
    return {"key": row["key"], "value": acc["value"] + row["value"], "i": row["i"]}


class RunningSum(rs.KeyedProcessFunction):
    def open(self, ctx: rs.KeyedContext) -> None:
        self.total = ctx.value_state("sum", default=0)

    def process_element(self, row: dict, ctx: rs.KeyedContext):
        total = self.total.value() + row["value"]
        self.total.update(total)
        return ({"key": row["key"], "value": total, "i": row["i"]},)


class Count(SinkOperator):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.rows = 0

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.rows += batch.num_rows

    def final_result(self) -> int:
        return self.rows


class RssSampler:
    """Peak over time of the summed RSS of the ``sum`` subtasks' processes."""

    def __init__(self, client: rs.JobClient) -> None:
        self.client = client
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pids(self) -> list[int]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                return [int(ray.get(self.client.subtask_actor("sum", k).metrics.remote())["pid"])
                        for k in range(PARALLELISM)]
            except Exception:  # not deployed yet
                time.sleep(0.05)
        return []

    def _run(self) -> None:
        processes = [psutil.Process(pid) for pid in self._pids()]
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, sum(p.memory_info().rss for p in processes))
            except psutil.Error:
                return
            self._stop.wait(SAMPLE_S)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@dataclass(frozen=True)
class Increment:
    """A checkpoint after the first: bytes it wrote, its duration, and the bytes of the
    entries that changed since the previous completed checkpoint."""

    checkpoint_id: int
    size: int
    duration_s: float
    changed_bytes: int


@dataclass(frozen=True)
class Run:
    backend: str
    rows: int
    run_s: float
    peak_rss: int
    checkpoints: int
    increments: tuple[Increment, ...] = ()
    state_bytes: int = 0  # SST bytes of the newest checkpoint

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.run_s


class CheckpointEntries:
    """The keyed-state entries of an incremental checkpoint, in key order (its subtasks'
    databases downloaded to a temporary directory, scanned one after another)."""

    def __init__(self, storage: str, job: str, checkpoint_id: int, scratch: str) -> None:
        from raystream.checkpoint.disk_incremental import RestoredDb
        from raystream.checkpoint.metadata import CheckpointMetadata
        from raystream.checkpoint.storage import CheckpointStorage

        store = CheckpointStorage(storage)
        metadata = CheckpointMetadata.from_json(store.read_metadata(job, checkpoint_id))
        handles = [db for files in metadata.operators.values() for db in files.keyed_db]
        self.dbs = sorted((RestoredDb.read(store, h) for h in handles),
                          key=lambda d: d.manifest.key_groups.start)
        self.sst_bytes = sum(h.size for d in self.dbs for name, h in d.manifest.files.items()
                             if name.endswith(".sst"))
        self.scratch = os.path.join(scratch, f"chk-{checkpoint_id}")

    def __iter__(self):
        import rocksdict

        for i, db in enumerate(self.dbs):
            path = os.path.join(self.scratch, str(i))
            db.download(path)
            rdict = rocksdict.Rdict(path, rocksdict.Options(raw_mode=True))
            try:
                yield from rdict.items()
            finally:
                rdict.close()
                shutil.rmtree(path, ignore_errors=True)


def changed_bytes(before: CheckpointEntries, after: CheckpointEntries) -> int:
    """Key and value bytes of the entries of ``after`` that ``before`` lacks or holds
    with another value (a merge of the two key-ordered scans)."""
    old = iter(before)
    current = next(old, None)
    changed = 0
    for k, v in after:
        while current is not None and current[0] < k:
            current = next(old, None)
        if current is None or current[0] != k or current[1] != v:
            changed += len(k) + len(v)
    return changed


def increments(storage: str, checkpoints: list) -> tuple[tuple[Increment, ...], int]:
    """Every completed checkpoint after the first, and the newest one's SST bytes."""
    (job,) = [d for d in os.listdir(storage) if os.path.isdir(os.path.join(storage, d))]
    done = sorted((c for c in checkpoints if c.status == "COMPLETED"),
                  key=lambda c: c.checkpoint_id)
    scratch = tempfile.mkdtemp(prefix="entries-")
    try:
        entries = [CheckpointEntries(storage, job, c.checkpoint_id, scratch) for c in done]
        out = tuple(Increment(c.checkpoint_id, c.size, c.duration_s,
                              changed_bytes(entries[i - 1], entries[i]))
                    for i, c in enumerate(done) if i > 0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out, entries[-1].sst_bytes


def run(backend: str, op: str, keys: int, rows: int, batch_size: int, memory_mb: int,
        storage_root: str, incremental: bool = False) -> Run:
    storage = tempfile.mkdtemp(prefix="checkpoints-", dir=storage_root)
    state = (rs.DiskStateOptions(memory_mb=memory_mb, incremental=incremental)
             if backend == "disk" else "heap")
    steps: tuple[Increment, ...] = ()
    state_bytes = 0
    try:
        env = rs.StreamEnvironment(
            parallelism=PARALLELISM, ray_init_kwargs=RAY_INIT_KWARGS,
            checkpoints=rs.CheckpointConfig(interval_s=INTERVAL_S, storage=storage,
                                            state_backend=state,
                                            # incremental: every checkpoint, to compare them
                                            retained=1000 if incremental else 3),
            restart=rs.RestartStrategy.none())
        keyed = env.from_sequence(rows, columns=Rows(keys), batch_size=batch_size,
                                  num_splits=NUM_SPLITS, name="sequence").key_by("key")
        summed = keyed.reduce(add, name="sum") if op == "reduce" else keyed.process(
            RunningSum(), name="sum")
        sink = summed.sink_to(Count, name="count")
        client = env.execute_async(f"large-state-{backend}")
        sampler = RssSampler(client)
        result = client.wait(timeout_s=600)
        peak = sampler.stop()
        if incremental:
            steps, state_bytes = increments(storage, result.checkpoints)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    seen = result.count(sink)
    if seen != rows:
        raise SystemExit(f"{backend} run: the sink saw {seen:,} rows, expected {rows:,}")
    completed = sum(c.status == "COMPLETED" for c in result.checkpoints)
    if completed < 1:
        raise SystemExit(f"{backend} run: no checkpoint completed")
    return Run(backend, rows, result.run_s, peak, completed, steps, state_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--op", choices=("reduce", "process"), default="reduce")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--memory-mb", type=int, default=64,
                        help="disk backend memory budget per subtask")
    parser.add_argument("--storage", default=tempfile.gettempdir())
    parser.add_argument("--incremental", action="store_true",
                        help="the disk run takes incremental checkpoints")
    args = parser.parse_args()
    if args.rows < args.keys:
        parser.error("--rows must be at least --keys (every key gets state)")
    ensure_ray(**RAY_INIT_KWARGS)
    runs = []
    for backend in ("heap", "disk"):
        r = run(backend, args.op, args.keys, args.rows, args.batch_size, args.memory_mb,
                args.storage, incremental=args.incremental and backend == "disk")
        print(f"  {backend}: {r.rows:,} rows in {r.run_s:.1f} s ({r.rows_per_s:,.0f} rows/s), "
              f"peak RSS of the sum subtasks {r.peak_rss / 2**20:,.0f} MB, "
              f"{r.checkpoints} checkpoints", file=sys.stderr, flush=True)
        runs.append(r)
    ray.shutdown()
    heap, disk = runs
    print(f"keys={args.keys:,} rows={args.rows:,} op={args.op} "
          f"disk memory budget={args.memory_mb} MB/subtask")
    for r in runs:
        print(f"{r.backend:5} {r.rows_per_s:>12,.0f} rows/s  peak RSS {r.peak_rss / 2**20:>8,.0f} MB")
    result = (f"RESULT disk_over_heap={disk.rows_per_s / heap.rows_per_s:.4f} "
              f"heap_rss_mb={heap.peak_rss / 2**20:.0f} disk_rss_mb={disk.peak_rss / 2**20:.0f}")
    if args.incremental:
        for inc in disk.increments:
            print(f"checkpoint {inc.checkpoint_id:>4}: {inc.size / 2**20:>8.2f} MB written in "
                  f"{inc.duration_s:.2f} s; {inc.changed_bytes / 2**20:>8.2f} MB of entries "
                  f"changed since the previous one")
        print(f"state: {disk.state_bytes / 2**20:.1f} MB of SST files in the last checkpoint")
        written = sum(inc.size for inc in disk.increments)
        changed = sum(inc.changed_bytes for inc in disk.increments)
        if changed:
            result += f" incremental_bytes_over_changed={written / changed:.3f}"
    print(result)


if __name__ == "__main__":
    main()
