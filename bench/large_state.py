"""Keyed state larger than memory (issue 18's benchmark): a keyed running sum over
many keys on the disk backend with incremental checkpoints and a memory budget,
the heap backend on 1,000,000 keys as the reference, and a restore after a SIGKILL.

The job, at parallelism 2, checkpointed every 5 s::

    sequence -> key_by("key") -> sum -> count

* ``sequence``: ``from_sequence`` rows ``{"key", "value", "i"}`` in 4 splits, read side
  by side; the keys run through a bijection over the rows in the order they arrive
  (:class:`Rows`), so the first ``keys`` rows give every key state, every later row
  updates a key set long before, and no two rows of an interval share a key.
* ``sum``: the running sum of ``value`` per key, either
  ``key_by("key").reduce(...)`` (``--op reduce``, the default: on the disk backend
  one multi-get and one write batch per batch) or a
  :class:`raystream.KeyedProcessFunction` with ``ctx.value_state`` (``--op process``:
  one read and one write per row), or (``--op window``) a tumbling event-time
  window's ``sum("value")`` on ``i`` as event time, without pre-aggregation, its
  window longer than the input: every key holds an open window and its timer
  until the input ends, when each key emits one row.
* ``count``: a sink that counts rows, its count in operator state (so it is exactly
  once across the failover); each run checks it equals the rows (the keys, for
  ``--op window``).

Two runs in one Ray session:

* **heap**: ``CheckpointConfig(state_backend="heap")`` on ``--heap-keys`` keys
  (1,000,000) and ``--heap-rows`` rows, no failure: the reference.
* **disk**: ``state_backend=DiskStateOptions(memory_mb=--memory-mb, incremental=True)``
  (2048 MB per subtask) on ``--keys`` keys and ``--rows`` rows. Once
  ``--kill-after`` checkpoints (2) completed and the ``sum`` subtasks have taken in
  ``--kill-at`` of the rows (0.7: every key has state by then when rows >= 2 x keys),
  the bench kills the process of ``sum`` subtask 0 with ``os.kill(pid, SIGKILL)``;
  the job restarts from its newest completed checkpoint
  (``RestartStrategy.fixed_delay(1, 0)``) and runs to the end.

A thread polls the job's public figures every 0.25 s (``JobClient.metrics()``:
each subtask's ``pid``, ``attempt`` and ``records_in``; ``JobClient.progress()``:
status and completed checkpoints). The figures:

* **rows/s**: rows the ``sum`` subtasks took in between the first poll that saw
  any and the last poll before the kill (the disk run) or the poll that saw the
  last row (the heap run), over the time between those polls: failover and
  replay are not in it. The same rows over the CPU seconds the ``sum``
  processes used meanwhile (psutil: all their threads) are printed too: on a
  loaded machine that figure moves much less than rows/s.
* **peak RSS per subtask**: the largest resident set size, sampled with psutil,
  of the process of each ``sum`` subtask (the disk backend's block cache,
  write buffers and index blocks count; its files do not), over both attempts.
  The target is ``memory_mb`` + 1 GiB of process overhead.
* **RocksDB peaks** (disk): the most the ``sum`` subtasks' RocksDB figures reached
  over the polls (their ``rocksdb.*`` metrics): level-0 files, pending compaction
  bytes, running compactions, memtable bytes; how far compaction fell behind.
* **per checkpoint**: bytes written (``CheckpointStats.size``: for the disk
  backend the SST files it uploaded plus its small private files) and
  duration (trigger to completion).
* **state size**: the SST bytes the newest completed checkpoint references.
* **restore_s**: seconds from the SIGKILL until the job is RUNNING again and
  every ``sum`` subtask of the new attempt has taken in a row. A subtask
  initializes its state from the checkpoint before its first row, so this
  includes failure detection, verifying the checkpoint's files, deploying
  (a new process for the killed subtask), downloading and opening the
  databases, and the first replayed batch; it is accurate to the 0.25 s poll.
  The job master's own record (``JobResult.restores``' ``restore_s``, also
  printed) only covers verifying and redeploying: subtasks restore their state
  on their own threads after that.
* **incremental_bytes_over_changed**: bytes the checkpoints wrote over the bytes
  of the entries that changed in their intervals, for every checkpoint but the
  first (which writes the whole state) and the newest two (those straddle the end
  of the input). The changed bytes are counted exactly for ``--compare`` (3) pairs
  of consecutive completed checkpoints, the last ones but for the newest two (the
  disk run retains ``--compare + 3``): both checkpoints' databases are downloaded
  and scanned side by side in key order, and every entry that is new or holds
  another value counts its key and value bytes (as RocksDB stores them,
  uncompressed). This scan is a Python loop per entry: at 50,000,000 keys it
  takes minutes per pair. Every row of an interval changes another key
  (:class:`Rows`), so the pairs give the changed bytes per row, and each interval's changed bytes are its rows (those the
  ``sum`` subtasks took in between the two checkpoints' triggers, replayed ones
  included, from the polls) times that. The rate varies over a run (new keys
  early, updates of keys on disk later, the replay after the kill), so the
  compared intervals alone do not stand for the others; and the mean over all
  checkpoints counts the compactions, which upload in bursts (a compaction
  rewrites files that later checkpoints upload again). The compared pairs' own
  ratio, and their rate, are printed too.

Run from the repo root (the default size takes a few minutes; the issue's figure,
50,000,000 keys and 100,000,000 rows, is a much longer run)::

    ./dev bench bench/large_state.py              # disk: 2,000,000 keys, 6,000,000 rows
    ./dev bench bench/large_state.py --keys 50000000 --rows 100000000

The last line is machine-readable (targets: over_heap_1m >= 0.5,
incremental_bytes_over_changed <= 3, restore_s <= 30)::

    RESULT large_state_rows_per_s=<n> over_heap_1m=<ratio> incremental_bytes_over_changed=<ratio> restore_s=<s>
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import shutil
import signal
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
from raystream.actors.operator import OperatorSnapshot, RestoredState, SinkOperator

RAY_INIT_KWARGS = {"num_cpus": 2, "include_dashboard": False}
PARALLELISM = 2
NUM_SPLITS = 4
INTERVAL_S = 5.0
MULTIPLIER = 2654435761  # coprime to the key count: a bijection mod keys
POLL_S = 0.25
TAIL = 2  # the newest checkpoints straddle the end of the input: not compared
WINDOW_MS = 1 << 40  # --op window: longer than any input, so windows fire at its end


class Rows:
    """Row ``i``'s columns. The sequence source reads its ``NUM_SPLITS`` contiguous
    splits side by side, so the rows taken in at one time are the splits' rows at about
    the same offset: row ``i`` is the ``j``-th of the run, ``j = offset * NUM_SPLITS +
    split``, and its key is ``j * MULTIPLIER mod keys``, a bijection on any ``keys``
    consecutive ``j``. So the first ``keys`` rows by ``j`` (the first half of every split
    when rows are twice the keys) give every key its state, each later row updates a
    key set long before, and the rows of one checkpoint interval change as many keys.
    (By ``i`` alone, rows ``i`` and ``i + keys``, one split length apart when rows are
    twice the keys, would arrive together with the same key.)"""

    def __init__(self, keys: int, rows: int) -> None:
        if math.gcd(MULTIPLIER, keys) != 1:
            raise ValueError(f"{keys} keys: must be coprime to {MULTIPLIER}")
        if rows % NUM_SPLITS:
            raise ValueError(f"{rows} rows: must be a multiple of {NUM_SPLITS} (the splits)")
        self.keys, self.split_rows = keys, rows // NUM_SPLITS

    def __call__(self, index: np.ndarray) -> dict[str, np.ndarray]:
        split, offset = np.divmod(index, self.split_rows)
        j = offset * NUM_SPLITS + split
        return {"key": j * MULTIPLIER % self.keys, "value": index % 7 + 1, "i": index}


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
    """Counts rows; the count is operator state, so a restored job counts on from the
    checkpoint's (every subtask gets every subtask's state back and keeps its own)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.rows = 0

    def initialize_state(self, restored: RestoredState | None) -> None:
        if restored is not None:
            for data in restored.operator_states:
                index, rows = pickle.loads(data)
                if index == self.ctx.subtask_index:
                    self.rows = rows

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        data = pickle.dumps((self.ctx.subtask_index, self.rows))
        return OperatorSnapshot(operator_state=lambda: data)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.rows += batch.num_rows

    def final_result(self) -> int:
        return self.rows


