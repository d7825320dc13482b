"""``prepare_snapshot_pre_barrier``: head to tail, before the barrier; what it emits precedes it.

The subtask side of a checkpoint (Flink ``SubtaskCheckpointCoordinatorImpl``,
FLINK-9428): for checkpoint ``n`` a subtask calls ``prepare_snapshot_pre_barrier(n)``
on every operator of its chain head to tail, *then* forwards barrier ``n``, then
snapshots. Records emitted in that call therefore land before barrier ``n``
downstream and belong to checkpoint ``n`` there.

The job: sequence source -> A -> B -> C (one chain, parallelism 2) -> key_by ->
D -> exactly-once collect sink (one chain, parallelism 2). A, B and C emit, in
``prepare_snapshot_pre_barrier(n)``, one marker row per D subtask (keys chosen
to route to each) carrying (operator, n, upstream subtask, per-process call
sequence number), alongside the data rows (same schema). D remembers the
markers it processes and, in its own ``prepare_snapshot_pre_barrier(n)`` (after
barrier ``n`` aligned, right before its snapshot), emits one observation row per
marker seen since its previous checkpoint, tagged ``at=n``. A also tags every
data row with the last checkpoint it passed, and D reports those counts the same
way: a row that follows barrier ``m`` upstream must not count before D's
snapshot of ``m`` (aligned checkpoints).

Two stressors make a violation show: upstream subtask 1 spends 0.1 s in A's
pre-barrier, so its barriers reach D well after subtask 0's (D must hold subtask
0's channel: alignment); and the first batch after a barrier is sent at once,
right behind it (barriers travel on the control lane, so data could overtake
one unless the receiver knows which barrier a message follows).

Independent oracle: every operator also appends each call to a per-process
log file, so the test knows which markers (and how many data rows per interval
between barriers) were emitted without asking D; the completed checkpoints come
from the coordinator's history; the routing of a marker comes from
``rs.key_group_of``.

End of input (FLIP-147): once its input ended an operator is finished. Like
Flink (an operator is skipped only once *closed*, and ``SinkWriterOperator``
emits nothing in ``prepareSnapshotPreBarrier`` after ``endInput``), the engine
still calls ``prepare_snapshot_pre_barrier`` for the checkpoints a finished
subtask takes -- including the final one -- but the operator emits nothing
then: no barrier follows and the downstream has ended its input.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time

import numpy as np
import pyarrow as pa
import pytest

import raystream as rs

N = 6_000
BATCH = 50
KEYS = 16
PARALLELISM = 2
MAX_PARALLELISM = 128
CHAIN = ("A", "B", "C")
SPLITS = PARALLELISM  # one split per source subtask: its watermark advances with every batch
SLEEP_PER_BATCH_S = 0.03  # 60 batches per source subtask: ~2 s, ~10 checkpoints at 0.2 s
SLOW_PRE_BARRIER_S = 0.1  # upstream subtask 1 forwards its barriers late: D must align

# One counter per worker process: the operators of one subtask (one actor, one
# process) share it, so it orders their calls. The test checks (pid, seq) is unique.
_SEQ = itertools.count()

ROWS = pa.schema([("kind", pa.string()), ("op", pa.string()), ("chk", pa.int64()),
                  ("sub", pa.int64()), ("seq", pa.int64()), ("pid", pa.int64()),
                  ("key", pa.int64()), ("i", pa.int64()), ("ts", pa.int64())])

OBSERVATIONS = pa.schema([("kind", pa.string()), ("d_sub", pa.int64()), ("at", pa.int64()),
                          ("op", pa.string()), ("chk", pa.int64()), ("sub", pa.int64()),
                          ("seq", pa.int64()), ("pid", pa.int64()), ("key", pa.int64()),
                          ("arrival", pa.int64()), ("rows", pa.int64())])


def d_subtask_of(key: int) -> int:
    return rs.subtask_for_key_group(rs.key_group_of(key, MAX_PARALLELISM), PARALLELISM,
                                    MAX_PARALLELISM)


def marker_keys() -> list[int]:
    """One key per D subtask (negative: apart from the data keys)."""
    found: dict[int, int] = {}
    for key in itertools.count(-1, -1):
        found.setdefault(d_subtask_of(key), key)
        if len(found) == PARALLELISM:
            return [found[d] for d in range(PARALLELISM)]
    raise AssertionError


def data_columns(i: np.ndarray) -> dict:
    n = len(i)
    return {"kind": pa.array(["data"] * n, pa.string()), "op": pa.array([""] * n, pa.string()),
            "chk": np.full(n, -1, np.int64), "sub": np.full(n, -1, np.int64),
            "seq": np.full(n, -1, np.int64), "pid": np.full(n, -1, np.int64),
            "key": i % KEYS, "i": i, "ts": i}


class CallLog:
    """Appends one JSON line per call to ``<dir>/<pid>.jsonl`` (flushed at once)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def write(self, **event) -> None:
        event["pid"] = os.getpid()
        with open(os.path.join(self.directory, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")


class Marking(rs.Operator):
    """A, B, C: forward every batch; emit one marker per D subtask before each barrier."""

    def __init__(self, name: str, log_dir: str, keys: list[int], *, tag_data: bool = False,
                 sleep_s: float = 0.0, slow_pre_barrier: dict[int, float] | None = None) -> None:
        super().__init__(name)
        self.log = CallLog(log_dir)
        self.keys = keys
        self.tag_data = tag_data
        self.sleep_s = sleep_s
        self.slow_pre_barrier = slow_pre_barrier or {}  # subtask -> seconds

    def open(self) -> None:
        self.finished = False
        self.after = 0  # the last checkpoint whose pre-barrier ran here (0: none yet)
        self.data_after: collections.Counter[int] = collections.Counter()
        self.barrier_just_passed = False

    def process_batch(self, batch, input_index=0):
        if self.finished:
            raise AssertionError(f"{self.name}: a batch after finish()")
        # Slow data, so that several checkpoints complete during the run -- except
        # for the first batch after a barrier: it leaves at once (its watermark
        # flushes it), right behind the barrier, so it may overtake a barrier
        # that travels on another lane.
        if self.sleep_s and not self.barrier_just_passed:
            time.sleep(self.sleep_s)
        self.barrier_just_passed = False
        if self.tag_data:  # data rows: (chk, sub) = (last checkpoint passed, this subtask)
            n = batch.num_rows
            batch = batch.set_column(ROWS.get_field_index("chk"), ROWS.field("chk"),
                                     pa.array([self.after] * n, pa.int64()))
            batch = batch.set_column(ROWS.get_field_index("sub"), ROWS.field("sub"),
                                     pa.array([self.ctx.subtask_index] * n, pa.int64()))
            self.data_after[self.after] += n
        self.output.emit(batch)

    def finish(self) -> None:
        self.finished = True
        self.log.write(event="finish", op=self.name, chk=-1, sub=self.ctx.subtask_index,
                       seq=next(_SEQ), data_after=dict(self.data_after))

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        seq = next(_SEQ)
        self.after = checkpoint_id
        self.barrier_just_passed = True
        emit = not self.finished  # after end of input nothing may be emitted (FLIP-147)
        sub = self.ctx.subtask_index
        if emit:
            time.sleep(self.slow_pre_barrier.get(sub, 0.0))
        self.log.write(event="pre", op=self.name, chk=checkpoint_id, sub=sub, seq=seq,
                       emitted=emit)
        if emit:
            k = len(self.keys)
            self.output.emit(pa.record_batch({
                "kind": ["marker"] * k, "op": [self.name] * k, "chk": [checkpoint_id] * k,
                "sub": [sub] * k, "seq": [seq] * k, "pid": [os.getpid()] * k,
                "key": self.keys, "i": [-1] * k, "ts": [-1] * k}, schema=ROWS))

    def snapshot_state(self, checkpoint_id: int):
        self.log.write(event="snap", op=self.name, chk=checkpoint_id,
                       sub=self.ctx.subtask_index, seq=next(_SEQ))
        return None


class Observer(rs.Operator):
    """D: records the markers it processes; reports them before its own snapshot."""

    def __init__(self, name: str, log_dir: str) -> None:
        super().__init__(name)
        self.log = CallLog(log_dir)

    def open(self) -> None:
        self.pending: list[dict] = []  # markers seen since the last report
        self.data: collections.Counter[tuple[int, int]] = collections.Counter()  # (sub, after)
        self.arrival = 0
        self.finished = False

    def process_batch(self, batch, input_index=0):
        for row in batch.to_pylist():
            if row["kind"] == "marker":
                self.pending.append(dict(row, arrival=self.arrival))
                self.arrival += 1
            else:
                self.data[(row["sub"], row["chk"])] += 1

    def _report(self, at: int) -> None:
        d = self.ctx.subtask_index
        rows = [{"kind": "seen", "d_sub": d, "at": at, "op": m["op"], "chk": m["chk"],
                 "sub": m["sub"], "seq": m["seq"], "pid": m["pid"], "key": m["key"],
                 "arrival": m["arrival"], "rows": 0} for m in self.pending]
        rows += [{"kind": "data", "d_sub": d, "at": at, "op": "", "chk": after, "sub": sub,
                  "seq": -1, "pid": -1, "key": -1, "arrival": -1, "rows": count}
                 for (sub, after), count in sorted(self.data.items())]
        if rows:
            self.output.emit(pa.RecordBatch.from_pylist(rows, schema=OBSERVATIONS))
        self.pending, self.data = [], collections.Counter()

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self.log.write(event="pre", op=self.name, chk=checkpoint_id, sub=self.ctx.subtask_index,
                       seq=next(_SEQ), emitted=not self.finished)
        if not self.finished:
            self._report(at=checkpoint_id)

    def snapshot_state(self, checkpoint_id: int):
        self.log.write(event="snap", op=self.name, chk=checkpoint_id, sub=self.ctx.subtask_index,
                       seq=next(_SEQ), pending=len(self.pending) + len(self.data))
        return None

    def finish(self) -> None:
        self._report(at=-1)  # seen after D's last checkpoint before its end of input
        self.finished = True
        self.log.write(event="finish", op=self.name, chk=-1, sub=self.ctx.subtask_index,
                       seq=next(_SEQ))


def read_calls(log_dir: str) -> list[dict]:
    events = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            events.extend(json.loads(line) for line in f)
    return events


@pytest.mark.slow
def test_pre_barrier_runs_head_to_tail_and_its_records_precede_the_barrier(ray_session, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    keys = marker_keys()
    assert sorted(d_subtask_of(k) for k in keys) == list(range(PARALLELISM))
    env = rs.StreamEnvironment(
        parallelism=PARALLELISM, max_parallelism=MAX_PARALLELISM,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "checkpoints")),
        restart=rs.RestartStrategy.none())
    logs = str(log_dir)
    stream = env.from_sequence(N, data_columns, batch_size=BATCH, num_splits=SPLITS,
                               name="numbers", watermarks=rs.BoundedOutOfOrderness("ts"))
    stream = stream.transform("A", lambda n: Marking(
        n, logs, keys, tag_data=True, sleep_s=SLEEP_PER_BATCH_S,
        slow_pre_barrier={1: SLOW_PRE_BARRIER_S}))
    stream = stream.transform("B", lambda n: Marking(n, logs, keys))
    stream = stream.transform("C", lambda n: Marking(n, logs, keys))
    observed = stream.key_by("key").transform("D", lambda n: Observer(n, logs))
    sink = observed.collect(name="out")

    plan = env.plan()
    upstream_vertex, d_vertex = plan.vertex_of("A"), plan.vertex_of("D")
    assert [node.name for node in upstream_vertex.nodes] == ["numbers", *CHAIN]  # one chain
    assert [node.name for node in d_vertex.nodes] == ["D", "out"]

    started = time.monotonic()
    result = env.execute("pre-barrier")
    assert result.status == "FINISHED" and result.restarts == 0, result.failures
    assert time.monotonic() - started < 40

    # -- the oracle's inputs: coordinator history, call logs, committed output --------------
    completed = sorted(c.checkpoint_id for c in result.checkpoints if c.status == "COMPLETED")
    final = max(c.checkpoint_id for c in result.checkpoints)
    assert final in completed, result.checkpoints
    calls = read_calls(logs)
    assert len({(e["pid"], e["seq"]) for e in calls}) == len(calls)  # one counter per process
    out = result.table(sink).to_pylist()
    seen = [r for r in out if r["kind"] == "seen"]  # markers, as D saw them
    data = [r for r in out if r["kind"] == "data"]  # data rows, counted by D

    # A, B, C of one upstream subtask run in one process (chained), D elsewhere.
    pids = collections.defaultdict(set)
    for e in calls:
        pids[(e["op"] in CHAIN, e["sub"])].add(e["pid"])
    assert all(len(p) == 1 for p in pids.values()), pids
    by_call = collections.defaultdict(list)  # (op, checkpoint, subtask, event) -> calls
    for e in calls:
        by_call[(e["op"], e["chk"], e["sub"], e["event"])].append(e)

    # (1) For every checkpoint every upstream subtask took -- each completed one,
    # the final one included -- pre-barrier ran once per operator, A then B then C,
    # and all of it before the first snapshot (the barrier is forwarded in between).
    for n in completed:
        for u in range(PARALLELISM):
            pre = [by_call[(op, n, u, "pre")] for op in CHAIN]
            snap = [by_call[(op, n, u, "snap")] for op in CHAIN]
            assert all(len(c) == 1 for c in pre + snap), (n, u, pre, snap)
            pre_seq = [c[0]["seq"] for c in pre]
            snap_seq = [c[0]["seq"] for c in snap]
            assert pre_seq == sorted(pre_seq), f"checkpoint {n}, subtask {u}: not head to tail"
            assert max(pre_seq) < min(snap_seq), f"checkpoint {n}, subtask {u}: snapshot first"
            for d in range(PARALLELISM):  # D took it too: pre-barrier, then its snapshot
                d_pre, d_snap = by_call[("D", n, d, "pre")], by_call[("D", n, d, "snap")]
                assert len(d_pre) == 1 and len(d_snap) == 1, (n, d)
                assert d_pre[0]["seq"] < d_snap[0]["seq"] and d_snap[0]["pending"] == 0
    # After end of input (the final checkpoint), pre-barrier still runs but emits nothing.
    assert not any(by_call[(op, final, u, "pre")][0]["emitted"]
                   for op in CHAIN for u in range(PARALLELISM))

    # (2) Where each record landed at D. D reports at its pre-barrier(k) what it
    # processed since its previous report, so a record that precedes barrier n
    # upstream (and follows barrier m < n) must be reported at the first
    # checkpoint k >= n that D took before its end of input (-1: none).
    d_checkpoints = {d: sorted(e["chk"] for e in calls
                               if e["op"] == "D" and e["sub"] == d and e["event"] == "pre"
                               and e["emitted"]) for d in range(PARALLELISM)}

    def reported_at(d: int, precedes: int) -> int:
        return next((k for k in d_checkpoints[d] if k >= precedes), -1)

    # Markers: what was emitted (from the call logs, not from D) against what D saw.
    emitted = {(e["op"], e["chk"], e["sub"]): e["seq"] for e in calls
               if e["event"] == "pre" and e["op"] in CHAIN and e["emitted"]}
    expected = sorted((d, op, n, u, seq) for (op, n, u), seq in emitted.items()
                      for d in range(PARALLELISM))
    got = sorted((r["d_sub"], r["op"], r["chk"], r["sub"], r["seq"]) for r in seen)
    assert got == expected  # every marker reached the D subtask it was routed to, once
    for r in seen:
        assert r["d_sub"] == d_subtask_of(r["key"])  # routed by its key group
    tested = [n for n in completed
              if all((op, n, u) in emitted for op in CHAIN for u in range(PARALLELISM))]
    assert len(tested) >= 3, (completed, sorted(emitted))
    completed_set = set(completed)
    for r in seen:
        where = (f"marker of {r['op']}/{r['sub']} emitted before barrier {r['chk']} "
                 f"reached D/{r['d_sub']} at its checkpoint {r['at']}")
        if r["chk"] in completed_set:
            # Part of checkpoint n at D: not later (it would have landed behind the
            # barrier), not earlier (a marker of n+1 seen at D's snapshot of n).
            assert r["at"] == r["chk"], where
        assert r["at"] == reported_at(r["d_sub"], r["chk"]), where

    # Data rows: A tags each with the last checkpoint m it passed; such a row
    # follows barrier m and precedes the next one, so D must not process it
    # before its snapshot of m (that would be a row past an unaligned barrier).
    after_counts: dict[tuple[int, int], int] = {}
    for u in range(PARALLELISM):
        (fin,) = by_call[("A", -1, u, "finish")]
        after_counts.update({(u, int(m)): c for m, c in fin["data_after"].items()})
    assert sum(after_counts.values()) == N
    landed: collections.Counter[tuple[int, int]] = collections.Counter()
    for r in data:
        where = (f"{r['rows']} rows of subtask {r['sub']} emitted after barrier {r['chk']} "
                 f"reached D/{r['d_sub']} at its checkpoint {r['at']}")
        assert r["at"] == -1 or r["at"] > r["chk"], where
        assert r["at"] == reported_at(r["d_sub"], r["chk"] + 1), where
        landed[(r["sub"], r["chk"])] += r["rows"]
    assert dict(landed) == after_counts  # every row, once, counted in the right interval
    assert len({m for _, m in after_counts} & completed_set) >= 3  # rows between barriers

    # Channel order at D: per (D subtask, upstream subtask, checkpoint), A's marker
    # arrived before B's before C's -- the order they were emitted in.
    arrivals = collections.defaultdict(list)
    for r in seen:
        arrivals[(r["d_sub"], r["sub"], r["chk"])].append((r["arrival"], r["op"], r["seq"]))
    for key, markers in arrivals.items():
        markers.sort()
        assert [op for _, op, _ in markers] == list(CHAIN), (key, markers)
        assert [s for _, _, s in markers] == sorted(s for _, _, s in markers), (key, markers)
