"""``prepare_snapshot_pre_barrier``: head to tail, before the barrier; what it emits precedes it.

DESIGN.md, "Checkpoints", subtask side (Flink ``SubtaskCheckpointCoordinatorImpl``,
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
marker seen since its previous checkpoint, tagged ``at=n``.

Independent oracle: every operator also appends each call to a per-process
log file, so the test knows which markers were emitted without asking D; the
completed checkpoints come from the coordinator's history; the routing of a
marker comes from ``rs.key_group_of``.

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

import raystream as rs

N = 6_000
BATCH = 50
KEYS = 16
PARALLELISM = 2
MAX_PARALLELISM = 128
CHAIN = ("A", "B", "C")
SLEEP_PER_BATCH_S = 0.03  # 60 batches per source subtask: ~2 s, ~10 checkpoints at 0.2 s

# One counter per worker process: the operators of one subtask (one actor, one
# process) share it, so it orders their calls. The test checks (pid, seq) is unique.
_SEQ = itertools.count()

ROWS = pa.schema([("kind", pa.string()), ("op", pa.string()), ("chk", pa.int64()),
                  ("sub", pa.int64()), ("seq", pa.int64()), ("pid", pa.int64()),
                  ("key", pa.int64()), ("i", pa.int64())])

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
            "key": i % KEYS, "i": i}


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

    def __init__(self, name: str, log_dir: str, keys: list[int], sleep_s: float = 0.0) -> None:
        super().__init__(name)
        self.log = CallLog(log_dir)
        self.keys = keys
        self.sleep_s = sleep_s

    def open(self) -> None:
        self.finished = False

    def process_batch(self, batch, input_index=0):
        if self.finished:
            raise AssertionError(f"{self.name}: a batch after finish()")
        if self.sleep_s:
            time.sleep(self.sleep_s)  # slow data: several checkpoints during the run
        self.output.emit(batch)

    def finish(self) -> None:
        self.finished = True
        self.log.write(event="finish", op=self.name, chk=-1, sub=self.ctx.subtask_index,
                       seq=next(_SEQ))

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        seq = next(_SEQ)
        emit = not self.finished  # after end of input nothing may be emitted (FLIP-147)
        sub = self.ctx.subtask_index
        self.log.write(event="pre", op=self.name, chk=checkpoint_id, sub=sub, seq=seq,
                       emitted=emit)
        if emit:
            k = len(self.keys)
            self.output.emit(pa.record_batch({
                "kind": ["marker"] * k, "op": [self.name] * k, "chk": [checkpoint_id] * k,
                "sub": [sub] * k, "seq": [seq] * k, "pid": [os.getpid()] * k,
                "key": self.keys, "i": [-1] * k}, schema=ROWS))

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
        self.pending: list[dict] = []
        self.arrival = 0
        self.rows = 0
        self.last_pre: int | None = None
        self.finished = False

    def process_batch(self, batch, input_index=0):
        for row in batch.to_pylist():
            if row["kind"] == "marker":
                self.pending.append(dict(row, arrival=self.arrival))
                self.arrival += 1
            else:
                self.rows += 1

    def _report(self, at: int) -> None:
        if not self.pending:
            return
        d = self.ctx.subtask_index
        self.output.emit(pa.RecordBatch.from_pylist([
            {"kind": "seen", "d_sub": d, "at": at, "op": m["op"], "chk": m["chk"],
             "sub": m["sub"], "seq": m["seq"], "pid": m["pid"], "key": m["key"],
             "arrival": m["arrival"], "rows": 0} for m in self.pending], schema=OBSERVATIONS))
        self.pending = []

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self.log.write(event="pre", op=self.name, chk=checkpoint_id, sub=self.ctx.subtask_index,
                       seq=next(_SEQ), emitted=not self.finished)
        self.last_pre = checkpoint_id
        if not self.finished:
            self._report(at=checkpoint_id)

    def snapshot_state(self, checkpoint_id: int):
        self.log.write(event="snap", op=self.name, chk=checkpoint_id, sub=self.ctx.subtask_index,
                       seq=next(_SEQ), pending=len(self.pending))
        return None

    def finish(self) -> None:
        self._report(at=-1)  # seen after D's last checkpoint before end of input
        self.output.emit(pa.RecordBatch.from_pylist([
            {"kind": "rows", "d_sub": self.ctx.subtask_index, "at": -1, "op": "", "chk": -1,
             "sub": -1, "seq": -1, "pid": os.getpid(), "key": -1, "arrival": -1,
             "rows": self.rows}], schema=OBSERVATIONS))
        self.finished = True
        self.log.write(event="finish", op=self.name, chk=-1, sub=self.ctx.subtask_index,
                       seq=next(_SEQ))


def read_calls(log_dir: str) -> list[dict]:
    events = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            events.extend(json.loads(line) for line in f)
    return events


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
    stream = env.from_sequence(N, data_columns, batch_size=BATCH, num_splits=4, name="numbers")
    stream = stream.transform("A", lambda n: Marking(n, logs, keys, SLEEP_PER_BATCH_S))
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
    seen = [r for r in out if r["kind"] == "seen"]
    totals = [r for r in out if r["kind"] == "rows"]
    assert sorted(r["d_sub"] for r in totals) == list(range(PARALLELISM))
    assert sum(r["rows"] for r in totals) == N  # the data flowed alongside the markers

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

    # (2) What was emitted (from the call logs, not from D) against what D saw.
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
        where = (f"marker of {r['op']}/{r['sub']} for checkpoint {r['chk']} "
                 f"seen by D/{r['d_sub']} at its checkpoint {r['at']}")
        if r["chk"] in completed_set:
            # Before D's barrier n: part of checkpoint n at D. Not after (then it
            # would have landed behind the barrier), not before (a marker of n+1
            # seen at D's snapshot of n means D went past barrier n unaligned).
            assert r["at"] == r["chk"], where
        else:  # a checkpoint that did not complete: never before its own barrier
            assert r["at"] == -1 or r["at"] >= r["chk"], where

    # Channel order at D: per (D subtask, upstream subtask, checkpoint), A's marker
    # arrived before B's before C's -- the order they were emitted in.
    arrivals = collections.defaultdict(list)
    for r in seen:
        arrivals[(r["d_sub"], r["sub"], r["chk"])].append((r["arrival"], r["op"], r["seq"]))
    for key, markers in arrivals.items():
        markers.sort()
        assert [op for _, op, _ in markers] == list(CHAIN), (key, markers)
        assert [s for _, _, s in markers] == sorted(s for _, _, s in markers), (key, markers)