@dataclass(frozen=True)
class KillPlan:
    after_checkpoints: int  # completed checkpoints before the kill
    at_fraction: float  # of the rows the sum subtasks have taken in


@dataclass(frozen=True)
class Kill:
    pid: int
    checkpoint_id: int  # the newest completed one when it was killed
    rows_in: int  # the sum subtasks had taken in


class Monitor:
    """Polls the job's metrics and progress: the ``sum`` subtasks' peak RSS and input
    rate, and (with a :class:`KillPlan`) kills subtask 0's process once and times the
    restore."""

    def __init__(self, client: rs.JobClient, rows: int, kill: KillPlan | None) -> None:
        assert client.plan is not None
        self.client, self.rows, self.plan = client, rows, kill
        self.chain = client.plan.vertex_of("sum").name
        self.peak_rss: dict[int, int] = {}
        # the most each RocksDB figure of a sum subtask reached (disk runs; see NATIVE_PEAKS)
        self.rocksdb_peaks: dict[str, float] = {}
        # (time, rows in, CPU seconds of the sum processes) at the first input seen, and at
        # the last increase before a kill
        self.first: tuple[float, int, float] | None = None
        self.last: tuple[float, int, float] | None = None
        self.kill: Kill | None = None
        self.killed_at = 0.0
        # (wall time in ms, rows the sum subtasks processed so far, a replay's too): the
        # rows between two checkpoints' triggers
        self.processed: list[tuple[float, int]] = []
        self._counted: dict[tuple[int, int], int] = {}  # records_in by (subtask, attempt)
        self.restore_s: float | None = None
        self.error: BaseException | None = None
        self._processes: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _subtasks(self) -> dict[int, dict[str, float]]:
        metrics = self.client.metrics()  # {} while the job deploys or restarts
        return {int(index): m for key, m in metrics.items()
                for chain, _, index in [key.rpartition("/")] if chain == self.chain}

    def _sample(self, index: int, pid: int) -> float:
        """Record the process's RSS; its CPU seconds so far (0 once it is gone)."""
        process = self._processes.get(pid)
        if process is None:
            process = self._processes[pid] = psutil.Process(pid)
        try:
            with process.oneshot():
                rss, cpu = process.memory_info().rss, process.cpu_times()
        except psutil.Error:  # killed meanwhile
            return 0.0
        self.peak_rss[index] = max(self.peak_rss.get(index, 0), rss)
        return cpu.user + cpu.system

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._poll()
                self._stop.wait(POLL_S)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _poll(self) -> None:
        now = time.monotonic()
        subtasks = self._subtasks()
        cpu = sum(self._sample(index, int(m["pid"])) for index, m in subtasks.items())
        if len(subtasks) < PARALLELISM:
            return
        rows_in = int(sum(m["records_in"] for m in subtasks.values()))
        for index, m in subtasks.items():
            self._counted[(index, int(m["attempt"]))] = int(m["records_in"])
            for name in NATIVE_PEAKS:
                value = m.get(f"sum.rocksdb.{name}")
                if value is not None:
                    self.rocksdb_peaks[name] = max(self.rocksdb_peaks.get(name, 0.0), value)
        self.processed.append((time.time() * 1000, sum(self._counted.values())))
        attempts = {int(m["attempt"]) for m in subtasks.values()}
        if self.kill is None and attempts == {0}:
            if self.first is None and rows_in:
                self.first = (now, rows_in, cpu)
            if self.last is None or rows_in > self.last[1]:
                self.last = (now, rows_in, cpu)
            if self.plan is not None and rows_in >= self.plan.at_fraction * self.rows:
                completed = [c.checkpoint_id for c in self.client.progress()["checkpoints"]
                             if c.status == "COMPLETED"]
                if len(completed) >= self.plan.after_checkpoints:
                    pid = int(subtasks[0]["pid"])
                    self.killed_at = time.monotonic()
                    os.kill(pid, signal.SIGKILL)
                    self.kill = Kill(pid, max(completed), rows_in)
        elif (self.kill is not None and self.restore_s is None and 0 not in attempts
              and all(m["records_in"] > 0 for m in subtasks.values())):
            self.restore_s = now - self.killed_at

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    @property
    def rows_per_s(self) -> float:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return math.nan
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

    def rows_between(self, start_ms: float, end_ms: float) -> float:
        """Rows the sum subtasks processed between two wall-clock times (ms),
        interpolated between polls."""
        if not self.processed:
            return math.nan
        at, rows = zip(*self.processed)
        return float(np.interp(end_ms, at, rows) - np.interp(start_ms, at, rows))

    @property
    def rows_per_cpu_s(self) -> float:
        """The same rows over the CPU seconds the sum processes used meanwhile (all their
        threads: RocksDB's flushes and compactions, checkpoint uploads): a figure other
        load on the machine does not change much."""
        if self.first is None or self.last is None or self.last[2] <= self.first[2]:
            return math.nan
        return (self.last[1] - self.first[1]) / (self.last[2] - self.first[2])


@dataclass(frozen=True)
class Increment:
    """A completed checkpoint after another: bytes it wrote, and the bytes of the entries
    that changed since that other one."""

    checkpoint_id: int
    size: int
    changed_bytes: int


# RocksDB figures (the sum operator's metrics) whose peaks a disk run prints: how far
# compaction fell behind the writes
NATIVE_PEAKS = ("num-files-at-level0", "estimate-pending-compaction-bytes",
                "num-running-compactions", "cur-size-all-mem-tables")


@dataclass(frozen=True)
class Run:
    backend: str
    keys: int
    rows: int
    rows_per_s: float
    rows_per_cpu_s: float
    peak_rss: dict[int, int]  # by sum subtask
    checkpoints: tuple  # the completed CheckpointStats
    # rows the sum subtasks processed between each completed checkpoint's trigger and the
    # previous one's (NaN for the first)
    interval_rows: tuple[float, ...]
    increments: tuple[Increment, ...] = ()
    state_bytes: int = 0  # SST bytes of the newest checkpoint
    kill: Kill | None = None
    restore_s: float | None = None
    restores: tuple = ()  # the job master's restore records
    rocksdb_peaks: tuple[tuple[str, float], ...] = ()  # (figure, its peak) of NATIVE_PEAKS


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
        self.sst_bytes = sum(h.size for d in self.dbs for h in d.shared_files().values())
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


def increments(storage: str, compared: list, newest: int) -> tuple[tuple[Increment, ...], int]:
    """Each of the ``compared`` completed checkpoints (oldest first) after the first
    against the one before it, and the SST bytes of checkpoint ``newest``."""
    (job,) = [d for d in os.listdir(storage) if os.path.isdir(os.path.join(storage, d))]
    scratch = tempfile.mkdtemp(prefix="entries-", dir=storage)
    try:
        entries = [CheckpointEntries(storage, job, c.checkpoint_id, scratch) for c in compared]
        out = tuple(Increment(c.checkpoint_id, c.size, changed_bytes(entries[i - 1], entries[i]))
                    for i, c in enumerate(compared) if i > 0)
        state_bytes = CheckpointEntries(storage, job, newest, scratch).sst_bytes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out, state_bytes


def run(backend: str, op: str, keys: int, rows: int, batch_size: int, memory_mb: int,
        storage_root: str, compare: int = 0, kill: KillPlan | None = None,
        timeout_s: float | None = None) -> Run:
    storage = tempfile.mkdtemp(prefix="checkpoints-", dir=storage_root)
    state = (rs.DiskStateOptions(memory_mb=memory_mb, incremental=True)
             if backend == "disk" else "heap")
    try:
        env = rs.StreamEnvironment(
            parallelism=PARALLELISM, ray_init_kwargs=RAY_INIT_KWARGS,
            checkpoints=rs.CheckpointConfig(interval_s=INTERVAL_S, storage=storage,
                                            state_backend=state,
                                            # the compared ones stay on disk after the run
                                            retained=compare + 1 + TAIL if compare else 1),
            restart=(rs.RestartStrategy.fixed_delay(1, 0.0) if kill is not None
                     else rs.RestartStrategy.none()))
        keyed = env.from_sequence(rows, columns=Rows(keys, rows), batch_size=batch_size,
                                  num_splits=NUM_SPLITS, name="sequence").key_by("key")
        if op == "reduce":
            summed = keyed.reduce(add, name="sum")
        elif op == "process":
            summed = keyed.process(RunningSum(), name="sum")
        else:
            summed = keyed.window(rs.TumblingEventTimeWindows(size_ms=WINDOW_MS), timestamp="i",
                                  pre_aggregate=False).sum("value", name="sum")
        sink = summed.sink_to(Count, name="count")
        client = env.execute_async(f"large-state-{backend}")
        monitor = Monitor(client, rows, kill)
        try:
            result = client.wait(timeout_s=timeout_s)
        finally:
            monitor.stop()
        done = sorted((c for c in result.checkpoints if c.status == "COMPLETED"),
                      key=lambda c: c.checkpoint_id)
        print(f"{backend} run ended: {monitor.rows_per_s:,.0f} rows/s, restore_s "
              f"{monitor.restore_s}, {len(done)} checkpoints; comparing {compare} pairs",
              file=sys.stderr, flush=True)
        interval_rows = (math.nan, *(monitor.rows_between(a.trigger_ts_ms, b.trigger_ts_ms)
                                     for a, b in zip(done, done[1:])))
        steps, state_bytes = (increments(storage, done[-compare - 1 - TAIL:-TAIL],
                                         done[-1].checkpoint_id) if compare else ((), 0))
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    seen, expected = result.count(sink), keys if op == "window" else rows
    if seen != expected:
        raise SystemExit(f"{backend} run: the sink counted {seen:,} rows, expected {expected:,}")
    if not done:
        raise SystemExit(f"{backend} run: no checkpoint completed")
    if kill is not None and (monitor.kill is None or monitor.restore_s is None):
        raise SystemExit(f"{backend} run: the job ended before a subtask was killed and "
                         f"restored (fewer than {kill.after_checkpoints} checkpoints by "
                         f"{kill.at_fraction:.0%} of the rows?): give it more --rows")
    return Run(backend, keys, rows, monitor.rows_per_s, monitor.rows_per_cpu_s,
               dict(monitor.peak_rss), tuple(done), interval_rows, steps, state_bytes, monitor.kill,
               monitor.restore_s, tuple(result.restores), tuple(monitor.rocksdb_peaks.items()))


def mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def report(r: Run) -> None:
    rss = ", ".join(f"sum[{i}] {mb(r.peak_rss[i])}" for i in sorted(r.peak_rss))
    print(f"{r.backend}: {r.keys:,} keys, {r.rows:,} rows: {r.rows_per_s:,.0f} rows/s "
          f"({r.rows_per_cpu_s:,.0f} per CPU second of the sum processes); "
          f"peak RSS {rss}; {len(r.checkpoints)} checkpoints completed")
    if r.rocksdb_peaks:
        print("  RocksDB peaks over the sum subtasks (polled): " + ", ".join(
            f"{name} {value:,.0f}" for name, value in r.rocksdb_peaks))
    changed = {inc.checkpoint_id: inc.changed_bytes for inc in r.increments}
    for c, n in zip(r.checkpoints, r.interval_rows):
        line = f"  checkpoint {c.checkpoint_id:>4}: {mb(c.size):>12} written in {c.duration_s:6.2f} s"
        if not math.isnan(n):
            line += f"; {n:>12,.0f} rows since the previous one"
        if c.checkpoint_id in changed:
            line += f"; {mb(changed[c.checkpoint_id])} of entries changed since the previous one"
        print(line)
    if r.state_bytes:
        print(f"  state: {mb(r.state_bytes)} of SST files in checkpoint "
              f"{r.checkpoints[-1].checkpoint_id} (the newest)")
    if r.kill is not None:
        print(f"  SIGKILL to sum[0] (pid {r.kill.pid}) after checkpoint {r.kill.checkpoint_id} "
              f"completed and {r.kill.rows_in:,} rows in; RUNNING again with every sum "
              f"subtask restored and taking rows after {r.restore_s:.2f} s")
        for rec in r.restores:
            print(f"  job master's restore record: checkpoint {rec['checkpoint_id']}, "
                  f"restore_s {rec['restore_s']:.2f} (verify the checkpoint, redeploy)")


def incremental_ratio(disk: Run) -> float:
    """Bytes the checkpoints wrote over the bytes of the entries that changed in their
    intervals, for every checkpoint but the first and the newest :data:`TAIL`.

    The compared pairs give the changed bytes per processed row exactly; the rows of
    every interval scale it to that interval. That holds because every row of an
    interval changes another key (:class:`Rows`), so an interval's changed bytes are
    its rows times the bytes of one entry. The rate varies a lot over a run
    (new keys early, updates of keys on disk later, the replay after the kill), so
    the compared intervals' changed bytes alone do not stand for the others'."""
    if not disk.increments:
        return math.nan
    rows_of = {c.checkpoint_id: n for c, n in zip(disk.checkpoints, disk.interval_rows)}
    written = sum(inc.size for inc in disk.increments)
    changed = sum(inc.changed_bytes for inc in disk.increments)
    compared_rows = sum(rows_of[inc.checkpoint_id] for inc in disk.increments)
    per_row = changed / compared_rows
    later = list(zip(disk.checkpoints, disk.interval_rows))[1:-TAIL]
    later_written = sum(c.size for c, _ in later)
    later_rows = sum(n for _, n in later)
    ratio = later_written / (later_rows * per_row)
    index = {c.checkpoint_id: i for i, c in enumerate(disk.checkpoints)}
    seconds = sum(disk.checkpoints[index[inc.checkpoint_id]].trigger_ts_ms
                  - disk.checkpoints[index[inc.checkpoint_id] - 1].trigger_ts_ms
                  for inc in disk.increments) / 1000
    print(f"the compared pairs: {mb(changed)} of entries changed over {compared_rows:,.0f} "
          f"rows ({per_row:.1f} bytes a row, {compared_rows / seconds:,.0f} rows/s), "
          f"{mb(written)} written: {written / changed:.3f}")
    print(f"checkpoints {later[0][0].checkpoint_id}..{later[-1][0].checkpoint_id}: "
          f"{mb(later_written)} written over {later_rows:,.0f} rows, about "
          f"{mb(later_rows * per_row)} of entries changed: {ratio:.3f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2_000_000, help="disk run's keys")
    parser.add_argument("--rows", type=int, default=6_000_000, help="disk run's rows")
    parser.add_argument("--heap-keys", type=int, default=1_000_000)
    parser.add_argument("--heap-rows", type=int, default=4_000_000)
    parser.add_argument("--op", choices=("reduce", "process", "window"), default="reduce")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--memory-mb", type=int, default=2048,
                        help="disk backend memory budget per subtask")
    parser.add_argument("--storage", default=tempfile.gettempdir(),
                        help="where the checkpoints go (removed after each run)")
    parser.add_argument("--compare", type=int, default=3,
                        help="pairs of consecutive checkpoints whose changed entries count")
    parser.add_argument("--kill-after", type=int, default=2,
                        help="completed checkpoints before the SIGKILL")
    parser.add_argument("--kill-at", type=float, default=0.7,
                        help="fraction of the rows the sum subtasks took in before the SIGKILL")
    parser.add_argument("--timeout-s", type=float, default=6 * 3600)
    args = parser.parse_args()
    if args.rows < args.keys or args.heap_rows < args.heap_keys:
        parser.error("rows must be at least keys (every key gets state)")
    if args.rows % NUM_SPLITS or args.heap_rows % NUM_SPLITS:
        parser.error(f"rows must be a multiple of {NUM_SPLITS} (the source's splits)")
    ensure_ray(**RAY_INIT_KWARGS)
    started = time.monotonic()
    heap = run("heap", args.op, args.heap_keys, args.heap_rows, args.batch_size,
               args.memory_mb, args.storage, timeout_s=args.timeout_s)
    report(heap)
    sys.stdout.flush()
    disk = run("disk", args.op, args.keys, args.rows, args.batch_size, args.memory_mb,
               args.storage, compare=args.compare,
               kill=KillPlan(args.kill_after, args.kill_at), timeout_s=args.timeout_s)
    report(disk)
    ray.shutdown()
    budget = (args.memory_mb << 20) + (1 << 30)
    peak = max(disk.peak_rss.values())
    ratio = incremental_ratio(disk)
    print(f"op={args.op} p={PARALLELISM} checkpoint every {INTERVAL_S:g} s; disk budget "
          f"{args.memory_mb} MB/subtask; bench wall time {time.monotonic() - started:,.0f} s")
    print(f"disk over heap per CPU second: {disk.rows_per_cpu_s / heap.rows_per_cpu_s:.4f}")
    print(f"targets: peak RSS {mb(peak)} <= budget + 1 GiB {mb(budget)}: {peak <= budget}; "
          f"over_heap_1m >= 0.5: {disk.rows_per_s / heap.rows_per_s >= 0.5}; "
          f"incremental_bytes_over_changed <= 3: {ratio <= 3}; "
          f"restore_s <= 30: {(disk.restore_s or math.inf) <= 30}")
    print(f"RESULT large_state_rows_per_s={disk.rows_per_s:.0f} "
          f"over_heap_1m={disk.rows_per_s / heap.rows_per_s:.4f} "
          f"incremental_bytes_over_changed={ratio:.3f} restore_s={disk.restore_s:.2f}")


if __name__ == "__main__":
    main()
